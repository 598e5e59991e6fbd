package testutil

// WindowCounts returns the fewest and the most elements of seq for which in holds
// among any n consecutive ones (among all of seq when it holds fewer than n): the
// share of one stream of a mix in every window of n samples.
func WindowCounts[T any](seq []T, n int, in func(T) bool) (lo, hi int) {
	n = min(n, len(seq))
	count := 0
	for i, v := range seq {
		if in(v) {
			count++
		}
		if i >= n && in(seq[i-n]) {
			count--
		}
		if i == n-1 {
			lo, hi = count, count
		} else if i >= n {
			lo, hi = min(lo, count), max(hi, count)
		}
	}
	return lo, hi
}
