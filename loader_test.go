package shardload_test

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shardload/shardload"
	"github.com/shardload/shardload/decode"
	"github.com/shardload/shardload/internal/shardgen"
	"github.com/shardload/shardload/shard"
)

// dataset writes shards with uneven sample counts and returns their paths and every
// sample's fields (key -> ext -> bytes) as the shard reader sees them.
func dataset(t testing.TB, shards int, fields []shardgen.Field, comp shard.Compression) ([]string, map[string]map[string][]byte) {
	t.Helper()
	spec := shardgen.Spec{Shards: shards, Samples: []int{7, 10, 13, 16, 5}, Fields: fields, Compression: comp, Seed: 42}
	paths, err := shardgen.Generate(t.TempDir(), spec)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]map[string][]byte{}
	for _, p := range paths {
		f, err := os.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		r := shard.NewReader(f, shard.Options{URL: p})
		for {
			s, err := r.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			m := map[string][]byte{}
			for _, f := range s.Fields {
				m[f.Ext] = bytes.Clone(f.Data)
			}
			want[s.Key] = m
		}
		r.Close()
		f.Close()
	}
	return paths, want
}

// epochKeys runs one epoch and returns the keys in the order batches delivered them,
// checking each batch against the samples' bytes.
func epochKeys(t testing.TB, cfg shardload.Config, want map[string]map[string][]byte) ([]string, shardload.Stats) {
	t.Helper()
	ctx := context.Background()
	l, err := shardload.Open(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	var keys []string
	n := 0
	for b, err := range l.All(ctx) {
		if err != nil {
			t.Fatal(err)
		}
		if b.Seq != n {
			t.Fatalf("batch %d has Seq %d", n, b.Seq)
		}
		n++
		checkBatch(t, b, l.Fields(), want)
		keys = append(keys, b.Keys()...)
	}
	if p := l.Plan(); n != p.Batches {
		t.Errorf("%d batches, plan says %d", n, p.Batches)
	}
	return keys, l.Stats()
}

// checkBatch: every row of every column holds the bytes of that sample's field.
func checkBatch(t testing.TB, b *shardload.Batch, fields []decode.Field, want map[string]map[string][]byte) {
	t.Helper()
	keys := b.Keys()
	if len(keys) != b.Rows {
		t.Fatalf("%d keys for %d rows", len(keys), b.Rows)
	}
	for _, f := range fields {
		col, ok := b.Column(f.ColumnName())
		if !ok {
			t.Fatalf("no column %q", f.ColumnName())
		}
		for row, key := range keys {
			src := lookup(want, key)
			if src == nil {
				t.Fatalf("batch has unknown key %q", key)
			}
			got := col.Row(b.Data(), row)
			switch f.Kind {
			case decode.KindInt:
				var v int64
				fmt.Sscan(string(src[f.Ext]), &v)
				if ints := col.Int64s(b.Data()); ints[row] != v {
					t.Fatalf("%s row %d (%s): %d, want %d", f.Ext, row, key, ints[row], v)
				}
			case decode.KindNPY:
				npy, err := decode.ParseNPY(src[f.Ext])
				if err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(got, npy.Data) {
					t.Fatalf("%s row %d (%s): slab bytes differ from the array", f.Ext, row, key)
				}
			default:
				if !bytes.Equal(got, src[f.Ext]) {
					t.Fatalf("%s row %d (%s): %d slab bytes differ from the member's %d", f.Ext, row, key, len(got), len(src[f.Ext]))
				}
			}
		}
	}
}

func lookup(want map[string]map[string][]byte, key string) map[string][]byte { return want[key] }

func TestLoaderReadsEverySampleInOrder(t *testing.T) {
	paths, want := dataset(t, 5, nil, shard.None)
	// Counted first: with counts estimated from the shards' sizes the epoch would be
	// padded or trimmed to the planned batches.
	keys, st := epochKeys(t, shardload.Config{URLs: paths, BatchSize: 8, NoShuffle: true, CountFirst: true}, want)
	if len(keys) != len(want) {
		t.Fatalf("%d samples delivered, dataset has %d", len(keys), len(want))
	}
	if !slices.IsSorted(keys) {
		t.Errorf("unshuffled keys out of order: %v", keys[:10])
	}
	if st.Samples != int64(len(want)) || st.Skipped != 0 || st.Padded != 0 {
		t.Errorf("stats %+v", st)
	}
}

func TestLoaderDeterministic(t *testing.T) {
	paths, want := dataset(t, 9, nil, shard.Zstd)
	// Counted first (estimated counts would pad or trim the epoch), without the index
	// store.
	base := shardload.Config{URLs: paths, BatchSize: 5, Seed: 3, Epoch: 1, ShuffleBuffer: 20, OpenShards: 3, NoIndexStore: true, CountFirst: true}
	a, _ := epochKeys(t, base, want)
	if len(a) != len(want) {
		t.Fatalf("%d samples of %d", len(a), len(want))
	}
	if slices.IsSorted(a) {
		t.Error("shuffled epoch came out sorted")
	}
	for _, workers := range []int{1, 2, 3} {
		cfg := base
		cfg.Workers = workers
		if b, _ := epochKeys(t, cfg, want); !slices.Equal(a, b) {
			t.Errorf("workers=%d: a different order", workers)
		}
	}
	for _, change := range []func(*shardload.Config){
		func(c *shardload.Config) { c.Seed++ },
		func(c *shardload.Config) { c.Epoch++ },
	} {
		cfg := base
		change(&cfg)
		if b, _ := epochKeys(t, cfg, want); slices.Equal(a, b) {
			t.Errorf("seed %d epoch %d: the same order as seed 3 epoch 1", cfg.Seed, cfg.Epoch)
		}
	}
}

func TestLoaderRanks(t *testing.T) {
	paths, want := dataset(t, 7, nil, shard.None)
	infos, err := shardload.Count(context.Background(), shardload.Config{URLs: paths})
	if err != nil {
		t.Fatal(err)
	}
	for _, world := range []int{1, 2, 3, 8} {
		t.Run(fmt.Sprint("world=", world), func(t *testing.T) {
			seen := map[string]int{}
			batches := -1
			for rank := 0; rank < world; rank++ {
				keys, st := epochKeys(t, shardload.Config{Shards: infos, BatchSize: 4, Rank: rank, World: world, Seed: 9}, want)
				if batches >= 0 && int(st.Batches) != batches {
					t.Fatalf("rank %d: %d batches, rank 0: %d", rank, st.Batches, batches)
				}
				batches = int(st.Batches)
				for _, k := range keys {
					seen[k]++
				}
			}
			missing := 0
			for k := range want {
				switch seen[k] {
				case 0:
					missing++
				case 1:
				default:
					t.Errorf("%s delivered %d times", k, seen[k])
				}
			}
			if missing != len(want)%world {
				t.Errorf("%d samples missing, want the remainder %d", missing, len(want)%world)
			}
		})
	}
}

func TestLoaderFields(t *testing.T) {
	paths, want := dataset(t, 3, shardgen.Presets["tokens"], shard.Gzip)
	fields := []decode.Field{mustField(t, "tokens=npy:npy:int32:2048"), mustField(t, "label=cls:int")}
	keys, _ := epochKeys(t, shardload.Config{URLs: paths, Fields: fields, BatchSize: 6}, want)
	if len(keys) != len(want) {
		t.Errorf("%d of %d samples", len(keys), len(want))
	}
	// A fixed-shape column is [rows, 2048] int32.
	l, err := shardload.Open(context.Background(), shardload.Config{URLs: paths, Fields: fields, BatchSize: 6})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	b, err := l.Next(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	col, _ := b.Column("tokens")
	if col.Ragged || !slices.Equal(col.Shape, []int{6, 2048}) || col.DType.Name() != "int32" || col.Length != 6*2048*4 {
		t.Errorf("tokens column %+v", col)
	}
	b.Release()
}

func mustField(t testing.TB, spec string) decode.Field {
	f, err := decode.ParseField(spec)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// writeTar writes a shard of (name, data) members.
func writeTar(t testing.TB, path string, members ...[2]string) string {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, m := range members {
		tw.WriteHeader(&tar.Header{Name: m[0], Mode: 0o644, Size: int64(len(m[1])), Typeflag: tar.TypeReg})
		tw.Write([]byte(m[1]))
	}
	tw.Close()
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// badDataset: 3 shards of 10 samples; shard b has a sample without its label and one
// whose label is not a number; shard c is cut short after 4 samples.
func badDataset(t testing.TB) []string {
	dir := t.TempDir()
	var paths []string
	for _, name := range []string{"a", "b", "c"} {
		var members [][2]string
		for j := 0; j < 10; j++ {
			key := fmt.Sprintf("%s%02d", name, j)
			members = append(members, [2]string{key + ".bin", strings.Repeat(key, 10)})
			switch {
			case name == "b" && j == 3:
			case name == "b" && j == 6:
				members = append(members, [2]string{key + ".cls", "seven"})
			default:
				members = append(members, [2]string{key + ".cls", fmt.Sprint(j)})
			}
		}
		paths = append(paths, writeTar(t, filepath.Join(dir, name+".tar"), members...))
	}
	data, _ := os.ReadFile(paths[2])
	os.WriteFile(paths[2], data[:4*2048+600], 0o644) // inside the data of c04.bin
	return paths
}

func TestLoaderErrorPolicy(t *testing.T) {
	paths := badDataset(t)
	fields := []decode.Field{mustField(t, "bin"), mustField(t, "cls")}
	// The counts the shards had before one was cut: the plan expects 30 samples.
	infos := []shard.Info{{URL: paths[0], Samples: 10}, {URL: paths[1], Samples: 10}, {URL: paths[2], Samples: 10}}
	ctx := context.Background()

	t.Run("fail", func(t *testing.T) {
		l, err := shardload.Open(ctx, shardload.Config{Shards: infos, Fields: fields, BatchSize: 4, NoShuffle: true})
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		got := runToError(ctx, l)
		var se *shardload.SampleError
		if !errors.As(got, &se) || se.Key != "b03" || !errors.Is(got, shardload.ErrMissingField) || !strings.Contains(got.Error(), paths[1]) {
			t.Errorf("got %v, want a missing field in sample b03 of %s", got, paths[1])
		}
		// Three samples of 2048 bytes of tar before it; the field is the label's.
		if se != nil && (se.URL != paths[1] || se.Offset != 3*2048 || se.Field != "cls") {
			t.Errorf("SampleError %+v: want the URL, byte 6144 and field cls", *se)
		}
	})

	t.Run("skip", func(t *testing.T) {
		var mu sync.Mutex
		var logs []string
		cfg := shardload.Config{Shards: infos, Fields: fields, BatchSize: 4, NoShuffle: true, OnError: shardload.Skip, ErrorBudget: &shardload.Budget{Fraction: 0.5},
			Logf: func(f string, a ...any) { mu.Lock(); logs = append(logs, fmt.Sprintf(f, a...)); mu.Unlock() }}
		l, err := shardload.Open(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		var keys []string
		batches := 0
		for b, err := range l.All(ctx) {
			if err != nil {
				t.Fatal(err)
			}
			batches++
			keys = append(keys, b.Keys()...)
		}
		st := l.Stats()
		// 30 planned; b03, b06 and c04..c09 skipped (c is cut inside c04): 22 read,
		// padded to 30 so the rank still yields its 8 planned batches.
		if batches != 8 || st.Batches != 8 || st.Samples != 22 || st.Skipped != 8 || st.SkippedShards != 1 || st.Padded != 8 {
			t.Errorf("batches %d, stats %+v", batches, st)
		}
		for _, k := range keys[:22] {
			if k == "b03" || k == "b06" || k >= "c04" {
				t.Errorf("skipped sample %s delivered", k)
			}
		}
		if len(logs) != 3 || !strings.Contains(logs[0], "b03") || !strings.Contains(logs[1], `"b06"`) || !strings.Contains(logs[2], "truncated") {
			t.Errorf("skip log %q", logs)
		}
	})

	t.Run("budget", func(t *testing.T) {
		l, err := shardload.Open(ctx, shardload.Config{Shards: infos, Fields: fields, BatchSize: 4, OnError: shardload.Skip, ErrorBudget: &shardload.Budget{Fraction: 0.05}, Logf: func(string, ...any) {}})
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		got := runToError(ctx, l)
		if !errors.Is(got, shardload.ErrErrorBudget) {
			t.Errorf("got %v, want the error budget exceeded", got)
		}
	})
}

func TestLoaderCloseMidEpoch(t *testing.T) {
	paths, _ := dataset(t, 6, nil, shard.None)
	before := runtime.NumGoroutine()
	for i := 0; i < 3; i++ {
		l, err := shardload.Open(context.Background(), shardload.Config{URLs: paths, BatchSize: 2, Slabs: 2})
		if err != nil {
			t.Fatal(err)
		}
		b, err := l.Next(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		// Close with a batch unreleased and the pipeline blocked on the full ring.
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		b.Release()
		if _, err := l.Next(context.Background()); !errors.Is(err, shardload.ErrClosed) {
			t.Errorf("Next after Close: %v", err)
		}
		if err := l.Close(); err != nil {
			t.Errorf("second Close: %v", err)
		}
	}
	// Every goroutine the loaders started has ended (polled: the runtime needs a moment
	// to retire them after Close returned).
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > before && time.Now().Before(deadline) {
		runtime.Gosched()
	}
	if n := runtime.NumGoroutine(); n > before {
		t.Errorf("%d goroutines after Close, %d before", n, before)
	}
}

// A sample whose array has the wrong shape for a fixed-shape column follows the
// error policy like any bad sample.
func TestLoaderWrongShape(t *testing.T) {
	paths, _ := dataset(t, 2, shardgen.Presets["tokens"], shard.None) // 2048 tokens each
	wrong := []decode.Field{mustField(t, "tokens=npy:npy:int32:1024")}
	ctx := context.Background()
	l, err := shardload.Open(ctx, shardload.Config{URLs: paths, Fields: wrong, BatchSize: 4})
	if err != nil {
		t.Fatal(err)
	}
	got := runToError(ctx, l)
	l.Close()
	var se *shardload.SampleError
	if !errors.Is(got, decode.ErrWrongShape) || !errors.As(got, &se) || se.Key == "" {
		t.Errorf("got %v, want a wrong-shape error naming the sample", got)
	}

	// Skipping every sample is over any budget short of 100%.
	l, err = shardload.Open(ctx, shardload.Config{URLs: paths, Fields: wrong, BatchSize: 4, OnError: shardload.Skip, Logf: func(string, ...any) {}})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	got = runToError(ctx, l)
	if !errors.Is(got, shardload.ErrErrorBudget) || !strings.Contains(got.Error(), "wrong shape") {
		t.Errorf("skip: got %v", got)
	}
}

// runToError reads the rest of the epoch and returns the error it ended with (nil at
// a clean end).
func runToError(ctx context.Context, l *shardload.Loader) error {
	var last error
	for _, err := range l.All(ctx) {
		last = err
	}
	return last
}

// Fields that decode in place (raw bytes) stay in the sample's own buffer; fields
// decoded elsewhere (a gunzipped member, a label) are appended to it, moving it to
// a bigger buffer when the inflated bytes do not fit. Every row must hold its
// sample's bytes, whatever the order of the fields and however much a member
// inflates.
func TestLoaderFieldsInPlaceAndDecoded(t *testing.T) {
	dir := t.TempDir()
	type sample struct{ raw, text []byte }
	want := map[string]sample{}
	var paths []string
	for s := 0; s < 3; s++ {
		var members [][2]string
		for j := 0; j < 12; j++ {
			key := fmt.Sprintf("s%d-%02d", s, j)
			raw := bytes.Repeat([]byte(key), 40+j)
			// From 20 bytes to about 200 KB of text: far more than a raw member.
			text := bytes.Repeat([]byte("the quick brown fox "), 1+j*j*80)
			var gz bytes.Buffer
			zw := gzip.NewWriter(&gz)
			zw.Write(text)
			zw.Close()
			members = append(members, [2]string{key + ".bin", string(raw)}, [2]string{key + ".txt.gz", gz.String()}, [2]string{key + ".cls", fmt.Sprint(j)})
			want[key] = sample{raw, text}
		}
		paths = append(paths, writeTar(t, filepath.Join(dir, fmt.Sprintf("%d.tar", s)), members...))
	}
	for _, order := range [][]string{{"bin", "caption=txt.gz:text", "label=cls:int"}, {"caption=txt.gz:text", "label=cls:int", "bin"}} {
		t.Run(strings.Join(order, ","), func(t *testing.T) {
			var fields []decode.Field
			for _, spec := range order {
				fields = append(fields, mustField(t, spec))
			}
			ctx := context.Background()
			l, err := shardload.Open(ctx, shardload.Config{URLs: paths, Fields: fields, BatchSize: 5, Workers: 2})
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			seen := 0
			for b, err := range l.All(ctx) {
				if err != nil {
					t.Fatal(err)
				}
				raw, _ := b.Column("bin")
				text, _ := b.Column("caption")
				label, _ := b.Column("label")
				for row, key := range b.Keys() {
					w, ok := want[key]
					if !ok {
						t.Fatalf("unknown key %q", key)
					}
					if got := raw.Row(b.Data(), row); !bytes.Equal(got, w.raw) {
						t.Fatalf("%s: bin has %d bytes that differ from the member's %d", key, len(got), len(w.raw))
					}
					if got := text.Row(b.Data(), row); !bytes.Equal(got, w.text) {
						t.Fatalf("%s: caption has %d bytes that differ from the inflated %d", key, len(got), len(w.text))
					}
					var j int64
					fmt.Sscanf(key[len(key)-2:], "%d", &j)
					if got := label.Int64s(b.Data())[row]; got != j {
						t.Fatalf("%s: label %d, want %d", key, got, j)
					}
					seen++
				}
			}
			if seen != len(want) {
				t.Errorf("%d of %d samples", seen, len(want))
			}
		})
	}
}

// TestSkipDeterministic: under the Skip policy the batches, the padding and the log
// lines are the same whatever the number of workers: skips are taken in the order's
// order, not as the producers' timing has them.
func TestSkipDeterministic(t *testing.T) {
	paths := badDataset(t)
	fields := []decode.Field{mustField(t, "bin"), mustField(t, "cls")}
	infos := []shard.Info{{URL: paths[0], Samples: 10}, {URL: paths[1], Samples: 10}, {URL: paths[2], Samples: 10}}
	run := func(workers int) ([]string, []string) {
		var logs []string
		var mu sync.Mutex
		cfg := shardload.Config{Shards: infos, Fields: fields, BatchSize: 4, Seed: 4, Workers: workers, OpenShards: 3, ShuffleBuffer: 24,
			OnError: shardload.Skip, ErrorBudget: &shardload.Budget{Fraction: 0.5},
			Logf: func(f string, a ...any) { mu.Lock(); logs = append(logs, fmt.Sprintf(f, a...)); mu.Unlock() }}
		l, err := shardload.Open(context.Background(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		var keys []string
		var prev []string
		for b, err := range l.All(context.Background()) {
			if err != nil {
				t.Fatal(err)
			}
			k := b.Keys()
			// The padding rows are the last: the others are distinct samples, and the
			// pads repeat samples of this batch or the one before.
			real, pads := k[:b.Rows-b.Padded], k[b.Rows-b.Padded:]
			if len(slices.Compact(slices.Sorted(slices.Values(real)))) != len(real) {
				t.Fatalf("batch %d: samples %v repeat", b.Seq, real)
			}
			for _, p := range pads {
				if !slices.Contains(real, p) && !slices.Contains(prev, p) {
					t.Fatalf("batch %d: padding row %s is no sample of it or of the batch before (%v, %v)", b.Seq, p, real, prev)
				}
			}
			prev = real
			keys = append(keys, fmt.Sprintf("%d:%v", b.Padded, k))
		}
		return keys, logs
	}
	keys, logs := run(1)
	if len(logs) == 0 {
		t.Fatal("no skips logged")
	}
	for _, workers := range []int{2, 3} {
		for range 3 {
			k, lg := run(workers)
			if !slices.Equal(k, keys) || !slices.Equal(lg, logs) {
				t.Fatalf("workers %d: batches %v, logs %q; workers 1: %v, %q", workers, k, lg, keys, logs)
			}
		}
	}
}
