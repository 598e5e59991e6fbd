package index

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"

	"github.com/shardload/shardload/internal/redact"
	"github.com/shardload/shardload/shard"
	"github.com/shardload/shardload/source"
)

// EstimateSamples is how many samples of the first shard Estimate reads to measure
// the bytes per sample.
const EstimateSamples = 64

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

// measure returns the stored bytes per sample of the first shard with samples.
func (lk Lookup) measure(ctx context.Context, urls []string, objs []source.Info) (float64, error) {
	for i, u := range urls {
		if objs[i].Size == 0 {
			continue
		}
		body, err := lk.Sources.Open(ctx, u)
		if err != nil {
			return 0, fmt.Errorf("shardload: measuring the samples of %s: %w", redact.URL(u), err)
		}
		opts := lk.Reader
		opts.URL, opts.SizesOnly = u, true
		r := shard.NewReader(body, opts)
		n := 0
		var err2 error
		var first, last int64 // offsets of the first and last samples read
		for n < EstimateSamples {
			var s *shard.Sample
			s, err2 = r.Next()
			var se *shard.Error
			if err2 != nil && !(errors.As(err2, &se) && se.Skippable()) {
				break
			}
			if s != nil {
				if n == 0 {
					first = s.Offset
				}
				last = s.Offset
			}
			n++
		}
		// Stored bytes per byte of tar: 1 uncompressed, less compressed.
		ratio := float64(r.StoredBytes()) / float64(max(r.Offset(), 1))
		r.Close()
		body.Close()
		switch {
		case err2 == io.EOF && n > 0:
			return float64(objs[i].Size) / float64(n), nil // the whole shard
		case err2 == io.EOF:
			continue // no samples
		case err2 != nil && n < EstimateSamples:
			return 0, fmt.Errorf("shardload: measuring the samples of %s: %w", redact.URL(u), err2)
		}
		// The bytes between the first and the last sample's starts, not those read:
		// the reader reads ahead.
		if last > first && n > 1 {
			return float64(last-first) / float64(n-1) * ratio, nil
		}
		return float64(objs[i].Size) / float64(n), nil
	}
	return 1, nil // every shard is empty
}
