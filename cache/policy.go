package cache

// The eviction policy: which entry goes first when a tier needs room, and whether an
// object is admitted at all.

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
)

// Policy is how the tiers choose what to evict (see the package documentation,
// "Eviction by next use"). The zero value is PolicyOrder.
type Policy int

const (
	// PolicyOrder evicts the entry whose next use by any live reader of the node is
	// furthest away, entries no reader has announced first (least recently used
	// first), and does not admit an object needed later than everything its room
	// would take. With no hints published it is PolicyLRU.
	PolicyOrder Policy = iota
	// PolicyLRU evicts the least recently used entry and admits every object, hints
	// or not.
	PolicyLRU
)

// DefaultPolicy is the policy of a zero Options.Policy.
const DefaultPolicy = PolicyOrder

// String returns the policy's name, as ParsePolicy reads it: "order" or "lru".
func (p Policy) String() string {
	switch p {
	case PolicyOrder:
		return "order"
	case PolicyLRU:
		return "lru"
	}
	return "Policy(" + strconv.Itoa(int(p)) + ")"
}

// ParsePolicy reads a policy's name: "order" or "lru" (any case), as a
// --cache-policy flag gives it.
func ParsePolicy(s string) (Policy, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "order":
		return PolicyOrder, nil
	case "lru":
		return PolicyLRU, nil
	}
	return 0, fmt.Errorf("cache: unknown eviction policy %q (want order or lru)", s)
}

// MarshalText is String, for flags and configuration files.
func (p Policy) MarshalText() ([]byte, error) {
	if p != PolicyOrder && p != PolicyLRU {
		return nil, fmt.Errorf("cache: unknown eviction policy %d", int(p))
	}
	return []byte(p.String()), nil
}

// UnmarshalText is ParsePolicy.
func (p *Policy) UnmarshalText(b []byte) error {
	v, err := ParsePolicy(string(b))
	if err != nil {
		return err
	}
	*p = v
	return nil
}

// rank is where an entry stands in the order of eviction: see before.
type rank struct {
	hinted bool  // some live reader will read it again
	next   int64 // then, when (unix nanoseconds)
	lru    int   // its place in the tier's recency order, 0 the least recently used
}

// before reports whether a is evicted before b: entries no live reader will read
// again first, least recently used first; then the one needed furthest away (a tie
// goes to the least recently used).
func (a rank) before(b rank) bool {
	if a.hinted != b.hinted {
		return !a.hinted
	}
	if a.hinted && a.next != b.next {
		return a.next > b.next
	}
	return a.lru < b.lru
}

// ranker ranks a tier's entries by their next use, as the hints of the node's live
// readers say at one moment, and the object a fill wants room for. A nil ranker is
// PolicyLRU: least recently used first, every object admitted.
type ranker struct {
	set      *hintSet // nil: no hints
	now      int64
	obj      rank // the object room is made for: the most recently used
	freeOnly bool // evict nothing: the room must be free (fill.ranker)
}

// newRanker returns the ranker of an object of key k under the hints in set at now.
func newRanker(set *hintSet, now int64, k string) *ranker {
	r := &ranker{set: set, now: now, obj: rank{lru: math.MaxInt}}
	if set != nil {
		r.obj.next, r.obj.hinted = set.after(hintKey(k), now)
	}
	return r
}

// rankOf returns the rank of an entry whose hint key is h, at place lru in its tier's
// recency order.
func (r *ranker) rankOf(h uint64, lru int) rank {
	k := rank{lru: lru}
	if r != nil && r.set != nil {
		k.next, k.hinted = r.set.next(h, r.now)
	}
	return k
}

// evictResult is what a tier's attempt to make room came to.
type evictResult int

const (
	roomMade  evictResult = iota // the bytes fit now
	noRoom                       // they cannot: larger than the budget, or the rest is being read
	notWanted                    // the policy keeps what is there: the object is needed later than all of it
)

// victim is an entry a tier could evict, with its rank and size.
type victim[E any] struct {
	e     E
	rank  rank
	bytes int64
}

// plan returns the entries to evict, in order, to free need bytes from cands (in any
// order): roomMade with them, notWanted when one of them would be needed sooner than
// the object (nothing is to be evicted then), noRoom when all of them would not be
// enough, or when r evicts nothing (freeOnly). Under PolicyLRU (a nil ranker) the order is recency alone and every object
// is wanted.
func plan[E any](r *ranker, cands []victim[E], need int64) ([]victim[E], evictResult) {
	if r != nil && r.freeOnly {
		return nil, noRoom
	}
	sortVictims(cands)
	var free int64
	for i, v := range cands {
		if r != nil && !v.rank.before(r.obj) {
			return nil, notWanted
		}
		if free += v.bytes; free >= need {
			return cands[:i+1], roomMade
		}
	}
	return nil, noRoom
}

// sortVictims sorts cands in the order of eviction.
func sortVictims[E any](cands []victim[E]) {
	slices.SortFunc(cands, func(a, b victim[E]) int {
		switch {
		case a.rank.before(b.rank):
			return -1
		case b.rank.before(a.rank):
			return 1
		}
		return 0
	})
}

// ranker returns the ranker of room made for f's object (Cache.ranker). A fetch
// behind a range read (fillBehind) takes free room only, under either policy: the
// range asked for was read from the source already, and the rest of the object is
// read by ranges the same way if it is not fetched, so the fetch saves no byte of
// the reads that wanted it, while any entry it evicted would be fetched again when
// next read. Objects read by ranges all epoch long, too large for a range fill (the
// .bin files of a packed Megatron corpus), otherwise took the room of one another at
// each range that missed, each fetched whole: with a disk of 0.55 of a corpus of 6
// such files, 8-10 times the corpus an epoch under LRU, and under PolicyOrder 0.8-1.0
// where the disk's half of the corpus, kept, leaves 0.5 to fetch.
func (f *fill) ranker() *ranker {
	if f.behind {
		return &ranker{freeOnly: true}
	}
	return f.c.ranker(f.key)
}

// Policy returns the cache's eviction policy (Options.Policy).
func (c *Cache) Policy() Policy { return c.opts.Policy }

// ranker returns the policy's ranker of room made for the object of key k, from
// the hints of the node's live readers now; nil under PolicyLRU. It reads the hints
// directory: call it outside Cache.mu.
func (c *Cache) ranker(k string) *ranker {
	if c.opts.Policy != PolicyOrder {
		return nil
	}
	return newRanker(c.hints.view(), c.now().UnixNano(), k)
}
