//go:build !linux

package shardload

func mapChunk(int) []byte { return nil }

func unmapChunk([]byte) {}

func physicalMemory() int64 { return 0 }
