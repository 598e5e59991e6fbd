package main

import (
	"math/rand/v2"
	"slices"
	"strconv"
	"testing"

	"github.com/shardload/shardload/cache"
	"github.com/shardload/shardload/shard"
)

// referenceCache is cache/policy_test.go's reference of the policies (simulate),
// written for epochs of reads: a disk tier of budget bytes read through by the
// reads in turn, the next use of a shard being its next read in the same epoch. It
// returns the bytes fetched per epoch.
func referenceCache(epochs [][]int, infos []shard.Info, budget int64, lru bool) []int64 {
	type entry struct {
		cost int64
		last int
	}
	held := map[int]*entry{}
	var used int64
	var out []int64
	i := 0
	for _, reads := range epochs {
		var fetched int64
		for k, s := range reads {
			if e, ok := held[s]; ok {
				e.last = i
				i++
				continue
			}
			fetched += infos[s].Size
			c := infos[s].Size + entryMetaBytes
			if c > budget {
				i++
				continue
			}
			if lru {
				for used+c > budget {
					oldest := -1
					for u, e := range held {
						if oldest < 0 || e.last < held[oldest].last {
							oldest = u
						}
					}
					used -= held[oldest].cost
					delete(held, oldest)
				}
				held[s] = &entry{c, i}
				used += c
				i++
				continue
			}
			next := func(u int) (int, bool) {
				for j := k + 1; j < len(reads); j++ {
					if reads[j] == u {
						return j, true
					}
				}
				return 0, false
			}
			last := map[int]int{s: i}
			order := []int{s}
			for u, e := range held {
				order = append(order, u)
				last[u] = e.last
			}
			// goesBefore reports whether a is evicted before b.
			goesBefore := func(a, b int) bool {
				na, oka := next(a)
				nb, okb := next(b)
				if oka != okb {
					return !oka
				}
				if oka && na != nb {
					return na > nb
				}
				return last[a] < last[b]
			}
			slices.SortFunc(order, func(a, b int) int {
				if goesBefore(a, b) {
					return -1
				}
				return 1
			})
			total := used + c
			var evict []int
			admit := true
			for _, u := range order {
				if total <= budget {
					break
				}
				if u == s {
					admit = false
					break
				}
				evict = append(evict, u)
				total -= held[u].cost
			}
			if admit {
				for _, u := range evict {
					used -= held[u].cost
					delete(held, u)
				}
				held[s] = &entry{c, i}
				used += c
			}
			i++
		}
		out = append(out, fetched)
	}
	return out
}

// The model's disk tier fetches what the reference fetches, epoch by epoch, under
// both policies, on random epochs of shards of random sizes read by a few ranks.
func TestSimulateNodeCacheFollowsTheReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for trial := range 200 {
		n := 1 + rng.IntN(30)
		infos := make([]shard.Info, n)
		var total int64
		for i := range infos {
			infos[i].Size = int64(1 + rng.IntN(5000))
			total += infos[i].Size
		}
		var epochs [][]int
		for range 1 + rng.IntN(4) {
			var reads []int
			for range rng.IntN(3 * n) {
				reads = append(reads, rng.IntN(n))
			}
			epochs = append(epochs, reads)
		}
		budget := int64(rng.IntN(int(total) + 1))
		for _, policy := range []cache.Policy{cache.PolicyOrder, cache.PolicyLRU} {
			_, got := simulateNodeCache(epochs, infos, budget, policy)
			want := referenceCache(epochs, infos, budget, policy == cache.PolicyLRU)
			if !slices.Equal(got, want) {
				t.Fatalf("trial %d, %v, budget %d of %d: fetched %v, the reference %v", trial, policy, budget, total, got, want)
			}
		}
	}
}

// On the case (one node, a cache of half the dataset, reshuffled epochs)
// the model fetches what Belady's rule allows by next use, and most of the dataset
// again by LRU.
func TestModelCacheHalfTheDataset(t *testing.T) {
	rep := planJSON(t, "--shards", "64", "--samples-per-shard", "100", "--sample-bytes", "10000", "--nodes", "1", "--ranks-per-node", "1",
		"--epochs", "4", "--cache-bytes", strconv.Itoa(32*(100*10240+1024+entryMetaBytes)), "--batch-size", "16")
	order, lru := rep.CachePolicies["order"], rep.CachePolicies["lru"]
	for e := 1; e < 4; e++ {
		o := float64(order.StoreBytesPerNode[e]) / float64(rep.DatasetBytes)
		l := float64(lru.StoreBytesPerNode[e]) / float64(rep.DatasetBytes)
		t.Logf("epoch %d: order fetches %.3f of the dataset, lru %.3f", e, o, l)
		if o > 0.55 || l < 0.7 {
			t.Errorf("epoch %d: order fetches %.3f of the dataset (want about 0.5), lru %.3f (want most of it)", e, o, l)
		}
	}
}
