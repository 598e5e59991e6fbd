package cache

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shardload/shardload/source"
)

// simRead is one read of a sequence: an object and its size.
type simRead struct {
	url  string
	size int64
}

// simulate is the reference of the policies: a cache of budget bytes read through
// by reads in turn, each object taking cost(read) bytes of the budget. It returns
// the bytes read from the source and, after each read, the objects held (sorted).
//
// Under Belady's rule (lru false) the next use of an object at read i is its first
// read after i among the reads announced at i, reads[i+1:horizon(i)]; an object not
// read again among them has no next use. On a miss that needs room, the objects
// held and the one read are put in the order of eviction: those with no next use
// first, least recently used first (the one read is the most recent), then the one
// used furthest away first. Objects are taken from the front until the others fit:
// if the one read is among them, it is read without being cached and nothing is
// evicted; otherwise they are evicted and it is cached. Under LRU the least
// recently used are evicted until the one read fits.
func simulate(reads []simRead, cost func(simRead) int64, budget int64, horizon func(int) int, lru bool) (fetched int64, held [][]string) {
	type entry struct {
		cost int64
		last int // the read that last used it
	}
	cache := map[string]*entry{}
	var used int64
	snapshot := func() []string {
		var s []string
		for u := range cache {
			s = append(s, u)
		}
		slices.Sort(s)
		return s
	}
	for i, r := range reads {
		if e, ok := cache[r.url]; ok {
			e.last = i
			held = append(held, snapshot())
			continue
		}
		fetched += r.size
		c := cost(r)
		if c > budget {
			held = append(held, snapshot())
			continue
		}
		if lru {
			for used+c > budget {
				oldest := ""
				for u, e := range cache {
					if oldest == "" || e.last < cache[oldest].last {
						oldest = u
					}
				}
				used -= cache[oldest].cost
				delete(cache, oldest)
			}
			cache[r.url] = &entry{cost: c, last: i}
			used += c
			held = append(held, snapshot())
			continue
		}
		next := func(u string) (int, bool) {
			for j := i + 1; j < horizon(i); j++ {
				if reads[j].url == u {
					return j, true
				}
			}
			return 0, false
		}
		// goesBefore reports whether object a (last used at la) is evicted before b.
		goesBefore := func(a string, la int, b string, lb int) bool {
			na, oka := next(a)
			nb, okb := next(b)
			if oka != okb {
				return !oka
			}
			if oka && na != nb {
				return na > nb
			}
			return la < lb
		}
		order := []string{r.url}
		last := map[string]int{r.url: i}
		for u, e := range cache {
			order = append(order, u)
			last[u] = e.last
		}
		slices.SortFunc(order, func(a, b string) int {
			if goesBefore(a, last[a], b, last[b]) {
				return -1
			}
			return 1
		})
		total := used + c
		var out []string
		admit := true
		for _, u := range order {
			if total <= budget {
				break
			}
			if u == r.url {
				admit = false
				break
			}
			out = append(out, u)
			total -= cache[u].cost
		}
		if admit {
			for _, u := range out {
				used -= cache[u].cost
				delete(cache, u)
			}
			cache[r.url] = &entry{cost: c, last: i}
			used += c
		}
		held = append(held, snapshot())
	}
	return fetched, held
}

// TestSimulator checks the reference on sequences whose answer is known.
func TestSimulator(t *testing.T) {
	unit := func(simRead) int64 { return 1 }
	seq := func(s string) []simRead {
		var out []simRead
		for _, c := range s {
			out = append(out, simRead{url: string(c), size: 1})
		}
		return out
	}
	all := func(n int) func(int) int { return func(int) int { return n } }
	for _, tc := range []struct {
		reads   string
		budget  int64
		lru     bool
		fetched int64
	}{
		// Belady keeps a and b; c, needed after them or never, is not admitted.
		{"abcabcab", 2, false, 4},
		// LRU evicts what comes back next, every time.
		{"abcabcab", 2, true, 8},
		// The textbook sequence of 3 frames: 7 misses under Belady, 10 under LRU.
		{"abcdabeabcde", 3, false, 7},
		{"abcdabeabcde", 3, true, 10},
	} {
		r := seq(tc.reads)
		if got, _ := simulate(r, unit, tc.budget, all(len(r)), tc.lru); got != tc.fetched {
			t.Errorf("%s, budget %d, lru %v: fetched %d, want %d", tc.reads, tc.budget, tc.lru, got, tc.fetched)
		}
	}
}

// countingSource counts the bytes read from the source.
type countingSource struct {
	*fakeSource
	bytes atomic.Int64
}

func (s *countingSource) Open(ctx context.Context, url string) (io.ReadCloser, error) {
	r, err := s.fakeSource.Open(ctx, url)
	if err != nil {
		return nil, err
	}
	return &countingReader{ReadCloser: r, n: &s.bytes}, nil
}

var _ source.Source = (*countingSource)(nil)

// countingReader counts the bytes read from a stream.
type countingReader struct {
	io.ReadCloser
	n *atomic.Int64
}

func (r *countingReader) Read(p []byte) (int, error) {
	k, err := r.ReadCloser.Read(p)
	r.n.Add(int64(k))
	return k, err
}

// fixedFetchTimes gives c's entries fetch times whose meta files all have the same
// size for the same object: a second apart, nanoseconds with no trailing zero.
func fixedFetchTimes(c *Cache) {
	var n atomic.Int64
	c.fetchTime = func() time.Time { return fetchBase.Add(time.Duration(n.Add(1)) * time.Second) }
}

var fetchBase = time.Date(2026, 1, 2, 3, 4, 5, 123456789, time.UTC)

// entryCost is what an object of size bytes takes of a disk budget: data and meta.
func entryCost(url, version string, size int64) int64 {
	return size + int64(len(placeholderMeta(key(url), version, size, fetchBase)))
}

// held returns the objects of urls the disk tier holds, sorted.
func held(c *Cache, urls []string) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for _, u := range urls {
		if e, ok := c.disk.lru.Peek(hashURL(key(u))); ok && !e.gone {
			out = append(out, u)
		}
	}
	slices.Sort(out)
	return out
}

// run is a sequence read through a real cache with the hints a reader publishes.
type run struct {
	reads  []simRead
	starts []int // the reads at which the reader publishes the next ones, up to the next start
	step   time.Duration
	base   time.Time
}

// at is when read i is expected, and made.
func (r *run) at(i int) int64 { return r.base.Add(time.Duration(i) * r.step).UnixNano() }

// horizon is the end of the reads announced at read i.
func (r *run) horizon(i int) int {
	end := len(r.reads)
	for _, s := range r.starts {
		if s > i {
			end = s
			break
		}
	}
	return end
}

// drive reads r.reads through c (its hints published through h; nil: none) on a
// clock at each read's time, checks every byte, and calls after with each read's
// index. It returns the bytes read from the source by each read.
func (r *run) drive(t *testing.T, c *Cache, h *Hints, up *countingSource, data map[string][]byte, after func(i int)) []int64 {
	t.Helper()
	clk := testClock(c)
	fetched := make([]int64, len(r.reads))
	for i, rd := range r.reads {
		clk.set(time.Unix(0, r.at(i)))
		if h != nil && slices.Contains(r.starts, i) {
			var next []HintEntry
			for j := i; j < r.horizon(i); j++ {
				next = append(next, HintEntry{URL: r.reads[j].url, At: r.at(j)})
			}
			if err := h.Publish(next); err != nil && !errors.Is(err, ErrUnwritable) {
				t.Fatal(err)
			}
		}
		before := up.bytes.Load()
		if got := readAll(t, c, rd.url); !bytes.Equal(got, data[rd.url]) {
			t.Fatalf("read %d of %s: the bytes differ from the source's", i, rd.url)
		}
		fetched[i] = up.bytes.Load() - before
		if after != nil {
			after(i)
		}
	}
	return fetched
}

func (c *clock) set(t time.Time) {
	c.mu.Lock()
	c.t = t
	c.mu.Unlock()
}

// newObjects puts n objects of the given sizes in a counting source.
func newObjects(n int, size func(i int) int) (*countingSource, []string, map[string][]byte) {
	up := &countingSource{fakeSource: newFake()}
	data := map[string][]byte{}
	var urls []string
	for i := range n {
		u := fmt.Sprintf("s3://b/train-%06d.tar", i)
		data[u] = randBytes(uint64(1000+i), size(i))
		up.put(u, data[u], "v1")
		urls = append(urls, u)
	}
	return up, urls, data
}

// TestDiskTierFollowsTheSimulator reads random sequences of objects of random sizes
// through the disk tier, with a reader publishing its next reads in chunks of
// random length, and checks after every read that the tier holds exactly what the
// reference holds, so that the bytes fetched are the reference's too: under
// PolicyOrder against Belady's rule (with the same admissions), under PolicyLRU
// against LRU. Meta files are given fetch times of one length, so that an entry's
// cost in the budget is known before it is written.
func TestDiskTierFollowsTheSimulator(t *testing.T) {
	for _, policy := range []Policy{PolicyOrder, PolicyLRU} {
		for seed := range uint64(3) {
			t.Run(fmt.Sprintf("%v/seed%d", policy, seed), func(t *testing.T) {
				rng := rand.New(rand.NewPCG(seed, 7))
				up, urls, data := newObjects(24, func(int) int { return 8<<10 + rng.IntN(300<<10) })
				r := &run{step: time.Second, base: time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)}
				for range 240 {
					// Skewed: low indices are read more often.
					i := int(float64(len(urls)) * rng.Float64() * rng.Float64())
					r.reads = append(r.reads, simRead{url: urls[i], size: int64(len(data[urls[i]]))})
				}
				for s := 0; s < len(r.reads); s += 10 + rng.IntN(50) {
					r.starts = append(r.starts, s)
				}
				cost := func(rd simRead) int64 { return entryCost(rd.url, "v1", rd.size) }
				const budget = 1200 << 10
				want, wantHeld := simulate(r.reads, cost, budget, r.horizon, policy == PolicyLRU)

				c := newCache(t, Options{Dir: t.TempDir(), DiskBytes: budget, Policy: policy}, up)
				fixedFetchTimes(c)
				h, err := c.Hint("trainer", HintOptions{Slack: time.Nanosecond})
				if err != nil {
					t.Fatal(err)
				}
				r.drive(t, c, h, up, data, func(i int) {
					if got := held(c, urls); !slices.Equal(got, wantHeld[i]) {
						t.Fatalf("after read %d (%s): the tier holds %v, the reference %v", i, r.reads[i].url, got, wantHeld[i])
					}
				})
				if got := up.bytes.Load(); got != want {
					t.Errorf("fetched %d bytes, the reference %d", got, want)
				}
				st := c.Stats()
				if used, _ := dirBytes(t, c.opts.Dir); used > budget {
					t.Errorf("the directory holds %d bytes, over the budget of %d", used, budget)
				}
				if st.BytesFetched+st.BytesBypassed != up.bytes.Load() {
					t.Errorf("Stats: %d bytes fetched and %d bypassed, the source served %d", st.BytesFetched, st.BytesBypassed, up.bytes.Load())
				}
				if policy == PolicyLRU && st.Declined != 0 {
					t.Errorf("LRU declined %d admissions", st.Declined)
				}
				t.Logf("%v: fetched %d bytes (%d declined, %d evicted); reads %d bytes", policy, want, st.Declined, st.Evicted, totalSize(r.reads))
			})
		}
	}
}

func totalSize(reads []simRead) int64 {
	var n int64
	for _, r := range reads {
		n += r.size
	}
	return n
}

// epochs returns the reads of a reader of urls over n epochs, each a fresh
// permutation of seed, and the reads at which each epoch starts.
func epochs(urls []string, size int64, n int, seed uint64) (reads []simRead, starts []int) {
	for e := range n {
		starts = append(starts, len(reads))
		perm := rand.New(rand.NewPCG(seed, uint64(e))).Perm(len(urls))
		for _, i := range perm {
			reads = append(reads, simRead{url: urls[i], size: size})
		}
	}
	return reads, starts
}

// TestReshuffledEpochsOnHalfTheDataset is the case the policy is for: 32 shards of
// equal size, a disk tier holding half of them, 4 epochs each a fresh permutation,
// the reader publishing each epoch's order as it starts. Under LRU the cache holds
// the shards read last, in no relation to the next order, and most of the dataset
// is fetched again every epoch; by next use, the shards held are all read before
// any is evicted, and each epoch after the first fetches half of the dataset. The
// fetched bytes of both policies are the reference's.
func TestReshuffledEpochsOnHalfTheDataset(t *testing.T) {
	const shards, size, nEpochs = 32, 64 << 10, 4
	up, urls, data := newObjects(shards, func(int) int { return size })
	reads, starts := epochs(urls, size, nEpochs, 42)
	r := &run{reads: reads, starts: starts, step: time.Second, base: time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)}
	budget := int64(shards/2)*entryCost(urls[0], "v1", size) + size/2
	dataset := float64(shards * size)
	frac := map[Policy][]float64{}
	for _, policy := range []Policy{PolicyOrder, PolicyLRU} {
		up.bytes.Store(0)
		c := newCache(t, Options{Dir: t.TempDir(), DiskBytes: budget, Policy: policy}, up)
		fixedFetchTimes(c)
		h, err := c.Hint("trainer", HintOptions{Slack: time.Nanosecond})
		if err != nil {
			t.Fatal(err)
		}
		fetched := r.drive(t, c, h, up, data, nil)
		for e := range nEpochs {
			var n int64
			for _, f := range fetched[e*shards : (e+1)*shards] {
				n += f
			}
			frac[policy] = append(frac[policy], float64(n)/dataset)
		}
		want, _ := simulate(reads, func(rd simRead) int64 { return entryCost(rd.url, "v1", rd.size) }, budget, r.horizon, policy == PolicyLRU)
		if got := up.bytes.Load(); got != want {
			t.Errorf("%v: fetched %d bytes, the reference %d", policy, got, want)
		}
		st := c.Stats()
		t.Logf("%v: fetched per epoch %.3f (declined %d, evicted %d)", policy, frac[policy], st.Declined, st.Evicted)
		c.Close()
	}
	for e := 1; e < nEpochs; e++ {
		if f := frac[PolicyOrder][e]; f > 0.6 {
			t.Errorf("epoch %d: by next use the cache fetched %.3f of the dataset, want at most 0.6", e, f)
		}
		if frac[PolicyOrder][e] >= frac[PolicyLRU][e] {
			t.Errorf("epoch %d: by next use %.3f fetched, by LRU %.3f: no better", e, frac[PolicyOrder][e], frac[PolicyLRU][e])
		}
	}
}
