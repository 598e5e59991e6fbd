//go:build !linux

package source

func prefault([]byte) {}
