package shardload

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"

	"github.com/shardload/shardload/internal/redact"
	"github.com/shardload/shardload/shard"
)

// Count returns the shards of cfg (its URLs, brace-expanded) with their sample counts,
// from cfg.Index when set, otherwise by reading every shard once (headers only where
// the source can seek, as for local files), cfg.Workers at a time. Pass the result as
// Config.Shards to open several epochs without counting again.
//
// A sample that fails on its own (a duplicate extension) still counts: it holds a
// place in the epoch. A shard that cannot be counted to its end fails Count under
// either policy: every rank plans from the counts, and a count that one process got
// short after a transient failure would give that rank another plan than the others
// (overlapping slices, unequal batch counts, a hung job). Give the counts (Shards or
// Index) to plan without reading.
func Count(ctx context.Context, cfg Config) (infos []shard.Info, err error) {
	defer func() { err = redact.Error(err) }()
	return count(ctx, cfg)
}

func count(ctx context.Context, cfg Config) ([]shard.Info, error) {
	cfg = cfg.withDefaults()
	if len(cfg.Shards) > 0 {
		return cfg.Shards, nil
	}
	urls, err := shard.ExpandAll(cfg.URLs)
	if err != nil {
		return nil, err
	}
	if urls, err = cfg.Sources.Expand(ctx, urls); err != nil {
		return nil, err
	}
	if cfg.Index != "" {
		return readIndex(ctx, cfg, urls)
	}
	infos := make([]shard.Info, len(urls))
	errs := make([]error, len(urls))
	sem := make(chan struct{}, cfg.Workers)
	var wg sync.WaitGroup
	for i, url := range urls {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			wg.Wait()
			return nil, ctx.Err()
		}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			defer func() {
				if r := recover(); r != nil {
					errs[i] = panicError("counting "+url, r)
				}
			}()
			infos[i] = shard.Info{URL: url}
			infos[i].Samples, errs[i] = countShard(ctx, cfg, url)
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			return nil, fmt.Errorf("shardload: counting the samples of %s stopped after %d: %w (every rank plans from the counts, so a shard that cannot be counted fails the job under either error policy)", urls[i], infos[i].Samples, err)
		}
	}
	return infos, nil
}

func countShard(ctx context.Context, cfg Config, url string) (int, error) {
	body, err := cfg.Sources.Open(ctx, url)
	if err != nil {
		return 0, err
	}
	defer body.Close()
	r := shard.NewReader(body, shard.Options{URL: url, SizesOnly: true, MaxMemberSize: cfg.MaxMemberSize, MaxRatio: cfg.MaxRatio})
	defer r.Close()
	n := 0
	for {
		_, err := r.Next()
		if err == io.EOF {
			return n, nil
		}
		var se *shard.Error
		if err != nil && !(errors.As(err, &se) && se.Skippable()) {
			return n, err
		}
		n++
	}
}

// indexLine is one line of an index: what "shardload ls --summary --json" prints.
type indexLine struct {
	URL     string `json:"url"`
	Samples *int   `json:"samples"`
}

func readIndex(ctx context.Context, cfg Config, urls []string) ([]shard.Info, error) {
	body, err := cfg.Sources.Open(ctx, cfg.Index)
	if err != nil {
		return nil, fmt.Errorf("shardload: index: %w", err)
	}
	defer body.Close()
	counts := map[string]int{}
	sc := bufio.NewScanner(body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for line := 1; sc.Scan(); line++ {
		text := strings.TrimSpace(sc.Text())
		if text == "" {
			continue
		}
		var l indexLine
		if err := json.Unmarshal([]byte(text), &l); err != nil || l.URL == "" || l.Samples == nil || *l.Samples < 0 {
			return nil, fmt.Errorf("shardload: index %s line %d: want {\"url\": ..., \"samples\": N}, got %.80q", cfg.Index, line, text)
		}
		counts[redact.URL(l.URL)] = *l.Samples
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("shardload: index %s: %w", cfg.Index, err)
	}
	infos := make([]shard.Info, len(urls))
	for i, url := range urls {
		n, ok := counts[redact.URL(url)]
		if !ok {
			return nil, fmt.Errorf("shardload: index %s has no line for %s", cfg.Index, url)
		}
		infos[i] = shard.Info{URL: url, Samples: n}
	}
	return infos, nil
}
