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
	refs    int  // open readers
	gone    bool // removed from the tier; its bytes count until the last reader closes
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

// reserve makes room for n bytes, evicting least recently used entries that no one
// is reading, and counts them as used. It evicts nothing and returns false when that
// cannot make enough room.
func (m *memTier) reserve(n int64, cn *counters) bool {
	if n > m.budget {
		return false
	}
	need := m.used + n - m.budget
	if need > 0 {
		var free int64
		var victims []*memEntry
		for _, k := range m.lru.Keys() { // oldest first
			e, _ := m.lru.Peek(k)
			if e.refs > 0 {
				continue
			}
			victims = append(victims, e)
			if free += int64(len(e.data)); free >= need {
				break
			}
		}
		if free < need {
			return false
		}
		for _, e := range victims {
			m.remove(e.url)
			cn.evicted.Add(1)
		}
	}
	m.used += n
	return true
}

// insert adds buf, whose bytes were reserved, as url's entry, replacing any other.
func (m *memTier) insert(url, version string, buf []byte) *memEntry {
	m.remove(url)
	e := &memEntry{tier: m, url: url, version: version, data: buf}
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
