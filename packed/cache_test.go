package packed_test

import (
	"context"
	"io"
	"path/filepath"
	"slices"
	"strings"
	"sync"
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

// versioned is remote with pinned reads (source.VersionReader), counting the Stats
// and the reads of each object.
type versioned struct {
	remote
	stats atomic.Int64
	reads sync.Map // URL -> *atomic.Int64
}

func (v *versioned) Stat(ctx context.Context, url string) (source.Info, error) {
	v.stats.Add(1)
	return v.remote.Stat(ctx, url)
}

func (v *versioned) OpenVersion(ctx context.Context, url, version string, off, n int64) (io.ReadCloser, error) {
	c, _ := v.reads.LoadOrStore(url, new(atomic.Int64))
	c.(*atomic.Int64).Add(1)
	rc, err := v.file.OpenVersion(ctx, v.path(url), version, off, n)
	if err != nil {
		return nil, err
	}
	return counted{rc, &v.bytes}, nil
}

func (v *versioned) OpenRange(ctx context.Context, url string, off, n int64) (io.ReadCloser, error) {
	c, _ := v.reads.LoadOrStore(url, new(atomic.Int64))
	c.(*atomic.Int64).Add(1)
	return v.remote.OpenRange(ctx, url, off, n)
}

// A packed epoch of a Megatron dataset from a store reads the .bin in few
// requests, each pinned to the version found at Open and none after a Stat of its
// own: a chunk reads ahead towards its part's end, so that a part of 4,096
// documents is not one request per group of batches; no byte is read twice.
func TestPackedRequests(t *testing.T) {
	const seqLen = 400
	docs := corpusDocs(3*packed.DocsPerShard, seqLen, 8)
	dir := t.TempDir()
	writeMegatron(t, dir, docs, megatron.Uint16)
	up := &versioned{remote: remote{dir: dir}}
	reg := &source.Registry{}
	reg.Register("mem", source.NewFetcher(up, source.FetchOptions{}))
	spec := pack.Spec{Field: "tokens", SeqLen: seqLen, HasEOS: true, EOS: 65535, Pad: 65535}
	cfg := packed.Config{Pack: spec, BatchSize: 4, Seed: 5, URLs: []string{filepath.Join(dir, "corpus.idx")}, Logf: t.Logf}
	want, _, _, _ := epoch(t, cfg)
	cfg.URLs, cfg.Sources = []string{"mem://b/corpus.idx"}, reg
	got, _, _, _ := epoch(t, cfg)
	if !slices.EqualFunc(got, want, slices.Equal) {
		t.Fatalf("the batches read from the store differ from the files'")
	}
	bin := filepath.Join(dir, "corpus.bin")
	info, err := (&source.File{}).Stat(context.Background(), bin)
	if err != nil {
		t.Fatal(err)
	}
	c, _ := up.reads.Load("mem://b/corpus.bin")
	reads := c.(*atomic.Int64).Load()
	// Three parts: a request or two each, where a request per group and lane was
	// about 20.
	if reads > 8 {
		t.Errorf("%d requests for a .bin of %d bytes in 3 parts", reads, info.Size)
	}
	if s := up.stats.Load(); s > 2 {
		t.Errorf("%d Stats for one .idx and one .bin", s)
	}
	if b := up.bytes.Load(); b > info.Size+info.Size/20+(1<<20) {
		t.Errorf("%d bytes read of a .idx and a .bin of %d", b, info.Size)
	}
	t.Logf("%d requests, %d Stats, %d bytes for a .bin of %d", reads, up.stats.Load(), up.bytes.Load(), info.Size)
}
