//go:build !race

package decode

// raceEnabled: the race detector is off.
const raceEnabled = false
