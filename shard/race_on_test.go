//go:build race

package shard

// raceEnabled: the race detector is on, and single-goroutine sweeps run several times
// slower without finding more.
const raceEnabled = true
