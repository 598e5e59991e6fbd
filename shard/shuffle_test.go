package shard

import (
	"slices"
	"testing"
)

func shuffleAll(seed uint64, n, maxItems int, maxBytes int64) []int {
	s := NewShuffler[int](EpochRand(seed, 0, 1), maxItems, maxBytes)
	var out []int
	for i := 0; i < n; i++ {
		s.Push(i, int64(1+i%3))
		for s.Full() {
			out = append(out, s.Pop())
		}
	}
	for s.Len() > 0 {
		out = append(out, s.Pop())
	}
	return out
}

func TestShuffler(t *testing.T) {
	a := shuffleAll(1, 1000, 100, 0)
	if !slices.Equal(a, shuffleAll(1, 1000, 100, 0)) {
		t.Fatal("same seed, different order")
	}
	if slices.Equal(a, shuffleAll(2, 1000, 100, 0)) {
		t.Error("different seeds, same order")
	}
	sorted := slices.Sorted(slices.Values(a))
	for i, v := range sorted {
		if v != i {
			t.Fatalf("item %d lost or duplicated", i)
		}
	}
	if slices.IsSorted(a) {
		t.Error("buffer of 100 did not shuffle")
	}
	// An item cannot come out before the buffer that holds it has filled: item i leaves
	// at position >= i-(maxItems-1).
	pos := make([]int, len(a))
	for p, v := range a {
		pos[v] = p
	}
	for v, p := range pos {
		if p < v-99 {
			t.Fatalf("item %d came out at %d, before it could have been read", v, p)
		}
	}
	if pass := shuffleAll(1, 50, 1, 0); !slices.IsSorted(pass) {
		t.Errorf("pass-through buffer reordered: %v", pass)
	}
}

func TestShufflerByteBudget(t *testing.T) {
	s := NewShuffler[int](EpochRand(0, 0, 0), 1000, 10)
	peak := int64(0)
	for i := 0; i < 200; i++ {
		s.Push(i, 3)
		peak = max(peak, s.Bytes())
		for s.Full() {
			s.Pop()
		}
	}
	// The buffer lets items out as soon as it reaches the budget: it never holds more
	// than the budget plus one item.
	if peak > 10+3 {
		t.Errorf("peak %d bytes, budget 10", peak)
	}
}

func TestShufflerRampsUp(t *testing.T) {
	s := NewShuffler[int](EpochRand(0, 0, 0), 1000, 0)
	firstOut, size := -1, 0
	for i := 0; i < 5000; i++ {
		s.Push(i, 1)
		for s.Full() {
			s.Pop()
			if firstOut < 0 {
				firstOut = i
			}
		}
		size = max(size, s.Len())
	}
	if firstOut != ShuffleInitial-1 {
		t.Errorf("first item out after %d in, want %d", firstOut+1, ShuffleInitial)
	}
	if size != 999 {
		t.Errorf("buffer grew to %d items, want 999 of 1000", size)
	}
}
