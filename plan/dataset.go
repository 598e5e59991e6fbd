package plan

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"

	"github.com/shardload/shardload/redact"
	"github.com/shardload/shardload/shard"
	"github.com/shardload/shardload/source"
)

// Dataset returns 16 hex digits naming a shard list with its counts, and its samples.
// Each shard counts by one spelling (a relative or absolute path, file://, a
// presigned URL's signature: source.Canonical and redact.URL), so that ranks that name
// the same shards differently agree.
func Dataset(shards []shard.Info) (string, int64) {
	h := sha256.New()
	var n [8]byte
	var total int64
	var c source.Canonicalizer
	for _, s := range shards {
		u := redact.URL(c.Canonical(s.URL))
		binary.LittleEndian.PutUint64(n[:], uint64(len(u)))
		h.Write(n[:])
		h.Write([]byte(u))
		binary.LittleEndian.PutUint64(n[:], uint64(s.Samples))
		h.Write(n[:])
		total += int64(s.Samples)
	}
	return hex.EncodeToString(h.Sum(nil)[:8]), total
}

// MeanSampleBytes returns the mean stored size of the samples of the shards whose
// sizes are known, and false when none is.
func MeanSampleBytes(shards []shard.Info) (int64, bool) {
	var bytes, samples int64
	for _, s := range shards {
		if s.Size > 0 && s.Samples > 0 {
			bytes += s.Size
			samples += int64(s.Samples)
		}
	}
	if samples == 0 {
		return 0, false
	}
	return bytes / samples, true
}

// WindowSize returns an order's window: half of buffer samples, or of as many as
// bufferBytes holds at the mean stored size of the samples of the shards whose sizes
// are known, if fewer (at least 1): a loader holds two windows, the one it yields and
// the next. It depends on the shard list alone, so every rank computes the same.
func WindowSize(buffer int, bufferBytes int64, shards []shard.Info) int {
	var bytes, samples int64
	for _, s := range shards {
		if s.Size > 0 {
			bytes += s.Size
			samples += int64(s.Samples)
		}
	}
	w := int64(buffer)
	if bytes > 0 && samples > 0 {
		w = min(w, max(1, bufferBytes/max(1, bytes/samples)))
	}
	return int(max(1, w/2))
}
