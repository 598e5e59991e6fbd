package testutil

import "testing"

func TestWindowCounts(t *testing.T) {
	seq := []int{1, 1, 0, 0, 0, 1, 1, 1}
	one := func(v int) bool { return v == 1 }
	for _, tt := range []struct{ n, lo, hi int }{{2, 0, 2}, {3, 0, 3}, {8, 5, 5}, {20, 5, 5}} {
		if lo, hi := WindowCounts(seq, tt.n, one); lo != tt.lo || hi != tt.hi {
			t.Errorf("n %d: %d to %d, want %d to %d", tt.n, lo, hi, tt.lo, tt.hi)
		}
	}
}
