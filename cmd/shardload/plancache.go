package main

// The node cache's model: each planned node's reads over the epochs, from the ranks'
// own plans, through a simulated disk tier under each policy.

import (
	"cmp"
	"container/heap"
	"context"
	"sort"

	"github.com/shardload/shardload"
	"github.com/shardload/shardload/cache"
	"github.com/shardload/shardload/plan"
	"github.com/shardload/shardload/shard"
)

// cacheFigures are a cache policy's figures: per epoch, the share of the bytes a
// node's ranks read that the cache serves, and the bytes the node reads from the
// store.
type cacheFigures struct {
	HitRate           []float64 `json:"cache_hit_rate"`
	HitRateMean       float64   `json:"cache_hit_rate_mean"`
	StoreBytesPerNode []int64   `json:"store_bytes_per_node"`
}

// entryMetaBytes is about what a disk entry's meta file takes of the budget beside
// its data (the cache counts both).
const entryMetaBytes = 512

// nodeRead is one read of a shard by a rank in an epoch: part is the share of the
// shard's samples the rank's spans read (1: the whole shard); node, that the node's
// ranks read all of the shard's samples that epoch.
type nodeRead struct {
	shard int
	part  float64
	node  bool
	rank  int // the rank of the node that reads it (0, 1, ...)
}

// nodeEpochReads returns the reads a node's ranks make of the cache in one epoch, in
// the order the cache sees them: each rank's distinct shards in the order of its plan's
// spans, spaced evenly over the epoch (as a rank announces them, serve.EpochHints),
// the ranks' merged by that time.
func nodeEpochReads(plans []plan.Plan, infos []shard.Info) []nodeRead {
	nodeTook := map[int]int{}
	for _, p := range plans {
		for _, sp := range p.Spans {
			nodeTook[sp.Shard] += sp.Take
		}
	}
	type read struct {
		at   float64
		rank int
		nodeRead
	}
	var all []read
	for r, p := range plans {
		took := map[int]int{}
		var shards []int
		for _, sp := range p.Spans {
			if _, ok := took[sp.Shard]; !ok {
				shards = append(shards, sp.Shard)
			}
			took[sp.Shard] += sp.Take
		}
		for i, s := range shards {
			rd := nodeRead{shard: s, part: 1, node: true, rank: r}
			if n := infos[s].Samples; n > 0 && took[s] < n {
				rd.part, rd.node = float64(took[s])/float64(n), nodeTook[s] >= n
			}
			all = append(all, read{float64(i) / float64(len(shards)), r, rd})
		}
	}
	sort.SliceStable(all, func(a, b int) bool {
		if all[a].at != all[b].at {
			return all[a].at < all[b].at
		}
		return all[a].rank < all[b].rank
	})
	out := make([]nodeRead, len(all))
	for i, r := range all {
		out[i] = r.nodeRead
	}
	return out
}

// simulateNodeCache runs a node's reads, epoch by epoch, through a disk tier of
// budget bytes under policy. A miss the cache takes in fetches the shard whole (its
// Size: the cache fetches a shard of at most cache.RangeFillMax whole for a read of
// part of it, a larger one behind the read, for the node's other reads, into free
// room only); a miss it does not take in (no room, a shard larger than the budget, or, under
// cache.PolicyOrder, read through) and a miss of part of a larger shard the node
// reads only part of are read around it: only the part read (its share of the
// Size). Under cache.PolicyOrder the
// next use of a shard is its next read in the same epoch (the readers announce each
// epoch as it opens): on a miss that needs room, the shards held and the one read go
// in the order of eviction (those not read again this epoch first, least recently
// used first, then the one read furthest ahead), and are taken from the front until
// the rest fits; when the one read is taken it is read through and nothing is
// evicted (cache/policy_test.go's reference, Belady's rule with the cache's
// admission). Under cache.PolicyLRU the least recently used go until it fits. The
// shards a rank is reading (its last open reads) are not evicted. It
// returns per epoch the bytes read (each read a whole shard) and those fetched.
func simulateNodeCache(epochs [][]nodeRead, infos []shard.Info, budget int64, policy cache.Policy, open int) (read, fetched []int64) {
	type entry struct {
		cost int64
		last int // the read that used it last
		next int // its next read this epoch, -1: none
		gen  int
	}
	held := map[int]*entry{}
	var used int64
	// key orders the eviction: no next use first, by least recent use; then the
	// furthest next use first.
	type key struct {
		noNext bool
		a      int
	}
	less := func(x, y key) bool {
		if x.noNext != y.noNext {
			return x.noNext
		}
		return x.a < y.a
	}
	keyOf := func(e *entry) key {
		if policy == cache.PolicyLRU || e.next < 0 {
			return key{true, e.last}
		}
		return key{false, -e.next}
	}
	h := &evictHeap{less: func(a, b heapItem) bool { return less(a.k.(key), b.k.(key)) }}
	push := func(s int, e *entry) {
		e.gen++
		heap.Push(h, heapItem{shard: s, gen: e.gen, k: keyOf(e)})
	}
	// peek returns the shard evicted first (its entry current), without removing it.
	peek := func() (int, *entry, key) {
		for h.Len() > 0 {
			it := h.items[0]
			if e := held[it.shard]; e != nil && e.gen == it.gen {
				return it.shard, e, it.k.(key)
			}
			heap.Pop(h)
		}
		return -1, nil, key{}
	}
	i := 0 // reads so far, all epochs
	for _, reads := range epochs {
		var r, f int64
		// The shards each rank is reading: its last open reads. They are not evicted.
		reading := map[int][]int{}
		pinned := map[int]int{}
		// The next read of each read's shard this epoch.
		next := make([]int, len(reads))
		after := map[int]int{}
		for k := len(reads) - 1; k >= 0; k-- {
			next[k] = -1
			if n, ok := after[reads[k].shard]; ok {
				next[k] = i + n
			}
			after[reads[k].shard] = k
		}
		// A new epoch's announcement: every held shard's next use is its first
		// read of this epoch.
		for s, e := range held {
			e.next = -1
			if n, ok := after[s]; ok {
				e.next = i + n
			}
			push(s, e)
		}
		for k, rd := range reads {
			s, size := rd.shard, infos[rd.shard].Size
			if open > 0 {
				q := append(reading[rd.rank], s)
				pinned[s]++
				if len(q) > open {
					pinned[q[0]]--
					q = q[1:]
				}
				reading[rd.rank] = q
			}
			part := int64(rd.part * float64(size))
			r += part
			if e := held[s]; e != nil {
				e.last, e.next = i, next[k]
				push(s, e)
				i++
				continue
			}
			if !rd.node && size > cache.RangeFillMax {
				f += part
				i++
				continue
			}
			c := size + entryMetaBytes
			if c > budget || size > cache.RangeFillMax && rd.part < 1 && used+c > budget {
				// Larger than the budget; or part of a shard larger than a range
				// fill, whose fetch behind the read takes free room only.
				f += part
				i++
				continue
			}
			self := key{true, i}
			if policy == cache.PolicyOrder && next[k] >= 0 {
				self = key{false, -next[k]}
			}
			var out, skipped []int
			total := used + c
			admit := true
			for total > budget {
				victim, e, vk := peek()
				if victim >= 0 && pinned[victim] > 0 {
					heap.Pop(h)
					skipped = append(skipped, victim)
					continue
				}
				if victim < 0 || policy == cache.PolicyOrder && !less(vk, self) {
					admit = false // the one read goes first: read through
					break
				}
				heap.Pop(h)
				out = append(out, victim)
				total -= e.cost
			}
			for _, v := range skipped {
				push(v, held[v])
			}
			if admit || policy == cache.PolicyLRU {
				// (LRU evicts what it can even where that does not make the room.)
				for _, v := range out {
					used -= held[v].cost
					delete(held, v)
				}
			} else {
				for _, v := range out {
					push(v, held[v])
				}
			}
			// A shard the cache takes is fetched whole; one it does not, only
			// the part read.
			f += part
			if admit {
				f += size - part
				e := &entry{cost: c, last: i, next: next[k]}
				held[s] = e
				used += c
				push(s, e)
			}
			i++
		}
		read, fetched = append(read, r), append(fetched, f)
	}
	return read, fetched
}

// heapItem is a held shard in the eviction heap at one of its keys; gen tells a
// current item from one its entry has since replaced.
type heapItem struct {
	shard, gen int
	k          any
}

type evictHeap struct {
	items []heapItem
	less  func(a, b heapItem) bool
}

func (h *evictHeap) Len() int           { return len(h.items) }
func (h *evictHeap) Less(i, j int) bool { return h.less(h.items[i], h.items[j]) }
func (h *evictHeap) Swap(i, j int)      { h.items[i], h.items[j] = h.items[j], h.items[i] }
func (h *evictHeap) Push(x any)         { h.items = append(h.items, x.(heapItem)) }
func (h *evictHeap) Pop() any {
	it := h.items[len(h.items)-1]
	h.items = h.items[:len(h.items)-1]
	return it
}

// modelCache returns the figures of a node cache of budget bytes under each policy:
// the reads of the ranks locals of each of nodes over epochs, planned as the loader
// plans them (cfg, each epoch and rank), through simulateNodeCache; the figures are
// the nodes' mean. With some of a node's ranks planned, the budget is theirs in
// proportion.
func modelCache(ctx context.Context, cfg shardload.Config, infos []shard.Info, nodes, locals []int, perNode, epochs int, budget int64) (map[cache.Policy]cacheFigures, error) {
	budget = budget * int64(len(locals)) / int64(perNode)
	openShards := cmp.Or(cfg.OpenShards, shardload.DefaultOpenShards)
	out := map[cache.Policy]cacheFigures{}
	sum := map[cache.Policy][2][]int64{}
	for _, n := range nodes {
		var reads [][]nodeRead
		for e := range epochs {
			var plans []plan.Plan
			for _, r := range locals {
				c := cfg
				c.Rank, c.Epoch = n*perNode+r, e
				p, err := shardload.PlanOf(ctx, c)
				if err != nil {
					return nil, err
				}
				plans = append(plans, p)
			}
			reads = append(reads, nodeEpochReads(plans, infos))
		}
		for _, policy := range []cache.Policy{cache.PolicyLRU, cache.PolicyOrder} {
			r, f := simulateNodeCache(reads, infos, budget, policy, openShards)
			s := sum[policy]
			if s[0] == nil {
				s = [2][]int64{make([]int64, epochs), make([]int64, epochs)}
			}
			for e := range epochs {
				s[0][e] += r[e]
				s[1][e] += f[e]
			}
			sum[policy] = s
		}
	}
	for policy, s := range sum {
		var fig cacheFigures
		for e := range epochs {
			hit := 0.0
			if s[0][e] > 0 {
				hit = 1 - float64(s[1][e])/float64(s[0][e])
			}
			fig.HitRate = append(fig.HitRate, hit)
			fig.HitRateMean += hit / float64(epochs)
			// Scaled from the ranks planned to the node's.
			fig.StoreBytesPerNode = append(fig.StoreBytesPerNode, s[1][e]/int64(len(nodes))*int64(perNode)/int64(len(locals)))
		}
		out[policy] = fig
	}
	return out, nil
}
