package index_test

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/shardload/shardload/index"
	"github.com/shardload/shardload/internal/shardgen"
	"github.com/shardload/shardload/shard"
	"github.com/shardload/shardload/source"
)

// choppyFile serves files as a remote store's body does: each read returns what
// has "arrived", a random number of bytes, drawn afresh for every open.
type choppyFile struct {
	source.File
	seed atomic.Uint64
}

func (c *choppyFile) Open(ctx context.Context, url string) (io.ReadCloser, error) {
	body, err := c.File.Open(ctx, strings.TrimPrefix(url, "remote://"))
	if err != nil {
		return nil, err
	}
	return &choppy{ReadCloser: body, rng: rand.New(rand.NewPCG(c.seed.Add(1), 7))}, nil
}

func (c *choppyFile) Stat(ctx context.Context, url string) (source.Info, error) {
	info, err := c.File.Stat(ctx, strings.TrimPrefix(url, "remote://"))
	info.URL = url
	return info, err
}

type choppy struct {
	io.ReadCloser
	rng *rand.Rand
}

func (c *choppy) Read(p []byte) (int, error) {
	if len(p) > 1 {
		p = p[:1+c.rng.IntN(min(len(p), 200<<10))]
	}
	return c.ReadCloser.Read(p)
}

// TestEstimateIsDeterministic: the estimated counts of shards are a function of the
// shards alone: the same in every run however a store's bodies arrive (in pieces
// of any size), for uncompressed and compressed shards, and shards larger than the
// prefix that is read.
func TestEstimateIsDeterministic(t *testing.T) {
	for _, c := range []struct {
		comp     shard.Compression
		samples  int
		min, max int
	}{
		{shard.None, 300, 1 << 10, 120 << 10},
		{shard.None, 40, 600 << 10, 1600 << 10}, // photos of about 1 MB
		{shard.Gzip, 300, 1 << 10, 120 << 10},
		{shard.Zstd, 300, 1 << 10, 120 << 10},
	} {
		comp := c.comp
		t.Run(fmt.Sprintf("%s/%d", comp, c.samples), func(t *testing.T) {
			dir := t.TempDir()
			spec := shardgen.Spec{Shards: 3, SamplesPerShard: c.samples, Compression: comp, Seed: 5,
				Fields: []shardgen.Field{{Ext: "bin", Kind: shardgen.Random, MinBytes: c.min, MaxBytes: c.max}, {Ext: "cls", Kind: shardgen.Class}}}
			paths, err := shardgen.Generate(dir, spec)
			if err != nil {
				t.Fatal(err)
			}
			urls := make([]string, len(paths))
			for i, p := range paths {
				urls[i] = "remote://" + filepath.ToSlash(p)
			}
			src := &choppyFile{}
			reg := &source.Registry{}
			reg.Register("remote", src)
			lk := index.Lookup{Sources: reg, NoBeside: true}
			var want string
			for run := range 12 {
				infos, err := lk.Estimate(t.Context(), urls, nil)
				if err != nil {
					t.Fatal(err)
				}
				got := fmt.Sprint(samplesOf(infos))
				if run == 0 {
					want = got
					t.Logf("%s: estimated %s (true %d each)", comp, got, c.samples)
					continue
				}
				if got != want {
					t.Fatalf("run %d estimated %s, run 0 %s: the estimate depends on how the bytes arrived", run, got, want)
				}
			}
		})
	}
}

func samplesOf(infos []shard.Info) []int {
	n := make([]int, len(infos))
	for i, in := range infos {
		n[i] = in.Samples
	}
	return n
}
