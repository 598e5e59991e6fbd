//go:build !race

package shard

// raceEnabled: the race detector is off.
const raceEnabled = false
