package cache

import (
	"math"

	"github.com/hashicorp/golang-lru/v2/simplelru"

	"github.com/shardload/shardload/source"
)

// memEntry is one object in a memory tier. Its fields are guarded by Cache.mu.
type memEntry struct {
	tier    *memTier
	url     string
	version string
	data    []byte
	refs    int    // open readers
	gone    bool   // removed from the tier; its bytes count until the last reader closes
	hint    uint64 // the key hints name it by (hintKey)
	// checkedAt is when a Stat last found the object at this version (wall-clock
	// nanoseconds; 0: not known): see validate.go.
	checkedAt int64
}

func (e *memEntry) matches(info source.Info) bool {
	return e.version == info.Version && int64(len(e.data)) == info.Size
}

// memTier is the memory tier of one node: an LRU of whole objects with a byte budget.
// Everything is guarded by Cache.mu; nothing here does I/O.
type memTier struct {
	node   int
	budget int64
	used   int64 // bytes of entries, reservations, and removed entries still read
	lru    *simplelru.LRU[string, *memEntry]
}

func newMemTier(node int, budget int64) *memTier {
	// The LRU's own entry limit is never the one that binds: the byte budget is.
	lru, err := simplelru.NewLRU[string, *memEntry](math.MaxInt32, nil)
	if err != nil {
		panic(err) // only for a size <= 0
	}
	return &memTier{node: node, budget: budget, lru: lru}
}

// reserve makes room for n bytes, evicting entries that no one is reading in the
// order of the policy r (nil: PolicyLRU, least recently used first), and counts
// them as used. It evicts nothing and says why when that cannot make enough room,
// or (PolicyOrder) when an entry it would evict is needed before the object.
func (m *memTier) reserve(n int64, cn *counters, r *ranker) evictResult {
	if n > m.budget {
		return noRoom
	}
	need := m.used + n - m.budget
	if need > 0 {
		var cands []victim[*memEntry]
		for i, k := range m.lru.Keys() { // oldest first
			e, _ := m.lru.Peek(k)
			if e.refs > 0 {
				continue
			}
			cands = append(cands, victim[*memEntry]{e: e, rank: r.rankOf(e.hint, i), bytes: int64(len(e.data))})
		}
		var res evictResult
		if r == nil {
			// Least recently used first, as many as the room takes.
			var free int64
			for i, v := range cands {
				if free += v.bytes; free >= need {
					cands, res = cands[:i+1], roomMade
					break
				}
			}
			if res != roomMade {
				res = noRoom
			}
		} else {
			cands, res = plan(r, cands, need)
		}
		if res != roomMade {
			return res
		}
		for _, v := range cands {
			m.remove(v.e.url)
			cn.evicted.Add(1)
		}
	}
	m.used += n
	return roomMade
}

// insert adds buf, whose bytes were reserved, as url's entry, replacing any other.
func (m *memTier) insert(url, version string, buf []byte) *memEntry {
	m.remove(url)
	e := &memEntry{tier: m, url: url, version: version, data: buf, hint: hintKey(url)}
	m.lru.Add(url, e)
	return e
}

// remove takes url's entry out of the tier. Its bytes stay counted until its last
// reader closes.
func (m *memTier) remove(url string) {
	e, ok := m.lru.Peek(url)
	if !ok {
		return
	}
	m.lru.Remove(url)
	e.gone = true
	if e.refs == 0 {
		m.used -= int64(len(e.data))
	}
}

// unref drops a reader's reference.
func (e *memEntry) unref() {
	e.refs--
	if e.refs == 0 && e.gone {
		e.tier.used -= int64(len(e.data))
	}
}
