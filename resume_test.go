package shardload_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"sync"
	"testing"

	"github.com/shardload/shardload"
	"github.com/shardload/shardload/decode"
	"github.com/shardload/shardload/internal/shardgen"
	"github.com/shardload/shardload/shard"
	"github.com/shardload/shardload/source"
)

// readLog is a file source that records the bytes each read returns: which parts of
// which shards a loader read.
type readLog struct {
	source.File
	mu    sync.Mutex
	reads map[string][][2]int64 // url -> [from, to) byte ranges read
}

func (l *readLog) log(url string, off int64, rc io.ReadCloser, err error) (io.ReadCloser, error) {
	if err != nil {
		return nil, err
	}
	return &loggedReader{ReadCloser: rc, l: l, url: url, at: off}, nil
}

func (l *readLog) Open(ctx context.Context, url string) (io.ReadCloser, error) {
	rc, err := l.File.Open(ctx, url)
	return l.log(url, 0, rc, err)
}

func (l *readLog) OpenRange(ctx context.Context, url string, off, length int64) (io.ReadCloser, error) {
	rc, err := l.File.OpenRange(ctx, url, off, length)
	return l.log(url, off, rc, err)
}

func (l *readLog) OpenVersion(ctx context.Context, url, version string, off, length int64) (io.ReadCloser, error) {
	rc, err := l.File.OpenVersion(ctx, url, version, off, length)
	return l.log(url, off, rc, err)
}

func (l *readLog) reset() {
	l.mu.Lock()
	l.reads = map[string][][2]int64{}
	l.mu.Unlock()
}

type loggedReader struct {
	io.ReadCloser
	l   *readLog
	url string
	at  int64
}

func (r *loggedReader) Read(p []byte) (int, error) {
	n, err := r.ReadCloser.Read(p)
	if n > 0 {
		r.l.mu.Lock()
		r.l.reads[r.url] = append(r.l.reads[r.url], [2]int64{r.at, r.at + int64(n)})
		r.l.mu.Unlock()
		r.at += int64(n)
	}
	return n, err
}

// where maps a sample's key to its shard and byte range.
type where struct {
	url      string
	from, to int64
}

// resumeDataset writes shards of uneven counts, indexes them and returns their
// entries (with offsets) and where each key's bytes are.
func resumeDataset(t *testing.T, n int, comp shard.Compression) ([]shard.Info, map[string]where) {
	t.Helper()
	paths, err := shardgen.Generate(t.TempDir(), shardgen.Spec{Shards: n, Samples: []int{23, 40, 7, 31, 52, 12}, Compression: comp, Seed: 11,
		Fields: []shardgen.Field{{Ext: "bin", Kind: shardgen.Random, MinBytes: 100, MaxBytes: 3000}, {Ext: "cls", Kind: shardgen.Class}}})
	if err != nil {
		t.Fatal(err)
	}
	infos, err := shardload.Count(context.Background(), shardload.Config{URLs: paths, NoIndexStore: true})
	if err != nil {
		t.Fatal(err)
	}
	keys := map[string]where{}
	for _, info := range infos {
		f, err := os.Open(info.URL)
		if err != nil {
			t.Fatal(err)
		}
		r := shard.NewReader(f, shard.Options{URL: info.URL})
		var last string
		for {
			s, err := r.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			if last != "" {
				w := keys[last]
				w.to = s.Offset
				keys[last] = w
			}
			keys[s.Key] = where{url: info.URL, from: s.Offset, to: info.Size}
			last = s.Key
		}
		r.Close()
		f.Close()
	}
	return infos, keys
}

// run reads a rank's epoch from cfg and returns its batches' keys, the state after
// each batch (states[k] is the state after k batches) and the first batch's Seq.
func run(t *testing.T, cfg shardload.Config) (batches [][]string, states []shardload.State, first int) {
	t.Helper()
	ctx := context.Background()
	l, err := shardload.Open(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	states = append(states, l.State())
	first = -1
	for b, err := range l.All(ctx) {
		if err != nil {
			t.Fatal(err)
		}
		if first < 0 {
			first = b.Seq
		}
		if want := states[len(states)-1].Batches; b.Seq != want {
			t.Fatalf("batch Seq %d after a state of %d batches", b.Seq, want)
		}
		batches = append(batches, b.Keys())
		states = append(states, l.State())
	}
	if len(batches) != l.Plan().Batches {
		t.Fatalf("%d batches, plan %d", len(batches), l.Plan().Batches)
	}
	return batches, states, first
}

// TestResumeAtEveryBatch: a rank resumed from the state after any of its batches
// yields exactly the batches the uninterrupted epoch yields after it, for several
// worker counts and world sizes, and reads none of the samples consumed before
// (with sample offsets: no byte of them; without, compressed shards are read from
// their starts and that is all).
func TestResumeAtEveryBatch(t *testing.T) {
	infos, keys := resumeDataset(t, 9, shard.None)
	log := &readLog{}
	var reg source.Registry
	reg.Register("file", log)
	for _, world := range []int{1, 3} {
		for _, workers := range []int{1, 2, 4} {
			for rank := range world {
				base := shardload.Config{Shards: infos, BatchSize: 7, Seed: 5, Epoch: 2, Rank: rank, World: world, Workers: workers,
					ShuffleBuffer: 60, OpenShards: 4, ReadGap: -1, Sources: &reg, NoLock: true, Slabs: 2, SlabBytes: 1 << 20,
					Fields: []decode.Field{{Ext: "bin"}, {Ext: "cls", Kind: decode.KindInt}}} // inferring them reads a first sample
				log.reset()
				full, states, _ := run(t, base)
				for k := range len(full) + 1 {
					cfg := base
					cfg.Epoch = 0
					cfg.Resume = &states[k]
					log.reset()
					got, gotStates, first := run(t, cfg)
					what := fmt.Sprintf("world %d rank %d workers %d, resumed after %d of %d batches (state %+v)", world, rank, workers, k, len(full), states[k])
					if len(got) != len(full)-k || (len(got) > 0 && first != k) {
						t.Fatalf("%s: %d batches from Seq %d, want %d from %d", what, len(got), first, len(full)-k, k)
					}
					for i := range got {
						if !slices.Equal(got[i], full[k+i]) {
							t.Fatalf("%s: batch %d is %v, want %v", what, k+i, got[i], full[k+i])
						}
					}
					// The resumed rank's states are the uninterrupted rank's.
					for i, st := range gotStates {
						if st != states[k+i] {
							t.Fatalf("%s: state after %d batches %+v, uninterrupted %+v", what, k+i, st, states[k+i])
						}
					}
					// No byte of a consumed sample was read.
					for _, b := range full[:k] {
						for _, key := range b {
							w := keys[key]
							for _, r := range log.reads[w.url] {
								if r[0] < w.to && w.from < r[1] {
									t.Fatalf("%s: read bytes [%d, %d) of %s, which hold consumed sample %s [%d, %d)", what, r[0], r[1], w.url, key, w.from, w.to)
								}
							}
						}
					}
				}
			}
		}
	}
}

// TestResumeCompressed: without offsets (zstd shards) a resumed rank yields the same
// batches, reading shards from their starts.
func TestResumeCompressed(t *testing.T) {
	infos, _ := resumeDataset(t, 5, shard.Zstd)
	for _, world := range []int{1, 3} {
		base := shardload.Config{Shards: infos, BatchSize: 5, Seed: 1, World: world, Rank: world - 1, ShuffleBuffer: 40, NoLock: true, Slabs: 2, SlabBytes: 1 << 20}
		full, states, _ := run(t, base)
		for _, k := range []int{1, len(full) / 2, len(full) - 1} {
			cfg := base
			cfg.Resume = &states[k]
			got, _, _ := run(t, cfg)
			if !slices.EqualFunc(got, full[k:], slices.Equal) {
				t.Fatalf("world %d, resumed after %d batches: %v, want %v", world, k, got, full[k:])
			}
		}
	}
}

// TestResumeElastic: states saved by every rank of a job of 2 or 4 ranks (the same
// state on each) restored in jobs of 1, 2, 3, 4 and 8 ranks: what the old job
// consumed and what the new ranks read together are the epoch, each sample once,
// but for the fewer than World samples the new job leaves to no rank; and the new
// ranks yield equal numbers of batches.
func TestResumeElastic(t *testing.T) {
	infos, keys := resumeDataset(t, 8, shard.None)
	for _, old := range []int{2, 4} {
		for _, cut := range []int{1, 3} {
			consumed := map[string]int{}
			var state shardload.State
			for rank := range old {
				cfg := shardload.Config{Shards: infos, BatchSize: 6, Seed: 8, World: old, Rank: rank, ShuffleBuffer: 50, NoLock: true, Slabs: 2, SlabBytes: 1 << 20}
				full, states, _ := run(t, cfg)
				if rank > 0 && states[cut] != state {
					t.Fatalf("world %d: rank %d's state %+v differs from rank 0's %+v", old, rank, states[cut], state)
				}
				state = states[cut]
				for _, b := range full[:cut] {
					for _, k := range b {
						consumed[k]++
					}
				}
			}
			for _, world := range []int{1, 2, 3, 4, 8} {
				seen := maps(consumed)
				batches := -1
				var dropped int
				for rank := range world {
					cfg := shardload.Config{Shards: infos, BatchSize: 5, Seed: 8, World: world, Rank: rank, ShuffleBuffer: 50, Resume: &state,
						NoLock: true, Slabs: 2, SlabBytes: 1 << 20}
					l, err := shardload.Open(context.Background(), cfg)
					if err != nil {
						t.Fatal(err)
					}
					dropped = l.Plan().Dropped
					n := 0
					for b, err := range l.All(context.Background()) {
						if err != nil {
							t.Fatal(err)
						}
						n++
						for _, k := range b.Keys() {
							seen[k]++
						}
					}
					l.Close()
					if batches >= 0 && n != batches {
						t.Fatalf("%d -> %d ranks: rank %d yields %d batches, rank 0 %d", old, world, rank, n, batches)
					}
					batches = n
				}
				missing := 0
				for k := range keys {
					switch seen[k] {
					case 0:
						missing++
					case 1:
					default:
						t.Fatalf("%d ranks cut after %d batches -> %d ranks: %s read %d times", old, cut, world, k, seen[k])
					}
				}
				if missing != dropped || missing >= world {
					t.Fatalf("%d ranks cut after %d batches -> %d ranks: %d samples never read, %d dropped", old, cut, world, missing, dropped)
				}
			}
		}
	}
}

func maps(m map[string]int) map[string]int {
	out := make(map[string]int, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// TestResumeRefusesOtherOrders: a state resumes only the order it was saved under.
func TestResumeRefusesOtherOrders(t *testing.T) {
	infos, _ := resumeDataset(t, 4, shard.None)
	base := shardload.Config{Shards: infos, BatchSize: 4, Seed: 3, NoLock: true, Slabs: 2, SlabBytes: 1 << 20}
	_, states, _ := run(t, base)
	st := states[2]
	for name, change := range map[string]func(*shardload.Config){
		"seed":          func(c *shardload.Config) { c.Seed++ },
		"open shards":   func(c *shardload.Config) { c.OpenShards = 2 },
		"window":        func(c *shardload.Config) { c.ShuffleBuffer = 10 },
		"dataset":       func(c *shardload.Config) { c.Shards = c.Shards[1:] },
		"epoch":         func(c *shardload.Config) { c.Epoch = 5 },
		"runs":          func(c *shardload.Config) { s := st; s.Runs = "1x999999"; c.Resume = &s },
		"runs (syntax)": func(c *shardload.Config) { s := st; s.Runs = "2y3"; c.Resume = &s },
	} {
		cfg := base
		cfg.Resume = &st
		change(&cfg)
		if l, err := shardload.Open(context.Background(), cfg); !errors.Is(err, shardload.ErrResume) {
			if l != nil {
				l.Close()
			}
			t.Errorf("%s: Open = %v, want ErrResume", name, err)
		}
	}
	// The start of the next epoch needs no order.
	next := states[len(states)-1].NextEpoch()
	cfg := base
	cfg.Resume = &shardload.State{Epoch: next.Epoch}
	a, _, _ := run(t, cfg)
	cfg.Resume, cfg.Epoch = nil, next.Epoch
	b, _, _ := run(t, cfg)
	if !slices.EqualFunc(a, b, slices.Equal) {
		t.Error("the start state of epoch 1 reads another epoch than Epoch 1")
	}
}
