package index

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"

	"github.com/shardload/shardload/redact"
	"github.com/shardload/shardload/shard"
	"github.com/shardload/shardload/source"
)

// EstimateSamples is how many samples of the first shard Estimate measures an
// uncompressed shard by, and EstimatePrefix the most stored bytes of it that it
// reads: a compressed shard is measured by what its first EstimatePrefix bytes hold
// (the shard whole, when it is no larger).
const (
	EstimateSamples = 64
	EstimatePrefix  = 16 << 20
)

// Estimate returns entries whose sample counts are estimated from the objects' sizes,
// for planning an epoch without reading the shards first (shard.Info.Estimated). The
// bytes per sample are measured on the first EstimateSamples samples of the first
// non-empty shard (a few MB), read by every rank alike, so that every rank of a job
// estimates the same counts from the same objects. Shards whose entries are in known
// (by URL, as Resolve finds them) keep their exact counts; pass nil for a plan that
// depends on nothing but the objects, as ranks on other nodes must.
func (lk Lookup) Estimate(ctx context.Context, urls []string, known map[string]shard.Info) ([]shard.Info, error) {
	objs := make([]source.Info, len(urls))
	all := make([]int, len(urls))
	for i := range all {
		all[i] = i
	}
	lk = lk.withDefaults()
	if err := lk.objects(ctx, urls, all, objs); err != nil {
		return nil, err
	}
	lk.answered()
	infos := make([]shard.Info, len(urls))
	var perSample float64
	keys := keysOf(urls)
	for i, u := range urls {
		if e, ok := known[keys[i]]; ok && e.Version == objs[i].Version && e.Version != "" {
			e.URL = u
			infos[i] = e
			continue
		}
		if perSample == 0 {
			var err error
			if perSample, err = lk.measure(ctx, urls, objs); err != nil {
				return nil, err
			}
		}
		// Never 0: a shard planned empty would be read by no rank, its samples lost
		// and its damage unseen; one planned with a sample it lacks is padded.
		n := max(1, int(math.Round(float64(objs[i].Size)/perSample)))
		infos[i] = shard.Info{URL: u, Samples: n, Version: objs[i].Version, Size: objs[i].Size, Estimated: true}
	}
	return infos, nil
}

// measure returns the stored bytes per sample of the first shard with samples: a
// function of that shard's size and of the bytes of its first EstimatePrefix alone,
// never of how much a reader happened to read ahead or of when bytes arrived, so
// that every process, in every run, on every node, estimates the same counts.
//
// An uncompressed shard is measured by its first EstimateSamples samples: the bytes
// between the first and the last one's starts. A compressed one by its first
// EstimatePrefix stored bytes, read to their end: the tar bytes they inflate to
// (a decompressor's output for given input is fixed) and the samples that start in
// them. A shard no larger than EstimatePrefix read to its end gives its own count.
func (lk Lookup) measure(ctx context.Context, urls []string, objs []source.Info) (float64, error) {
	for i, u := range urls {
		if objs[i].Size == 0 {
			continue
		}
		per, ok, err := lk.measureOne(ctx, u, objs[i].Size)
		if err != nil {
			return 0, fmt.Errorf("shardload: measuring the samples of %s: %w", redact.URL(u), err)
		}
		if ok {
			return per, nil
		}
	}
	return 1, nil // every shard is empty
}

// measureOne returns the stored bytes per sample of the shard at u of size bytes
// (see measure), and false when it holds no sample.
func (lk Lookup) measureOne(ctx context.Context, u string, size int64) (float64, bool, error) {
	body, err := lk.Sources.Open(ctx, u)
	if err != nil {
		return 0, false, err
	}
	defer body.Close()
	prefix := min(size, EstimatePrefix)
	opts := lk.Reader
	opts.URL, opts.SizesOnly = u, true
	r := shard.NewReader(io.LimitReader(body, prefix), opts)
	defer r.Close()
	n := 0 // samples read whole
	var first, last int64
	var err2 error
	for {
		var s *shard.Sample
		s, err2 = r.Next()
		if err2 != nil && !shard.SampleOnly(err2) {
			break
		}
		if s != nil {
			if n == 0 {
				first = s.Offset
			}
			last = s.Offset
			n++
		}
		if n >= EstimateSamples && r.Compression() == shard.None {
			break // uncompressed: the samples' offsets are all it takes
		}
	}
	whole := err2 == io.EOF && prefix == size
	switch {
	case whole && n == 0:
		return 0, false, nil // no samples
	case whole:
		return float64(size) / float64(n), true, nil
	case err2 == io.EOF || err2 == nil:
		// Read to the end of the prefix (or EstimateSamples samples of an
		// uncompressed shard) with no error: a shard longer than its tar's end.
	case prefix == size || n == 0 && !errors.Is(err2, io.ErrUnexpectedEOF) && !errors.Is(err2, shard.ErrTruncated):
		// The shard itself is bad: its count cannot be estimated.
		return 0, false, err2
	}
	// Stored bytes per byte of tar: 1 uncompressed; for a compressed shard, the
	// prefix's bytes over the tar bytes they inflated to.
	ratio := 1.0
	if r.Compression() != shard.None {
		ratio = float64(prefix) / float64(max(r.Offset(), 1))
	}
	if n > 1 && last > first {
		return float64(last-first) / float64(n-1) * ratio, true, nil
	}
	// Fewer than two samples start in the prefix: each takes at least the prefix.
	return float64(max(prefix, r.Offset())) * ratio, true, nil
}

// EstimateNotice is the line a loader logs, once, when n of the total shards it plans
// a job of world ranks from have counts estimated from their sizes.
func EstimateNotice(n, total, world int) string {
	what := "every rank yields the planned number of batches, and a shard holding more or fewer samples than estimated makes ranks leave some out or repeat some (Stats.Trimmed and Stats.Padded, reported at each epoch's end)"
	if world == 1 {
		what = "the epoch yields the planned number of batches, and a shard holding more or fewer samples than estimated makes it leave some out or repeat some (Stats.Trimmed and Stats.Padded, reported at the epoch's end)"
	}
	return fmt.Sprintf("shardload: no index for %d of these %d shards: their sample counts are estimated from their sizes, so that the first batch does not wait for a count; %s. For exact epochs write an index once: shardload index --output DIR/ URL...", n, total, what)
}
