package pipeline

import "time"

// Stats are a loader's counters and where its time went. Stage times are summed over
// the goroutines that spend them, so with several workers they can exceed Elapsed.
type Stats struct {
	Samples       int64 // samples delivered in batches (not counting padding)
	Batches       int64
	Padded        int64 // rows repeating earlier samples to pad a short epoch
	Trimmed       int64 // samples read past the planned batches and left out (estimated counts)
	Skipped       int64 // samples left out by the Skip policy
	SkippedShards int64
	BytesIn       int64 // bytes read from the sources (compressed, as stored)
	BytesInflated int64 // bytes of tar after whole-shard decompression
	BytesOut      int64 // bytes of the batches written into slabs
	// BytesPlaced is the member bytes read straight into their slab rows
	// (Config.SlabReads), not copied at collate; Replaced counts the batches whose
	// rows were not as planned, collated by copying.
	BytesPlaced, Replaced int64
	Requests              int64 // reads of shards opened (a source may serve one in parts)
	Workers               int   // the Workers setting in effect
	// Memory is what the loader's buffers may hold at its settings in effect (the
	// tuner's), within the loader's memory budget (shardload.Config.MemoryBudget).
	Memory int64
	// Queued is what the open shards' queues hold now, in bytes (a gauge: Add
	// takes o's).
	Queued     int64
	PageLocked bool // whether the slabs are page-locked (mlock)
	Elapsed    time.Duration
	FirstBatch time.Duration // from Open to the first batch handed to Next's caller
	// SlabBytes is the size of the ring's largest slab (grown ones included).
	SlabBytes int64
	// Streams are each stream's figures in a mix of streams (shardload.Config.Streams).
	Streams []StreamStats
	// Stages: fetch (reading sources), inflate (whole-shard decompression), split
	// (tar parsing and grouping), decode (field decoders, and copying the sample into
	// memory the loader owns while it waits), shuffle, collate (writing slabs), starve
	// (the mixer waiting for decoded samples), wait (Next's caller waiting for a
	// batch that is not ready: the loader is behind) and backpressure (the loader
	// waiting for a slab while every one holds a batch its consumer has not
	// released: the loader is ahead).
	Stages map[string]time.Duration
}

// StreamStats are a stream's figures in a mix of streams (Stats.Streams): samples
// delivered in batches, bytes read from the sources, samples the Skip policy left out.
type StreamStats struct{ Samples, BytesIn, Skipped int64 }

func streamStats(cs []StreamCounters) (out []StreamStats) {
	for i := range cs {
		out = append(out, StreamStats{cs[i].Samples.Load(), cs[i].Bytes.Load(), cs[i].Skipped.Load()})
	}
	return out
}

// Add adds o's counters and stage times to s's (Workers, Memory, Queued and
// PageLocked become o's, SlabBytes the larger),
// for totals over epochs or loaders.
func (s *Stats) Add(o Stats) {
	s.Samples, s.Batches, s.Padded, s.Trimmed = s.Samples+o.Samples, s.Batches+o.Batches, s.Padded+o.Padded, s.Trimmed+o.Trimmed
	s.Skipped, s.SkippedShards, s.Elapsed = s.Skipped+o.Skipped, s.SkippedShards+o.SkippedShards, s.Elapsed+o.Elapsed
	s.BytesIn, s.BytesInflated, s.BytesOut, s.Requests = s.BytesIn+o.BytesIn, s.BytesInflated+o.BytesInflated, s.BytesOut+o.BytesOut, s.Requests+o.Requests
	s.BytesPlaced, s.Replaced = s.BytesPlaced+o.BytesPlaced, s.Replaced+o.Replaced
	s.Workers, s.Memory, s.Queued, s.PageLocked = o.Workers, o.Memory, o.Queued, o.PageLocked
	s.SlabBytes = max(s.SlabBytes, o.SlabBytes)
	s.Streams = append(s.Streams, make([]StreamStats, max(0, len(o.Streams)-len(s.Streams)))...)
	for i, st := range o.Streams {
		s.Streams[i] = StreamStats{s.Streams[i].Samples + st.Samples, s.Streams[i].BytesIn + st.BytesIn, s.Streams[i].Skipped + st.Skipped}
	}
	if s.Stages == nil {
		s.Stages = make(map[string]time.Duration, len(o.Stages))
	}
	for k, v := range o.Stages {
		s.Stages[k] += v
	}
}

// Stats returns the pipeline's counters, with Memory (what its buffers may hold at
// the tuner's knobs now) and SlabBytes, and for packed rows the time finding their
// documents (the stage "find"); the loader fills in Workers and Elapsed, which are
// its own. Without Params.Slabs (packed rows), Memory is the ring's bytes and
// SlabBytes its slabs' size.
func (pl *Pipeline) Stats() Stats {
	c, p := &pl.C, &pl.p
	s := Stats{
		Samples: c.Samples.Load(), Batches: c.Batches.Load(), Padded: c.Padded.Load(), Trimmed: c.Trimmed.Load(),
		Skipped: c.Skipped.Load(), SkippedShards: c.SkippedShards.Load(),
		BytesIn: c.BytesIn.Load(), BytesInflated: c.BytesInflated.Load(), BytesOut: c.BytesOut.Load(), Requests: c.Requests.Load(),
		BytesPlaced: c.Placed.Load(), Replaced: c.Replaced.Load(),
		Queued: c.Queued.Load(), PageLocked: pl.Locked(), FirstBatch: time.Duration(c.FirstBatch.Load()),
		Stages: c.Stages(), Streams: streamStats(c.Streams),
	}
	s.Memory, s.SlabBytes = int64(p.RingOptions.Slabs)*p.RingOptions.SlabBytes, p.RingOptions.SlabBytes
	if p.Slabs != nil {
		s.Memory, s.SlabBytes = p.Slabs.Memory(p.Tuned.Knobs()), p.Slabs.Bytes()
	}
	if p.Packed != nil { // finding the documents: the index, an .idx
		s.Stages["find"] = p.Packed.FindTime()
	}
	return s
}
