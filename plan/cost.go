package plan

import "github.com/shardload/shardload/shard"

// SpanRange returns the bytes [off, end) of its shard that a loader reads for span
// sp of a plan over shards: from the offset of the span's first sample (the shard's
// start when its offsets are unknown, the samples before being read and dropped) to
// the offset after its last sample, or the shard's end when the span ends the shard.
// Without offsets, a span that ends before the shard's end is taken to end in
// proportion to its samples (the reader stops there; what a store sent ahead of it
// is not counted). A shard of unknown size (Size 0) gives an empty range.
func SpanRange(shards []shard.Info, sp Span) (off, end int64) {
	info := shards[sp.Shard]
	offs := info.Offsets
	last := sp.Skip + sp.Take
	if sp.Skip > 0 && sp.Skip < len(offs) {
		off = offs[sp.Skip]
	}
	switch {
	case last < len(offs) && (sp.Skip == 0 || sp.Skip < len(offs)):
		end = offs[last]
	case last >= info.Samples || info.Samples == 0:
		end = info.Size
	default:
		end = info.Size * int64(last) / int64(info.Samples)
	}
	return off, max(end, off)
}

// PartRequests returns the requests of reading n bytes as ranged parts of partSize
// (at least one, for an empty read too).
func PartRequests(n, partSize int64) int64 {
	if partSize <= 0 || n <= partSize {
		return 1
	}
	return (n + partSize - 1) / partSize
}

// Cost is what one rank's plan of one epoch reads (see CostOf).
type Cost struct {
	Spans  int   // ranged reads (opens) of shards
	Bytes  int64 // bytes read, SpanRange summed
	Shards []int // the shards read, by index, in the order first read
	// Requests are the GET requests of the spans when each is read as ranged parts
	// (PartRequests of its bytes): the parallel-part reads of a remote store.
	// SingleRequests are those when a span larger than a part is read as its first
	// part then one stream (the fetcher's single-stream path): at most 2 a span.
	Requests, SingleRequests int64
	// StartRequests are the requests in flight at the epoch's start: those of the
	// first open spans, at most parallel parts of each.
	StartRequests int64
	// FirstBatchBytes are the bytes read before the first batch: those of the
	// samples the windows holding the first batch are fed (samples dropped in
	// gaps too), each sample of a span counted at the span's mean.
	FirstBatchBytes    int64
	FirstBatchRequests int64
}

// CostOf returns what plan p (of a rank over shards, planned with batches of
// batchSize) reads: each span read as ranged parts of partSize, open spans at once
// at the epoch's start with at most parallel parts each in flight.
func CostOf(p *Plan, shards []shard.Info, batchSize int, partSize int64, parallel, open int) Cost {
	var c Cost
	c.Spans = len(p.Spans)
	seen := make(map[int]bool, len(p.Spans))
	perSample := make([]float64, len(p.Spans))
	reqs := make([]int64, len(p.Spans))
	for i, sp := range p.Spans {
		off, end := SpanRange(shards, sp)
		n := end - off
		c.Bytes += n
		reqs[i] = PartRequests(n, partSize)
		c.Requests += reqs[i]
		c.SingleRequests += min(reqs[i], 2)
		if i < open {
			c.StartRequests += min(reqs[i], int64(max(parallel, 1)))
		}
		if !seen[sp.Shard] {
			seen[sp.Shard] = true
			c.Shards = append(c.Shards, sp.Shard)
		}
		if sp.Take > 0 {
			perSample[i] = float64(n) / float64(sp.Take)
		}
	}
	// The windows that hold the first batch, and the spans that feed them.
	yielded := 0
	fed := map[int]bool{}
	var bytes float64
	for w := range p.Windows() {
		for _, f := range w.Feeds {
			bytes += float64(f.Count) * perSample[f.Span]
			if !fed[f.Span] {
				fed[f.Span] = true
				c.FirstBatchRequests += min(reqs[f.Span], int64(max(parallel, 1)))
			}
		}
		if yielded += int(w.Held); yielded >= batchSize {
			break
		}
	}
	c.FirstBatchBytes = int64(bytes)
	return c
}
