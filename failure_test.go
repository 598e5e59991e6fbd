package shardload_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shardload/shardload"
	"github.com/shardload/shardload/decode"
	"github.com/shardload/shardload/index"
	"github.com/shardload/shardload/shard"
	"github.com/shardload/shardload/source"
)

// faultySource is a file source that fails, or changes bytes, where a test says.
type faultySource struct {
	source.File
	mu      sync.Mutex
	url     string         // the shard the faults are in
	failAll bool           // every open of url fails
	failAt  bool           // every open of url at an offset above 0 fails (a seek)
	cutAt   int64          // reads of url fail at this byte (0: never)
	patch   map[int64]byte // bytes of url replaced, by offset
}

var errInjected = errors.New("injected failure")

func (f *faultySource) wrap(url string, off int64, rc io.ReadCloser, err error) (io.ReadCloser, error) {
	if err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if url != f.url {
		return rc, nil
	}
	if f.failAll || f.failAt && off > 0 {
		rc.Close()
		return nil, &source.Error{Op: "open", URL: url, Err: fmt.Errorf("%w at byte %d", errInjected, off)}
	}
	return &faultyReader{ReadCloser: rc, at: off, cut: f.cutAt, patch: f.patch}, nil
}

func (f *faultySource) Open(ctx context.Context, url string) (io.ReadCloser, error) {
	rc, err := f.File.Open(ctx, url)
	return f.wrap(url, 0, rc, err)
}

func (f *faultySource) OpenRange(ctx context.Context, url string, off, length int64) (io.ReadCloser, error) {
	rc, err := f.File.OpenRange(ctx, url, off, length)
	return f.wrap(url, off, rc, err)
}

func (f *faultySource) OpenVersion(ctx context.Context, url, version string, off, length int64) (io.ReadCloser, error) {
	rc, err := f.File.OpenVersion(ctx, url, version, off, length)
	return f.wrap(url, off, rc, err)
}

type faultyReader struct {
	io.ReadCloser
	at, cut int64
	patch   map[int64]byte
}

func (r *faultyReader) Read(p []byte) (int, error) {
	if r.cut > 0 && r.at+int64(len(p)) > r.cut {
		p = p[:max(r.cut-r.at, 0)]
		if len(p) == 0 {
			return 0, &source.Error{Op: "read", Err: fmt.Errorf("%w at byte %d", errInjected, r.at)}
		}
	}
	n, err := r.ReadCloser.Read(p)
	for i := range n {
		if b, ok := r.patch[r.at+int64(i)]; ok {
			p[i] = b
		}
	}
	r.at += int64(n)
	return n, err
}

// failureDataset writes 8 shards of 60 samples (a bin member of 300 bytes, a cls
// label); sample big of shard bigShard, when set, has a bin of 3 MiB.
func failureDataset(t *testing.T, dir string, bigShard string, big int) []string {
	t.Helper()
	var paths []string
	for i := range 8 {
		var members [][2]string
		name := fmt.Sprintf("f-%02d.tar", i)
		for j := range 60 {
			key := fmt.Sprintf("s%02d-%03d", i, j)
			bin := strings.Repeat(string(rune('a'+j%26)), 300)
			if name == bigShard && j == big {
				bin = strings.Repeat("B", 3<<20)
			}
			members = append(members, [2]string{key + ".bin", bin}, [2]string{key + ".cls", fmt.Sprint(j)})
		}
		paths = append(paths, writeTar(t, filepath.Join(dir, name), members...))
	}
	return paths
}

// TestFailuresReachTheTrainer injects a failure at every stage a sample goes through
// (the shard's open, the seek to a rank's first sample, a read, the tar's parse, a
// field's decode, the batch's collation) into the first sample of a rank whose part
// of the epoch starts inside a shard, and into a sample at a span's start: each time
// the rank's Next returns an error within seconds (not a hang), naming the shard and,
// where there is one, the sample.
func TestFailuresReachTheTrainer(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	paths := failureDataset(t, dir, "", 0)
	fields := []decode.Field{mustField(t, "bin"), mustField(t, "cls")}
	base := shardload.Config{URLs: paths, World: 2, BatchSize: 16, Seed: 7, Fields: fields, NoLock: true, Slabs: 2, SlabBytes: 1 << 20,
		NoIndexStore: true, CountFirst: true, Logf: func(string, ...any) {}}
	infos, err := shardload.Count(ctx, base)
	if err != nil {
		t.Fatal(err)
	}
	type target struct {
		name string
		rank int
		url  string
		idx  int // the sample
	}
	var targets []target
	for rank := range 2 {
		cfg := base
		cfg.Rank, cfg.Shards = rank, infos
		plan, err := shardload.PlanOf(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		if rank == 1 {
			sp := plan.Spans[0]
			if sp.Skip == 0 {
				t.Fatalf("rank 1's first span %+v starts at its shard's start: the test wants a part that starts inside a shard", sp)
			}
			targets = append(targets, target{"mid-shard", 1, sp.URL, sp.Skip})
			continue
		}
		for _, sp := range plan.Spans[1:] {
			if sp.Skip == 0 {
				targets = append(targets, target{"shard-start", 0, sp.URL, 0})
				break
			}
		}
	}
	offsetOf := func(url string, idx int) (sample int64, cls int64) {
		for _, in := range infos {
			if in.URL != url {
				continue
			}
			f, err := os.Open(url)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			r := shard.NewReader(f, shard.Options{URL: url, SizesOnly: true})
			for i := 0; ; i++ {
				s, err := r.Next()
				if err != nil {
					t.Fatal(err)
				}
				if i == idx {
					return s.Offset, s.Fields[1].Offset
				}
			}
		}
		t.Fatalf("no shard %s", url)
		return 0, 0
	}
	for _, tg := range targets {
		sampleOff, clsOff := offsetOf(tg.url, tg.idx)
		key := fmt.Sprintf("s%s-%03d", strings.TrimSuffix(strings.TrimPrefix(filepath.Base(tg.url), "f-"), ".tar"), tg.idx)
		for _, stage := range []string{"open", "seek", "read", "parse", "decode", "collate"} {
			if stage == "seek" && tg.idx == 0 {
				continue // a span at a shard's start does not seek
			}
			t.Run(tg.name+"/"+stage, func(t *testing.T) {
				src := &faultySource{url: tg.url}
				if stage == "collate" {
					src.url = "" // no fault in the source: a sample too big for the slab
				}
				want := []string{tg.url}
				cfg := base
				cfg.Rank, cfg.Shards = tg.rank, infos
				switch stage {
				case "open":
					src.failAll = true
				case "seek":
					src.failAt = true
				case "read":
					src.cutAt = sampleOff + 700
					want = append(want, "injected failure")
				case "parse":
					src.patch = map[int64]byte{sampleOff + 150: 'Z'} // in the header's checksum field
					want = append(want, fmt.Sprint(sampleOff))
				case "decode":
					src.patch = map[int64]byte{clsOff: 'x'}
					want = append(want, key)
				case "collate":
					d := t.TempDir()
					big := failureDataset(t, d, filepath.Base(tg.url), tg.idx)
					cfg.URLs, cfg.Shards, cfg.MaxSlabBytes = big, nil, 2<<20
					cfg.Shards, err = shardload.Count(ctx, cfg)
					if err != nil {
						t.Fatal(err)
					}
					want = []string{"batch", "bytes"}
				}
				var reg source.Registry
				reg.Register("file", src)
				cfg.Sources = &reg
				tctx, cancel := context.WithTimeout(ctx, 20*time.Second)
				defer cancel()
				l, err := shardload.Open(tctx, cfg)
				if err == nil {
					defer l.Close()
					err = runToError(tctx, l)
				}
				if err == nil || errors.Is(err, context.DeadlineExceeded) {
					t.Fatalf("rank %d read its epoch with a failure at %s of %s sample %d: %v", tg.rank, stage, tg.url, tg.idx, err)
				}
				for _, w := range want {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("the error does not say %q: %v", w, err)
					}
				}
			})
		}
	}
}

// TestHostileIndexes: indexes that lie about the shards (offsets past a shard's end,
// into a member's data or at a sample's second member, counts above the real ones,
// counts a shard's size cannot hold) end every rank within seconds, with an error or
// with exactly its share of the real samples: no hang, no sample twice.
func TestHostileIndexes(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	var paths []string
	for i := range 16 {
		var members [][2]string
		for j := range 150 {
			key := fmt.Sprintf("h%02d-%03d", i, j)
			members = append(members, [2]string{key + ".bin", strings.Repeat("x", 700+j)}, [2]string{key + ".cls", fmt.Sprint(j)})
		}
		paths = append(paths, writeTar(t, filepath.Join(dir, fmt.Sprintf("h-%02d.tar", i)), members...))
	}
	fields := []decode.Field{mustField(t, "bin"), mustField(t, "cls")}
	infos, err := shardload.Count(ctx, shardload.Config{URLs: paths, NoIndexStore: true})
	if err != nil {
		t.Fatal(err)
	}
	shift := func(d func(in shard.Info) int64) func(shard.Info) shard.Info {
		return func(in shard.Info) shard.Info {
			offs := make([]int64, len(in.Offsets))
			for i, o := range in.Offsets {
				offs[i] = o + d(in)
			}
			in.Offsets = offs
			return in
		}
	}
	for _, tt := range []struct {
		name   string
		change func(shard.Info) shard.Info
	}{
		{"offsets past the end", shift(func(in shard.Info) int64 { return in.Size })},
		{"offsets at the second member", shift(func(shard.Info) int64 { return 1024 + 512 })},
		{"offsets into member data", shift(func(shard.Info) int64 { return 1024 })},
		{"counts above", func(in shard.Info) shard.Info { in.Samples, in.Offsets, in.Version = 160, nil, ""; return in }},
		{"counts above with a version", func(in shard.Info) shard.Info { in.Samples, in.Offsets = 160, nil; return in }},
		{"a billion samples", func(in shard.Info) shard.Info { in.Samples, in.Offsets, in.Version = 1_000_000_000, nil, ""; return in }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var bad []shard.Info
			for _, in := range infos {
				bad = append(bad, tt.change(in))
			}
			idx := filepath.Join(t.TempDir(), "shardload.index")
			f, err := os.Create(idx)
			if err != nil {
				t.Fatal(err)
			}
			if err := index.Write(f, bad, false); err != nil {
				t.Fatal(err)
			}
			f.Close()
			seen := map[string]int{}
			for rank := range 2 {
				tctx, cancel := context.WithTimeout(ctx, 40*time.Second)
				cfg := shardload.Config{URLs: paths, Index: idx, World: 2, Rank: rank, BatchSize: 32, Seed: 3, OpenShards: 4, Fields: fields,
					NoLock: true, Slabs: 2, SlabBytes: 1 << 20, NoIndexStore: true, Logf: func(string, ...any) {}}
				l, err := shardload.Open(tctx, cfg)
				var keys []string
				if err == nil {
					for b, e := range l.All(tctx) {
						if e != nil {
							err = e
							break
						}
						keys = append(keys, b.Keys()...)
					}
					l.Close()
				}
				cancel()
				if errors.Is(err, context.DeadlineExceeded) {
					t.Fatalf("rank %d hung (%d samples delivered)", rank, len(keys))
				}
				if err == nil && len(keys) != len(infos)*150/2 {
					t.Errorf("rank %d delivered %d samples without an error; its share is %d", rank, len(keys), len(infos)*150/2)
				}
				for _, k := range keys {
					if seen[k]++; seen[k] > 1 {
						t.Fatalf("rank %d delivered %s twice", rank, k)
					}
				}
				t.Logf("rank %d: %d samples, %v", rank, len(keys), err)
			}
		})
	}
}
