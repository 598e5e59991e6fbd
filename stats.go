package shardload

import (
	"sync/atomic"
	"time"
)

// Stats are a loader's counters and where its time went. Stage times are summed over
// the goroutines that spend them, so with several workers they can exceed Elapsed.
type Stats struct {
	Samples       int64 // samples delivered in batches (not counting padding)
	Batches       int64
	Padded        int64 // rows repeating earlier samples to pad a short epoch
	Skipped       int64 // samples left out by the Skip policy
	SkippedShards int64
	BytesIn       int64 // bytes read from the sources (compressed, as stored)
	BytesInflated int64 // bytes of tar after whole-shard decompression
	BytesOut      int64 // bytes of the batches written into slabs
	Workers       int   // the Workers setting in effect
	PageLocked    bool  // whether the slabs are page-locked (mlock)
	Elapsed       time.Duration
	FirstBatch    time.Duration // from Open to the first batch handed to Next's caller
	// Stages: fetch (reading sources), inflate (whole-shard decompression), split
	// (tar parsing and grouping), decode (field decoders, and copying the sample into
	// memory the loader owns while it waits), shuffle, collate (writing slabs), starve
	// (the mixer waiting for decoded samples) and wait (Next's caller waiting for a
	// batch).
	Stages map[string]time.Duration
}

// StageNames lists the stages of Stats.Stages in pipeline order.
var StageNames = []string{"fetch", "inflate", "split", "decode", "shuffle", "collate", "starve", "wait"}

type counters struct {
	samples, batches, padded, skipped, skippedShards atomic.Int64
	bytesIn, bytesInflated, bytesOut                 atomic.Int64
	firstBatch                                       atomic.Int64
	fetch, inflate, split, decode, shuffle, collate  atomic.Int64
	starve, wait                                     atomic.Int64
}

func (c *counters) add(stage *atomic.Int64, d time.Duration) { stage.Add(int64(d)) }

// clockBase anchors mono.
var clockBase = time.Now()

// mono returns a monotonic timestamp for stage times: one clock read, where time.Now
// takes two (wall and monotonic). The producers and the mixer take several per
// sample.
func mono() time.Duration { return time.Since(clockBase) }

func (c *counters) snapshot(start time.Time) Stats {
	d := func(v *atomic.Int64) time.Duration { return time.Duration(v.Load()) }
	return Stats{
		Samples: c.samples.Load(), Batches: c.batches.Load(), Padded: c.padded.Load(),
		Skipped: c.skipped.Load(), SkippedShards: c.skippedShards.Load(),
		BytesIn: c.bytesIn.Load(), BytesInflated: c.bytesInflated.Load(), BytesOut: c.bytesOut.Load(),
		Elapsed: time.Since(start), FirstBatch: d(&c.firstBatch),
		Stages: map[string]time.Duration{
			"fetch": d(&c.fetch), "inflate": d(&c.inflate), "split": d(&c.split), "decode": d(&c.decode),
			"shuffle": d(&c.shuffle), "collate": d(&c.collate), "starve": d(&c.starve), "wait": d(&c.wait),
		},
	}
}
