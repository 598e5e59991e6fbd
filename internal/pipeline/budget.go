package pipeline

import (
	"fmt"
	"strings"
	"sync/atomic"

	"github.com/shardload/shardload/plan"
)

// NewBudget returns the error budget of a rank of a job of jobSamples samples in
// jobShards shards: it may skip fraction of either, or samples and shards, whichever
// is more.
func NewBudget(fraction float64, samples, shards, jobSamples int64, jobShards int) Budget {
	var parts []string
	if fraction > 0 {
		parts = append(parts, fmt.Sprintf("%g%% of the job's samples or shards", fraction*100))
	}
	if samples > 0 {
		parts = append(parts, fmt.Sprintf("%d samples", samples))
	}
	if shards > 0 {
		parts = append(parts, fmt.Sprintf("%d shards", shards))
	}
	text := strings.Join(parts, ", ")
	if len(parts) == 0 {
		text = "no skips"
	}
	return Budget{MaxSamples: max(fraction*float64(jobSamples), float64(samples)), MaxShards: max(fraction*float64(jobShards), float64(shards)),
		JobSamples: jobSamples, JobShards: jobShards, Text: text}
}

// FirstWhole returns the URL of the first of spans read from its shard's start (read
// so anyway: what tells whether the shards inflate), or "".
func FirstWhole(spans []plan.Span) string {
	for _, sp := range spans {
		if sp.Skip == 0 {
			return sp.URL
		}
	}
	return ""
}

// StreamCounters are one stream's counters in a mix of streams (Counters.Streams):
// samples delivered in batches, bytes read from the sources, samples skipped.
type StreamCounters struct{ Samples, Bytes, Skipped atomic.Int64 }

// newStreamCounters returns the counters of the streams that streamOf names, nil
// for none.
func newStreamCounters(streamOf []int) []StreamCounters {
	n := 0
	for _, s := range streamOf {
		n = max(n, s+1)
	}
	if n == 0 {
		return nil
	}
	return make([]StreamCounters, n)
}

// streamBytes counts n bytes read of shard si for its stream.
func (c *Counters) streamBytes(streamOf []int, si int, n int64) {
	if c.Streams != nil && streamOf[si] >= 0 {
		c.Streams[streamOf[si]].Bytes.Add(n)
	}
}
