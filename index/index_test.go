package index_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shardload/shardload/index"
	"github.com/shardload/shardload/internal/shardgen"
	"github.com/shardload/shardload/shard"
	"github.com/shardload/shardload/source"
)

// countingFile serves files and counts the opens of each URL.
type countingFile struct {
	source.File
	mu    sync.Mutex
	opens map[string]int
	stats int
}

func (c *countingFile) Open(ctx context.Context, url string) (io.ReadCloser, error) {
	c.mu.Lock()
	c.opens[url]++
	c.mu.Unlock()
	return c.File.Open(ctx, strings.TrimPrefix(url, "remote://"))
}

func (c *countingFile) Stat(ctx context.Context, url string) (source.Info, error) {
	c.mu.Lock()
	c.stats++
	c.mu.Unlock()
	info, err := c.File.Stat(ctx, strings.TrimPrefix(url, "remote://"))
	info.URL = url
	return info, err
}

// List lists nothing, so that versions come from Stat, as over HTTP.
func (c *countingFile) List(context.Context, string, func(source.Info) error) error {
	return source.ErrNotLister
}

func (c *countingFile) shardOpens() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for u, k := range c.opens {
		if strings.HasSuffix(u, ".tar") {
			n += k
		}
	}
	return n
}

func registry() (*source.Registry, *countingFile) {
	c := &countingFile{opens: map[string]int{}}
	reg := &source.Registry{}
	reg.Register("file", c)
	return reg, c
}

// truth returns each sample's offset as the shard reader reports it.
func truth(t *testing.T, path string) []int64 {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	r := shard.NewReader(f, shard.Options{URL: path})
	var offs []int64
	for {
		s, err := r.Next()
		if err == io.EOF {
			return offs
		}
		if err != nil {
			t.Fatal(err)
		}
		offs = append(offs, s.Offset)
	}
}

func gen(t *testing.T, dir string, shards int, comp shard.Compression) []string {
	t.Helper()
	paths, err := shardgen.Generate(dir, shardgen.Spec{Shards: shards, Samples: []int{7, 30, 1, 12}, Compression: comp, Seed: 9})
	if err != nil {
		t.Fatal(err)
	}
	return paths
}

// Scan's offsets are the reader's; a compressed shard gets a count and no offsets.
func TestScan(t *testing.T) {
	ctx := context.Background()
	reg, _ := registry()
	for _, comp := range []shard.Compression{shard.None, shard.Zstd} {
		paths := gen(t, t.TempDir(), 4, comp)
		for _, p := range paths {
			info, err := index.Scan(ctx, reg, p, "v1", 123, shard.Options{})
			if err != nil {
				t.Fatal(err)
			}
			want := truth(t, p)
			if info.Samples != len(want) || info.Version != "v1" || info.Size != 123 {
				t.Fatalf("%s: %+v, want %d samples", p, info, len(want))
			}
			if comp == shard.None && !reflect.DeepEqual(info.Offsets, want) {
				t.Errorf("%s: offsets %v, want %v", p, info.Offsets, want)
			}
			if comp != shard.None && info.Offsets != nil {
				t.Errorf("%s (%s): offsets of a compressed shard", p, comp)
			}
		}
	}
}

// What Write writes, Read reads back, compressed or not, with secrets gone from URLs.
func TestRoundTrip(t *testing.T) {
	infos := []shard.Info{
		{URL: "s3://b/train-0.tar", Samples: 3, Version: `"etag"`, Size: 4096, Offsets: []int64{0, 1536, 3072}},
		{URL: "https://user:pw@h/x.tar?X-Amz-Signature=secret&a=1", Samples: 2, Version: "g1", Size: 10},
		{URL: "/data/empty.tar", Samples: 0, Version: "0-1"},
	}
	for _, compress := range []bool{false, true} {
		var buf bytes.Buffer
		if err := index.Write(&buf, infos, compress); err != nil {
			t.Fatal(err)
		}
		if strings.Contains(buf.String(), "secret") || strings.Contains(buf.String(), "pw@") {
			t.Fatalf("a secret was written: %s", buf.String())
		}
		got, err := index.Read(&buf, "x")
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != len(infos) {
			t.Fatalf("%d entries", len(got))
		}
		for i := range infos {
			want := infos[i]
			want.URL = source.Redact(want.URL)
			if !reflect.DeepEqual(got[i], want) {
				t.Errorf("compress %v: entry %d = %+v, want %+v", compress, i, got[i], want)
			}
		}
	}
}

// Read takes the lines "ls --summary --json" prints, and refuses what would plan a
// wrong epoch: offsets off the tar blocks, fewer or more than the samples, not
// increasing, a newer format.
func TestReadChecks(t *testing.T) {
	got, err := index.Read(strings.NewReader(`{"url":"a.tar","samples":5,"extensions":["cls"]}`+"\n\n"+`{"url":"b.tar","samples":0}`), "ls")
	if err != nil || len(got) != 2 || got[0].Samples != 5 || got[0].Offsets != nil {
		t.Fatalf("ls lines: %+v, %v", got, err)
	}
	enc := func(offs ...int64) string {
		var buf bytes.Buffer
		index.Write(&buf, []shard.Info{{URL: "a", Samples: len(offs), Offsets: offs}}, false)
		return buf.String()
	}
	good := enc(0, 512, 2048)
	if _, err := index.Read(strings.NewReader(good), "good"); err != nil {
		t.Fatal(err)
	}
	for name, text := range map[string]string{
		"unaligned":    enc(0, 100),
		"not after":    enc(512, 512),
		"more offsets": strings.Replace(good, `"samples":3`, `"samples":2`, 1),
		"fewer":        strings.Replace(good, `"samples":3`, `"samples":4`, 1),
		"version":      strings.Replace(good, `"version":1`, `"version":3`, 1),
		"no samples":   `{"url":"a"}`,
		"negative":     `{"url":"a","samples":-1}`,
		"not json":     `url a`,
	} {
		if _, err := index.Read(strings.NewReader(text), name); err == nil {
			t.Errorf("%s: accepted %q", name, text)
		} else if !strings.Contains(err.Error(), name) {
			t.Errorf("%s: the error does not say where: %v", name, err)
		}
	}
}

// The first Resolve reads every shard once, with one line saying so, and keeps the
// entries; the next reads none. A shard overwritten since is read again, alone, and
// the log says one changed.
func TestResolveStore(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	paths := gen(t, dir, 5, shard.None)
	store, err := index.OpenStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	reg, files := registry()
	var logs []string
	lk := index.Lookup{Sources: reg, Store: store, Logf: func(f string, a ...any) { logs = append(logs, f) }}
	first, err := lk.Resolve(ctx, paths)
	if err != nil {
		t.Fatal(err)
	}
	if files.shardOpens() != len(paths) || len(logs) != 1 || !strings.Contains(logs[0], "no index") {
		t.Fatalf("first run: %d opens, logs %q", files.shardOpens(), logs)
	}
	for i, p := range paths {
		if want := truth(t, p); first[i].URL != p || first[i].Samples != len(want) || !reflect.DeepEqual(first[i].Offsets, want) || first[i].Version == "" {
			t.Fatalf("entry %d: %+v", i, first[i])
		}
	}

	if set, ok := store.GetSet(paths); !ok || !reflect.DeepEqual(set, first) {
		t.Fatalf("the store kept no set of the %d URLs (%v)", len(paths), ok)
	}
	reg2, files2 := registry()
	logs = nil
	lk.Sources = reg2
	again, err := lk.Resolve(ctx, paths)
	if err != nil {
		t.Fatal(err)
	}
	if files2.shardOpens() != 0 || len(logs) != 0 || !reflect.DeepEqual(again, first) {
		t.Fatalf("second run: %d opens, logs %q, same entries %v", files2.shardOpens(), logs, reflect.DeepEqual(again, first))
	}

	// Overwrite shard 2 with another dataset's shard of other samples.
	other := gen(t, t.TempDir(), 4, shard.None)
	data, _ := os.ReadFile(other[1])
	later := time.Now().Add(time.Minute)
	if err := os.WriteFile(paths[2], data, 0o644); err != nil {
		t.Fatal(err)
	}
	os.Chtimes(paths[2], later, later)
	reg3, files3 := registry()
	logs = nil
	lk.Sources = reg3
	third, err := lk.Resolve(ctx, paths)
	if err != nil {
		t.Fatal(err)
	}
	if files3.opens[paths[2]] != 1 || files3.shardOpens() != 1 {
		t.Errorf("after an overwrite: opens %v, want shard 2 only", files3.opens)
	}
	if len(logs) != 1 || !strings.Contains(logs[0], "changed") {
		t.Errorf("after an overwrite: logs %q", logs)
	}
	if want := truth(t, paths[2]); third[2].Samples != len(want) || !reflect.DeepEqual(third[2].Offsets, want) {
		t.Errorf("the overwritten shard: %+v, want %d samples", third[2], len(want))
	}
}

// An index object beside the shards serves a node whose store is empty: no shard is
// read. A stale entry in it is recomputed.
func TestResolveBeside(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	paths := gen(t, dir, 6, shard.None)
	reg, _ := registry()
	infos, err := index.Lookup{Sources: reg, NoBeside: true}.Resolve(ctx, paths)
	if err != nil {
		t.Fatal(err)
	}
	writeIndexFile(t, filepath.Join(dir, index.FileName), infos)

	store, _ := index.OpenStore(t.TempDir())
	reg2, files := registry()
	var opened atomic.Int32
	got, err := index.Lookup{Sources: reg2, Store: store, Progress: func(int, int) { opened.Add(1) }}.Resolve(ctx, paths)
	if err != nil {
		t.Fatal(err)
	}
	if files.shardOpens() != 0 || opened.Load() != 0 || !reflect.DeepEqual(got, infos) {
		t.Fatalf("with the index beside the shards: %d shard opens", files.shardOpens())
	}
	// The same with an explicit index (by URL), and a legacy index of bare counts.
	legacy := filepath.Join(t.TempDir(), "counts.jsonl")
	var lines []string
	for _, in := range infos {
		lines = append(lines, `{"url":"`+in.URL+`","samples":`+strconv.Itoa(in.Samples)+`}`)
	}
	os.WriteFile(legacy, []byte(strings.Join(lines, "\n")), 0o644)
	reg3, files3 := registry()
	got, err = index.Lookup{Sources: reg3, Index: legacy}.Resolve(ctx, paths)
	if err != nil || files3.shardOpens() != 0 {
		t.Fatalf("legacy index: %v, %d opens", err, files3.shardOpens())
	}
	for i := range got {
		if got[i].Samples != infos[i].Samples || got[i].Offsets != nil {
			t.Errorf("legacy entry %d: %+v", i, got[i])
		}
	}
}

func FuzzRead(f *testing.F) {
	var buf bytes.Buffer
	index.Write(&buf, []shard.Info{{URL: "s3://b/a.tar", Samples: 2, Version: "v", Size: 2048, Offsets: []int64{0, 1024}}}, false)
	f.Add(buf.Bytes())
	f.Add([]byte(`{"url":"a","samples":3}`))
	buf.Reset()
	index.Write(&buf, []shard.Info{{URL: "a", Samples: 1, Offsets: []int64{512}}}, true)
	f.Add(buf.Bytes())
	// Members: a line of each kind, and hostile ones.
	buf.Reset()
	index.Write(&buf, memberShards("s3://b/", 8, 3), false)
	f.Add(buf.Bytes())
	for _, l := range []string{
		`{"url":"a","size":4096,"samples":2,"offsets":"AIAI","exts":["cls","tokens.npy"],"dtypes":["","<u2"],"sizes":"AgLBAcEB","items":"AwM"}`,
		`{"url":"a","samples":2,"exts":["cls"],"sizes":"/////////////w"}`,
		`{"url":"a","samples":2,"exts":["cls"],"sizes":"!!"}`,
		`{"url":"a","size":600,"samples":1,"exts":["cls"],"sizes":"gQg"}`,
		`{"url":"a","samples":0,"exts":[]}`,
	} {
		f.Add([]byte(l))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		infos, err := index.Read(bytes.NewReader(data), "fuzz")
		if err != nil {
			return
		}
		for _, in := range infos {
			checkAccepted(t, in)
		}
	})
}

// checkAccepted fails t unless in is an entry that a reader may accept: offsets and
// members of its samples, offsets on tar blocks and increasing, every sample with a
// member, sizes and counts that fit.
func checkAccepted(t *testing.T, in shard.Info) {
	t.Helper()
	if in.Samples < 0 || (in.Offsets != nil && len(in.Offsets) != in.Samples) {
		t.Fatalf("accepted %+v", in)
	}
	for i, o := range in.Offsets {
		if o%512 != 0 || (i > 0 && o <= in.Offsets[i-1]) {
			t.Fatalf("accepted offsets %v", in.Offsets)
		}
	}
	m := in.Members
	if m == nil {
		return
	}
	if m.Samples() != in.Samples || in.Check(-1, -1) != nil {
		t.Fatalf("accepted members of %d samples for %d (%v)", m.Samples(), in.Samples, in.Check(-1, -1))
	}
	for s := range m.Samples() {
		some := false
		for _, ext := range m.Exts() {
			size, ok := m.Size(s, ext)
			some = some || ok
			if size < 0 || (!ok && size != 0) {
				t.Fatalf("accepted size %d %v", size, ok)
			}
			n, typed := m.Items(s, ext)
			if typed != (ok && m.DType(ext) != "") || n < 0 {
				t.Fatalf("accepted %d items %v of a member %v of type %q", n, typed, ok, m.DType(ext))
			}
			if isz, _ := shard.NPYItemSize(m.DType(ext)); typed && n*int64(isz) > size {
				t.Fatalf("accepted %d items of %d bytes in %d bytes", n, isz, size)
			}
		}
		if !some {
			t.Fatalf("accepted sample %d without a member", s)
		}
	}
}

// BenchmarkIndexSize reports the bytes per sample of an index of 1,000-sample shards:
// images of 100-120 KB (offsets that vary) and 8 KiB token arrays (offsets that do
// not), plain and zstd-compressed. Multiply by the samples for a dataset's index.
//
// With members (format version 2), each sample's two members' sizes too (and the
// tokens' element counts).
func BenchmarkIndexSize(b *testing.B) {
	for _, kind := range []string{"images", "tokens"} {
		for _, members := range []bool{false, true} {
			for _, compress := range []bool{false, true} {
				b.Run(fmt.Sprintf("%s/members=%v/zstd=%v", kind, members, compress), func(b *testing.B) {
					benchmarkIndexSize(b, kind, members, compress)
				})
			}
		}
	}
}

func benchmarkIndexSize(b *testing.B, kind string, members, compress bool) {
	rng := rand.New(rand.NewPCG(1, 2))
	const shards, samples = 100, 1000
	infos := make([]shard.Info, shards)
	head := npyHeader("<i4", 2048)
	for i := range infos {
		offs := make([]int64, samples)
		var off int64
		var mb shard.MembersBuilder
		for j := range offs {
			offs[j] = off
			size := int64(8<<10 + 128) // .npy: header and 2048 int32
			if kind == "images" {
				size = 100_000 + rng.Int64N(20_000)
			}
			// two members (data and label): headers and padding to 512
			off += 512 + (size+511)/512*512 + 512 + 512
			mb.Sample()
			if kind == "images" {
				mb.Member("jpg", size)
			} else {
				mb.MemberHead("tokens.npy", size, head)
			}
			mb.Member("cls", 1)
		}
		infos[i] = shard.Info{URL: fmt.Sprintf("s3://bucket/train/train-%06d.tar", i), Samples: samples,
			Version: `"d41d8cd98f00b204e9800998ecf8427e"`, Size: off + 1024, Offsets: offs}
		if members {
			infos[i].Members = mb.Members()
		}
	}
	var buf bytes.Buffer
	for range b.N {
		buf.Reset()
		if err := index.Write(&buf, infos, compress); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(buf.Len())/(shards*samples), "bytes/sample")
}

// Beyond CheckUpTo remote shards, entries are trusted without a request per object
// (the loader reads them pinned to their versions); local files are always checked.
func TestResolveCheckUpTo(t *testing.T) {
	ctx := context.Background()
	paths := gen(t, t.TempDir(), 12, shard.None)
	remote := make([]string, len(paths))
	for i, p := range paths {
		remote[i] = "remote://" + p
	}
	store, _ := index.OpenStore(t.TempDir())
	for _, tc := range []struct {
		name     string
		urls     []string
		upTo     int
		wantStat int
	}{
		{"remote, checked", remote, 100, 12},
		{"remote, trusted", remote, 5, 0},
		{"local, checked", paths, 5, 12},
	} {
		c := &countingFile{opens: map[string]int{}}
		reg := &source.Registry{}
		reg.Register("remote", c)
		reg.Register("file", c)
		lk := index.Lookup{Sources: reg, Store: store, CheckUpTo: tc.upTo}
		if _, err := lk.Resolve(ctx, tc.urls); err != nil { // fills the store
			t.Fatal(err)
		}
		c.stats, c.opens = 0, map[string]int{}
		got, err := lk.Resolve(ctx, tc.urls)
		if err != nil {
			t.Fatal(err)
		}
		if c.stats != tc.wantStat || c.shardOpens() != 0 {
			t.Errorf("%s: %d stats and %d shard opens on the second run, want %d and none", tc.name, c.stats, c.shardOpens(), tc.wantStat)
		}
		if got[3].Version == "" || got[3].Samples != len(truth(t, paths[3])) {
			t.Errorf("%s: entry %+v", tc.name, got[3])
		}
	}
}

// Listings are split by name prefixes so that each covers about a page of names.
func TestListPrefixes(t *testing.T) {
	var names []string
	for i := range 10000 {
		names = append(names, fmt.Sprintf("train-%06d.tar", i))
	}
	got := index.ListPrefixes(names, 1000)
	if len(got) != 10 || got[0] != "train-000" || got[9] != "train-009" {
		t.Errorf("10,000 names: %v", got)
	}
	if got := index.ListPrefixes(names[:500], 1000); len(got) != 1 || got[0] != "train-000" {
		t.Errorf("500 names: %v", got)
	}
	if got := index.ListPrefixes([]string{"a", "ab", "abc"}, 1); len(got) != 3 {
		t.Errorf("nested names: %v", got)
	}
	// Every name is under one of the prefixes.
	odd := []string{"x1", "x2", "y", "x10", "zz9", "zz10"}
	ps := index.ListPrefixes(odd, 2)
	for _, n := range odd {
		covered := false
		for _, p := range ps {
			covered = covered || strings.HasPrefix(n, p)
		}
		if !covered {
			t.Errorf("%s not under %v", n, ps)
		}
	}
}

// BenchmarkRead reads the index of 10,000 four-sample shards (zstd), as a loader does
// before its first batch when the index is beside the shards.
func BenchmarkRead(b *testing.B) {
	infos := make([]shard.Info, 10000)
	for i := range infos {
		infos[i] = shard.Info{URL: fmt.Sprintf("s3://bench/small/train-%06d.tar", i), Samples: 4, Version: `"0123456789abcdef0123456789abcdef"`,
			Size: 140000, Offsets: []int64{0, 35328, 70656, 105472}}
	}
	var buf bytes.Buffer
	if err := index.Write(&buf, infos, true); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(buf.Len()))
	for range b.N {
		if _, err := index.Read(bytes.NewReader(buf.Bytes()), "bench"); err != nil {
			b.Fatal(err)
		}
	}
}

// noVersion reports objects without a version, as a store that leaves some out of
// its listings does (AIStore for multipart objects).
type noVersion struct{ *countingFile }

func (n noVersion) Stat(ctx context.Context, url string) (source.Info, error) {
	info, err := n.countingFile.Stat(ctx, url)
	info.Version = ""
	return info, err
}

// An entry whose object is reported without a version is not taken as changed (its
// size is still checked): the shard is not read again.
func TestResolveUnknownVersion(t *testing.T) {
	ctx := context.Background()
	paths := gen(t, t.TempDir(), 4, shard.None)
	remote := make([]string, len(paths))
	for i, p := range paths {
		remote[i] = "remote://" + p
	}
	store, _ := index.OpenStore(t.TempDir())
	c := &countingFile{opens: map[string]int{}}
	reg := &source.Registry{}
	reg.Register("remote", c)
	if _, err := (index.Lookup{Sources: reg, Store: store}).Resolve(ctx, remote); err != nil {
		t.Fatal(err)
	}
	c.opens = map[string]int{}
	reg = &source.Registry{}
	reg.Register("remote", noVersion{c})
	got, err := (index.Lookup{Sources: reg, Store: store}).Resolve(ctx, remote)
	if err != nil {
		t.Fatal(err)
	}
	if c.shardOpens() != 0 || got[1].Version == "" || got[1].Samples != len(truth(t, paths[1])) {
		t.Fatalf("%d shard opens, entry %+v", c.shardOpens(), got[1])
	}
}

// Local files are checked against their entries up to LocalCheckFactor times
// CheckUpTo, and trusted beyond it.
func TestResolveLocalCheckUpTo(t *testing.T) {
	ctx := context.Background()
	paths := gen(t, t.TempDir(), 2*index.LocalCheckFactor+2, shard.None)
	store, _ := index.OpenStore(t.TempDir())
	for _, tc := range []struct {
		upTo     int
		wantStat bool
	}{{3, true}, {2, false}} {
		c := &countingFile{opens: map[string]int{}}
		reg := &source.Registry{}
		reg.Register("file", c)
		lk := index.Lookup{Sources: reg, Store: store, CheckUpTo: tc.upTo}
		if _, err := lk.Resolve(ctx, paths); err != nil { // fills the store
			t.Fatal(err)
		}
		c.stats, c.opens = 0, map[string]int{}
		got, err := lk.Resolve(ctx, paths)
		if err != nil {
			t.Fatal(err)
		}
		if (c.stats > 0) != tc.wantStat || c.shardOpens() != 0 || got[5].Version == "" {
			t.Errorf("CheckUpTo %d over %d local shards: %d stats, %d shard opens, entry %+v; want stats: %v", tc.upTo, len(paths), c.stats, c.shardOpens(), got[5], tc.wantStat)
		}
	}
}

// Shards in sibling directories (hashed key prefixes) have their index in the
// directories' parent; shards whose directories have no common parent, none.
func TestBesideSiblings(t *testing.T) {
	for _, c := range []struct {
		urls []string
		want string
	}{
		{[]string{"s3://b/ds/0/a.tar", "s3://b/ds/1/b.tar", "s3://b/ds/0/c.tar"}, "s3://b/ds/" + index.FileName},
		{[]string{"s3://b/0/a.tar", "s3://b/f/b.tar"}, "s3://b/" + index.FileName},
		{[]string{"s3://b/a.tar", "s3://b/c.tar"}, "s3://b/" + index.FileName},
		{[]string{"s3://b1/a.tar", "s3://b2/a.tar"}, ""},
		{[]string{"s3://b/x/0/a.tar", "s3://b/y/1/a.tar"}, ""},
		{[]string{"s3://b/ds/a.tar", "s3://b/ds/0/a.tar"}, ""},
		{[]string{"gs://b/ds/00/a.tar", "gs://b/ds/ff/a.tar"}, "gs://b/ds/" + index.FileName},
		{[]string{"https://h/ds/0/a.tar", "https://h/ds/1/a.tar"}, ""},
	} {
		if got := index.Beside(c.urls); got != c.want {
			t.Errorf("Beside(%q) = %q, want %q", c.urls, got, c.want)
		}
	}

	// Local shards under hashed prefixes: the index in their parent is found and
	// read; no shard is opened.
	ctx := context.Background()
	dir := t.TempDir()
	var paths []string
	for i, p := range gen(t, t.TempDir(), 6, shard.None) {
		sub := filepath.Join(dir, shard.HashPrefix(filepath.Base(p), 4))
		if err := os.MkdirAll(sub, 0o755); err != nil {
			t.Fatal(err)
		}
		dst := filepath.Join(sub, fmt.Sprintf("s-%d.tar", i))
		if err := os.Rename(p, dst); err != nil {
			t.Fatal(err)
		}
		paths = append(paths, dst)
	}
	if got, want := index.Beside(paths), "file://"+dir+"/"+index.FileName; got != want && got != dir+"/"+index.FileName {
		t.Fatalf("Beside = %q, want %q", got, want)
	}
	reg, _ := registry()
	infos, err := index.Lookup{Sources: reg, NoBeside: true}.Resolve(ctx, paths)
	if err != nil {
		t.Fatal(err)
	}
	writeIndexFile(t, filepath.Join(dir, index.FileName), infos)
	reg2, files := registry()
	got, err := index.Lookup{Sources: reg2}.Resolve(ctx, paths)
	if err != nil {
		t.Fatal(err)
	}
	if files.shardOpens() != 0 || !reflect.DeepEqual(got, infos) {
		t.Fatalf("with the index in the prefixes' parent: %d shard opens", files.shardOpens())
	}
}

// writeIndexFile writes infos as a compressed index at path.
func writeIndexFile(t *testing.T, path string, infos []shard.Info) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := index.Write(f, infos, true); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}
