package shard

import "math/rand/v2"

// Shuffler is a seeded shuffle buffer: items go in, and once the buffer is full each
// new item lets a randomly chosen one out. The order out is a pure function of the
// order in, the sizes, the limits and the random source.
//
// The buffer is full when it holds MaxItems items or MaxBytes bytes, whichever comes
// first; a MaxItems of 0 or 1 passes items straight through. A Shuffler is not safe for
// concurrent use.
type Shuffler[T any] struct {
	rng      *rand.Rand
	items    []T
	sizes    []int64
	bytes    int64
	maxItems int
	limit    int // the current item limit: grows from the initial one to maxItems
	maxBytes int64
}

// ShuffleInitial is the number of items a Shuffler holds before its first item comes
// out; from there the buffer grows by one item per item out, up to its size, so that
// the first batch does not wait for the whole buffer to fill (as WebDataset's
// shuffle does).
const ShuffleInitial = 100

// NewShuffler returns an empty buffer holding at most maxItems items and, when
// maxBytes > 0, at most maxBytes bytes.
func NewShuffler[T any](rng *rand.Rand, maxItems int, maxBytes int64) *Shuffler[T] {
	maxItems = max(maxItems, 1)
	return &Shuffler[T]{rng: rng, maxItems: maxItems, limit: min(maxItems, ShuffleInitial), maxBytes: maxBytes}
}

// Push adds an item of the given size.
func (s *Shuffler[T]) Push(v T, size int64) {
	s.items = append(s.items, v)
	s.sizes = append(s.sizes, size)
	s.bytes += size
}

// Full reports whether an item must come out before the next goes in.
func (s *Shuffler[T]) Full() bool {
	return len(s.items) >= s.limit || (s.maxBytes > 0 && s.bytes >= s.maxBytes && len(s.items) > 0)
}

// Len returns the number of items held.
func (s *Shuffler[T]) Len() int { return len(s.items) }

// Bytes returns the total size of the items held.
func (s *Shuffler[T]) Bytes() int64 { return s.bytes }

// Pop removes and returns a random item (the only one, with a pass-through buffer).
// It panics when the buffer is empty.
func (s *Shuffler[T]) Pop() T {
	n := len(s.items) - 1
	i := n
	if n > 0 {
		i = s.rng.IntN(n + 1)
	}
	v := s.items[i]
	s.bytes -= s.sizes[i]
	s.items[i], s.sizes[i] = s.items[n], s.sizes[n]
	var zero T
	s.items[n] = zero
	s.items, s.sizes = s.items[:n], s.sizes[:n]
	if s.limit < s.maxItems && len(s.items) == s.limit-1 {
		// Out of a full buffer: let it grow by one.
		s.limit++
	}
	return v
}
