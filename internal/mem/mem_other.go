//go:build !linux

package mem

// Prefault does nothing off Linux.
func Prefault([]byte) error { return nil }

// MapHuge returns nil off Linux: callers allocate instead.
func MapHuge(int) []byte { return nil }

// Unmap does nothing off Linux.
func Unmap([]byte) {}
