//go:build !linux

package serve

// physicalMemory returns the machine's memory in bytes, 0 when unknown.
func physicalMemory() int64 { return 0 }
