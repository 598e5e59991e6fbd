package packed_test

import (
	"context"
	"io"
	"path/filepath"
	"slices"
	"sync"
	"testing"

	"github.com/shardload/shardload/megatron"
	"github.com/shardload/shardload/pack"
	"github.com/shardload/shardload/packed"
	"github.com/shardload/shardload/plan"
	"github.com/shardload/shardload/source"
)

// reads is remote recording the objects read by range once it is armed, each at its
// first read, in order.
type reads struct {
	remote
	mu    sync.Mutex
	armed bool
	first []string
}

func (r *reads) OpenRange(ctx context.Context, url string, off, n int64) (io.ReadCloser, error) {
	r.mu.Lock()
	if r.armed && !slices.Contains(r.first, url) {
		r.first = append(r.first, url)
	}
	r.mu.Unlock()
	return r.remote.OpenRange(ctx, url, off, n)
}

func (r *reads) Open(ctx context.Context, url string) (io.ReadCloser, error) {
	return r.OpenRange(ctx, url, 0, -1)
}

// Config.Planned is called once, before the epoch's first read, and Objects names
// exactly the objects the epoch then reads (tar shards, and a Megatron .bin once
// however many parts of the order it makes): in the order of the first reads where
// the order is the files' (no shuffle, one read at a time); from a resumed state,
// the objects still to read and no object whose documents all lie before it.
func TestObjectsAreTheEpochsReads(t *testing.T) {
	const seqLen = 40
	docs := corpusDocs(9000, seqLen, 11)
	dir := t.TempDir()
	local := writeShards(t, dir, docs[:600], 30, "<u2")
	writeMegatron(t, dir, docs[600:], megatron.Uint16) // more documents than packed.DocsPerShard
	up := &reads{remote: remote{dir: dir}}
	reg := &source.Registry{}
	reg.Register("mem", up)
	var tarURLs []string
	for _, p := range local {
		tarURLs = append(tarURLs, "mem://b/"+filepath.Base(p))
	}
	spec := pack.Spec{Field: "tokens.npy", SeqLen: seqLen, HasEOS: true, EOS: 65535, Pad: 65535}
	run := func(t *testing.T, cfg packed.Config) (objects, read []string) {
		t.Helper()
		up.mu.Lock()
		up.armed, up.first = false, nil
		up.mu.Unlock()
		calls := 0
		cfg.Planned = func(p packed.Planned) {
			calls++
			objects = p.Objects()
			up.mu.Lock()
			defer up.mu.Unlock()
			if len(up.first) > 0 {
				t.Errorf("Planned called after the epoch read %v", up.first)
			}
			up.armed = true
		}
		var rp plan.Plan
		inner := cfg.Planned
		cfg.Planned = func(p packed.Planned) {
			inner(p)
			rp = p.ReadPlan()
		}
		_, _, _, l := epoch(t, cfg)
		checkReadPlan(t, rp, l)
		if calls != 1 {
			t.Fatalf("Planned called %d times, want once", calls)
		}
		if !slices.Equal(l.Objects(), objects) {
			t.Errorf("Loader.Objects %v, Planned.Objects %v", l.Objects(), objects)
		}
		up.mu.Lock()
		defer up.mu.Unlock()
		return objects, slices.Clone(up.first)
	}
	sorted := func(s []string) []string { return slices.Sorted(slices.Values(s)) }

	t.Run("tar", func(t *testing.T) {
		cfg := packed.Config{URLs: tarURLs, Pack: spec, BatchSize: 2, Seed: 4, OpenShards: 3, ShuffleBuffer: 20, Sources: reg, Logf: t.Logf}
		objects, read := run(t, cfg)
		if len(objects) != len(tarURLs) || !slices.Equal(sorted(objects), sorted(read)) {
			t.Errorf("objects %v; the epoch read %v", objects, read)
		}
		if slices.Equal(objects, tarURLs) {
			t.Errorf("the shuffled epoch's objects are in the files' order")
		}
	})
	t.Run("in order", func(t *testing.T) {
		cfg := packed.Config{URLs: tarURLs, Pack: spec, BatchSize: 2, NoShuffle: true, Fetches: 1, Sources: reg, Logf: t.Logf}
		objects, read := run(t, cfg)
		if !slices.Equal(objects, tarURLs) || !slices.Equal(read, tarURLs) {
			t.Errorf("objects %v; the epoch read %v; want the files' order", objects, read)
		}
	})
	t.Run("megatron", func(t *testing.T) {
		s := spec
		s.Field = "tokens"
		cfg := packed.Config{URLs: []string{"mem://b/corpus.idx"}, Pack: s, BatchSize: 2, Seed: 5, OpenShards: 2, ShuffleBuffer: 64, Sources: reg, Logf: t.Logf}
		objects, read := run(t, cfg)
		if !slices.Equal(objects, []string{"mem://b/corpus.bin"}) || !slices.Equal(read, objects) {
			t.Errorf("objects %v; the epoch read %v; want the .bin once", objects, read)
		}
	})
	t.Run("resumed", func(t *testing.T) {
		cfg := packed.Config{URLs: tarURLs, Pack: spec, BatchSize: 2, Seed: 4, OpenShards: 2, ShuffleBuffer: 20, Sources: reg, Logf: t.Logf}
		_, _, st, l := epoch(t, cfg)
		all := l.Objects()
		cfg.Resume = &st[len(st)*3/4]
		objects, read := run(t, cfg)
		t.Logf("resumed at 3/4: %d objects of %d announced, %d read", len(objects), len(all), len(read))
		for _, u := range read {
			if !slices.Contains(objects, u) {
				t.Errorf("the resumed epoch read %s, which Objects (%v) leaves out", u, objects)
			}
		}
		if len(objects) >= len(all) || len(read) == 0 {
			t.Errorf("resumed at 3/4 of the epoch: %d objects of %d, %d read", len(objects), len(all), len(read))
		}
		// What it leaves out, the epoch's rows from the state on never need.
		for _, u := range all {
			if !slices.Contains(objects, u) && slices.Contains(read, u) {
				t.Errorf("%s read but not announced", u)
			}
		}
	})
	t.Run("streams", func(t *testing.T) {
		half := len(tarURLs) / 2
		cfg := packed.Config{URLs: tarURLs, Pack: spec, BatchSize: 2, Seed: 6, OpenShards: 2, ShuffleBuffer: 20, Sources: reg, Logf: t.Logf,
			Streams: []plan.Stream{{First: 0, Count: half, Weight: 1}, {First: half, Count: len(tarURLs) - half, Weight: 1}}}
		objects, read := run(t, cfg)
		if len(objects) == 0 || !slices.Equal(sorted(objects), sorted(read)) {
			t.Errorf("objects %v; the epoch read %v", objects, read)
		}
	})
}

// checkReadPlan checks the plan of l's reads: l's batches, each object of
// l.Objects twice (its first read, then its last), the first reads in the order of
// Objects, spans of no samples.
func checkReadPlan(t *testing.T, rp plan.Plan, l *packed.Loader) {
	t.Helper()
	if int64(rp.Batches) != l.Len() {
		t.Errorf("ReadPlan: %d batches, the loader yields %d", rp.Batches, l.Len())
	}
	seen := map[string]int{}
	var firsts []string
	for _, s := range rp.Spans {
		if s.Feeds != 0 || s.Take != 0 {
			t.Errorf("ReadPlan: span %+v has samples", s)
		}
		if seen[s.URL] == 0 {
			firsts = append(firsts, s.URL)
		}
		seen[s.URL]++
	}
	if !slices.Equal(firsts, l.Objects()) {
		t.Errorf("ReadPlan's first reads %v, Objects %v", firsts, l.Objects())
	}
	for u, n := range seen {
		if n != 2 {
			t.Errorf("ReadPlan reads %s %d times, want at its first read and its last", u, n)
		}
	}
	for _, r := range l.Reads() {
		if r.First > r.Last {
			t.Errorf("%s: first read at %d, after its last at %d", r.URL, r.First, r.Last)
		}
	}
}
