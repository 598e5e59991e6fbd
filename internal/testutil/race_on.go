//go:build race

package testutil

// Race reports whether the race detector is on: sync.Pool then drops items at random
// (allocation counts mean nothing) and single-goroutine sweeps run several times
// slower without finding more.
const Race = true
