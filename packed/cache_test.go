package packed_test

import (
	"context"
	"io"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/shardload/shardload/cache"
	"github.com/shardload/shardload/megatron"
	"github.com/shardload/shardload/pack"
	"github.com/shardload/shardload/packed"
	"github.com/shardload/shardload/source"
)

// remote serves the files of a directory as mem://b/NAME and counts the bytes it
// is asked for: a store a cache sits in front of.
type remote struct {
	dir   string
	file  source.File
	bytes atomic.Int64
}

func (r *remote) path(url string) string {
	return filepath.Join(r.dir, strings.TrimPrefix(url, "mem://b/"))
}

func (r *remote) Stat(ctx context.Context, url string) (source.Info, error) {
	in, err := r.file.Stat(ctx, r.path(url))
	in.URL = url
	return in, err
}

func (r *remote) Open(ctx context.Context, url string) (io.ReadCloser, error) {
	return r.OpenRange(ctx, url, 0, -1)
}

func (r *remote) OpenRange(ctx context.Context, url string, off, n int64) (io.ReadCloser, error) {
	rc, err := r.file.OpenRange(ctx, r.path(url), off, n)
	if err != nil {
		return nil, err
	}
	return counted{rc, &r.bytes}, nil
}

type counted struct {
	io.ReadCloser
	n *atomic.Int64
}

func (c counted) Read(p []byte) (int, error) {
	n, err := c.ReadCloser.Read(p)
	c.n.Add(int64(n))
	return n, err
}

// A packed epoch read through a node cache (Config.Sources wrapped by cache.Wrap,
// as the command line does with --cache-dir) reads the documents' bytes from the
// cache: once the shards and the Megatron dataset are cached, the store is asked
// for no byte, and the batches are those read from the files.
func TestPackedThroughCache(t *testing.T) {
	const seqLen = 40
	docs := corpusDocs(120, seqLen, 6)
	dir := t.TempDir()
	spec := pack.Spec{Field: "tokens.npy", SeqLen: seqLen, HasEOS: true, EOS: 65535, Pad: 65535}
	local := writeShards(t, dir, docs, 30, "<u2")
	idx := writeMegatron(t, dir, docs, megatron.Uint16)
	up := &remote{dir: dir}
	reg := &source.Registry{}
	reg.Register("mem", up)
	cached, c, err := cache.Wrap(cache.Options{MemoryBytes: 64 << 20}, reg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var remoteTar []string
	for _, p := range local {
		remoteTar = append(remoteTar, "mem://b/"+filepath.Base(p))
	}
	// Fill the cache: whole reads, as warm does.
	ctx := context.Background()
	for _, u := range append(slices.Clone(remoteTar), "mem://b/corpus.idx", "mem://b/corpus.bin") {
		rc, err := cached.Open(ctx, u)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, rc)
		rc.Close()
	}
	for _, tc := range []struct {
		name          string
		local, remote []string
		field         string
	}{
		{"tar", local, remoteTar, "tokens.npy"},
		{"megatron", []string{idx}, []string{"mem://b/corpus.idx"}, "tokens"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := spec
			s.Field = tc.field
			cfg := packed.Config{Pack: s, BatchSize: 2, Seed: 4, ShuffleBuffer: 20, Logf: t.Logf}
			cfg.URLs = tc.local
			want, _, _, _ := epoch(t, cfg)
			cfg.URLs, cfg.Sources = tc.remote, cached
			before, hits := up.bytes.Load(), c.Stats().MemoryHits
			got, _, _, _ := epoch(t, cfg)
			if !slices.EqualFunc(got, want, slices.Equal) {
				t.Errorf("the batches read through the cache differ from the files'")
			}
			if n := up.bytes.Load() - before; n != 0 {
				t.Errorf("the store was asked for %d bytes of cached objects", n)
			}
			if h := c.Stats().MemoryHits - hits; h == 0 {
				t.Errorf("no memory hit for %d batches: the documents were not read from the cache", len(want))
			}
		})
	}
}
