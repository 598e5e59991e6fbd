//go:build !linux

package mem

// Prefault does nothing off Linux.
func Prefault([]byte) error { return nil }

// MapHuge returns nil off Linux: callers allocate instead.
func MapHuge(int) []byte { return nil }

// MapSmall returns nil off Linux: callers allocate instead.
func MapSmall(int) []byte { return nil }

// Unmap does nothing off Linux.
func Unmap([]byte) {}

// Physical returns 0 (unknown) off Linux.
func Physical() int64 { return 0 }

// AdviseHuge does nothing off Linux.
func AdviseHuge([]byte) bool { return false }
