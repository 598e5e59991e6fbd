package main

import "math/rand/v2"

// shuffler is the shuffle buffer of the old mixer (shard.Shuffler, since removed, as
// the mixer used it), on entries: full at maxItems items or maxBytes bytes,
// whichever comes first; the item limit starts at ShuffleInitial (100) and grows by
// one per item out of a full buffer, up to maxItems.
type shuffler struct {
	rng      *rand.Rand
	items    []entry
	sizes    []int64
	bytes    int64
	maxItems int
	limit    int
	maxBytes int64
}

// shuffleInitial was shard.ShuffleInitial.
const shuffleInitial = 100

func newShuffler(rng *rand.Rand, maxItems int, maxBytes int64) *shuffler {
	maxItems = max(maxItems, 1)
	return &shuffler{rng: rng, maxItems: maxItems, limit: min(maxItems, shuffleInitial), maxBytes: maxBytes}
}

func (s *shuffler) push(v entry, size int64) {
	s.items = append(s.items, v)
	s.sizes = append(s.sizes, size)
	s.bytes += size
}

func (s *shuffler) full() bool {
	return len(s.items) >= s.limit || (s.maxBytes > 0 && s.bytes >= s.maxBytes && len(s.items) > 0)
}

// pop removes a random item: the one at a random index, the last one taking its
// place.
func (s *shuffler) pop() entry {
	n := len(s.items) - 1
	i := n
	if n > 0 {
		i = s.rng.IntN(n + 1)
	}
	v := s.items[i]
	s.bytes -= s.sizes[i]
	s.items[i], s.sizes[i] = s.items[n], s.sizes[n]
	s.items, s.sizes = s.items[:n], s.sizes[:n]
	if s.limit < s.maxItems && len(s.items) == s.limit-1 {
		s.limit++
	}
	return v
}
