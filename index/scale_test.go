package index_test

import (
	"archive/tar"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/shardload/shardload/index"
	"github.com/shardload/shardload/shard"
	"github.com/shardload/shardload/source"
)

// tinyShards writes n shards of one one-byte sample each into dir (faster than
// shardgen for thousands), and returns their paths.
func tinyShards(t testing.TB, dir string, n int) []string {
	t.Helper()
	paths := make([]string, n)
	for i := range paths {
		paths[i] = filepath.Join(dir, fmt.Sprintf("train-%06d.tar", i))
		f, err := os.Create(paths[i])
		if err != nil {
			t.Fatal(err)
		}
		tw := tar.NewWriter(f)
		tw.WriteHeader(&tar.Header{Name: fmt.Sprintf("%06d.txt", i), Mode: 0o644, Size: 1, Typeflag: tar.TypeReg})
		tw.Write([]byte{'x'})
		if err := tw.Close(); err != nil {
			t.Fatal(err)
		}
		f.Close()
	}
	return paths
}

// listingFile is the File source counting its listings and opens.
type listingFile struct {
	source.File
	lists, opens atomic.Int64
}

func (l *listingFile) List(ctx context.Context, prefix string, fn func(source.Info) error) error {
	l.lists.Add(1)
	return l.File.List(ctx, prefix, fn)
}

func (l *listingFile) Open(ctx context.Context, url string) (io.ReadCloser, error) {
	l.opens.Add(1)
	return l.File.Open(ctx, url)
}

// storeFiles returns the number of files in the store's directory and their bytes.
func storeFiles(t *testing.T, dir string) (files int, bytes int64) {
	t.Helper()
	filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			fi, _ := d.Info()
			files++
			bytes += fi.Size()
		}
		return nil
	})
	return files, bytes
}

// Planning is linear in shards: a lookup of 10,000 local shards in one directory
// lists the directory once (where it listed it once per thousand names, each
// listing reading the whole directory), estimated or exact, and the node's store
// keeps their entries in a few files (where it wrote two files per shard).
func TestLookupLinearInShards(t *testing.T) {
	const n = 10000
	ctx := context.Background()
	paths := tinyShards(t, t.TempDir(), n)
	src := &listingFile{}
	reg := &source.Registry{}
	reg.Register("file", src)

	// Without an index: estimated counts from one listing.
	est, err := index.Lookup{Sources: reg}.Estimate(ctx, paths, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := src.lists.Load(); got != 1 {
		t.Errorf("estimating %d shards listed their directory %d times, want once", n, got)
	}
	if est[n-1].Samples < 1 || !est[n-1].Estimated {
		t.Errorf("estimated entry: %+v", est[n-1])
	}

	// Counting them all into an empty store: one listing, every shard read once,
	// a few files in the store.
	storeDir := t.TempDir()
	store, err := index.OpenStore(storeDir)
	if err != nil {
		t.Fatal(err)
	}
	src.lists.Store(0)
	src.opens.Store(0)
	lk := index.Lookup{Sources: reg, Store: store, NoBeside: true}
	first, err := lk.Resolve(ctx, paths)
	if err != nil {
		t.Fatal(err)
	}
	if got := src.lists.Load(); got != 1 {
		t.Errorf("counting %d shards listed their directory %d times, want once", n, got)
	}
	if got := src.opens.Load(); got != n {
		t.Errorf("counting %d shards opened %d", n, got)
	}
	files, size := storeFiles(t, storeDir)
	t.Logf("the store of %d shards: %d files, %d bytes", n, files, size)
	if files > 16 || size > 2<<20 {
		t.Errorf("the store of %d shards: %d files, %d bytes; want at most 16 files and 2 MB", n, files, size)
	}
	for i, e := range first {
		if e.Samples != 1 || len(e.Offsets) != 1 || e.Version == "" || e.URL != paths[i] {
			t.Fatalf("entry %d: %+v", i, e)
		}
	}

	// The next lookup reads no shard, lists once, and finds the same entries.
	src.lists.Store(0)
	src.opens.Store(0)
	again, err := lk.Resolve(ctx, paths)
	if err != nil {
		t.Fatal(err)
	}
	if src.lists.Load() != 1 || src.opens.Load() != 0 || !reflect.DeepEqual(again, first) {
		t.Errorf("again: %d listings, %d opens, same entries %v", src.lists.Load(), src.opens.Load(), reflect.DeepEqual(again, first))
	}

	// With an index beside the shards: one listing, no shard read, nothing written.
	f, err := os.Create(filepath.Join(filepath.Dir(paths[0]), index.FileName))
	if err != nil {
		t.Fatal(err)
	}
	if err := index.Write(f, first, true); err != nil {
		t.Fatal(err)
	}
	f.Close()
	empty := t.TempDir()
	store2, _ := index.OpenStore(empty)
	src.lists.Store(0)
	src.opens.Store(0)
	quick, err := index.Lookup{Sources: reg, Store: store2}.Quick(ctx, paths, 8)
	if err != nil {
		t.Fatal(err)
	}
	if src.lists.Load() != 1 || src.opens.Load() != 1 || !reflect.DeepEqual(quick, first) { // the index itself
		t.Errorf("beside: %d listings, %d opens, same entries %v", src.lists.Load(), src.opens.Load(), reflect.DeepEqual(quick, first))
	}
	if files, _ := storeFiles(t, empty); files != 0 {
		t.Errorf("planning from the index beside the shards wrote %d files to the store", files)
	}
}

// Entries put one at a time (as a loader keeps each shard it read) stay a few
// files: a segment holds more entries than all later ones together.
func TestStoreOneByOne(t *testing.T) {
	dir := t.TempDir()
	store, _ := index.OpenStore(dir)
	const n = 1000
	var urls []string
	for i := range n {
		u := fmt.Sprintf("s3://b/ds/train-%06d.tar", i)
		urls = append(urls, u)
		if err := store.Put(shard.Info{URL: u, Samples: i + 1, Version: "v1", Size: 1 << 20}); err != nil {
			t.Fatal(err)
		}
	}
	files, _ := storeFiles(t, dir)
	if files > 11 { // log2(1000) + 1
		t.Errorf("%d entries put one by one: %d files", n, files)
	}
	// A later entry of a shard replaces its earlier one.
	store.Put(shard.Info{URL: urls[7], Samples: 99, Version: "v2", Size: 1 << 20})
	got := store.GetMany(urls)
	if len(got) != n || got[urls[7]].Samples != 99 || got[urls[7]].Version != "v2" || got[urls[999]].Samples != 1000 {
		t.Errorf("%d entries back; shard 7: %+v", len(got), got[urls[7]])
	}
}

// Processes writing the store at once lose no entry: each writes segments and merges
// through renames, and removes only what it merged into a file already in place.
func TestStoreConcurrentWriters(t *testing.T) {
	dir := t.TempDir()
	const writers, each = 4, 60
	var wg sync.WaitGroup
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			store, err := index.OpenStore(dir) // a process of its own
			if err != nil {
				t.Error(err)
				return
			}
			for i := range each {
				u := fmt.Sprintf("s3://b/ds/w%d-%04d.tar", w, i)
				if err := store.Put(shard.Info{URL: u, Samples: i, Version: "v", Size: 4096}); err != nil {
					t.Error(err)
				}
			}
		}()
	}
	wg.Wait()
	store, _ := index.OpenStore(dir)
	var urls []string
	for w := range writers {
		for i := range each {
			urls = append(urls, fmt.Sprintf("s3://b/ds/w%d-%04d.tar", w, i))
		}
	}
	if got := store.GetMany(urls); len(got) != len(urls) {
		t.Errorf("%d of %d entries back after concurrent writers", len(got), len(urls))
	}
}

// A segment cut short (fewer entries than its name says) and a temporary file are
// not read; the rest of the store is.
func TestStoreIgnoresPartialSegments(t *testing.T) {
	dir := t.TempDir()
	store, _ := index.OpenStore(dir)
	var infos []shard.Info
	for i := range 100 {
		infos = append(infos, shard.Info{URL: fmt.Sprintf("s3://b/ds/train-%03d.tar", i), Samples: 5, Version: "v", Size: 4096})
	}
	if err := store.PutMany(infos[:90]); err != nil {
		t.Fatal(err)
	}
	if err := store.PutMany(infos[90:]); err != nil {
		t.Fatal(err)
	}
	var segs []string
	filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && strings.HasSuffix(p, ".idx") {
			segs = append(segs, p)
		}
		return nil
	})
	if len(segs) != 2 {
		t.Fatalf("segments %v, want 2", segs)
	}
	// Cut the small one (plain JSON lines) after its header and first entry, as a
	// crash before a rename never leaves it but a file system may after a power cut.
	small := segs[0]
	if !strings.Contains(filepath.Base(small), ".10.") {
		small = segs[1]
	}
	b, _ := os.ReadFile(small)
	lines := strings.SplitAfter(string(b), "\n")
	os.WriteFile(small, []byte(lines[0]+lines[1]), 0o600)
	os.WriteFile(filepath.Join(filepath.Dir(small), ".tmp-123"), []byte("garbage"), 0o600)
	urls := make([]string, len(infos))
	for i, in := range infos {
		urls[i] = in.URL
	}
	got := mustOpen(t, dir).GetMany(urls)
	if len(got) != 90 {
		t.Errorf("%d entries read, want the 90 of the whole segment", len(got))
	}
}

// A store of the layout of earlier releases (a file per shard) is still read, and
// what is found there is written in the new layout.
func TestStoreReadsLegacyLayout(t *testing.T) {
	ctx := context.Background()
	paths := tinyShards(t, t.TempDir(), 40)
	reg := &source.Registry{}
	src := &listingFile{}
	reg.Register("file", src)
	counted, err := index.Lookup{Sources: reg, NoBeside: true}.Resolve(ctx, paths)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	old, _ := index.OpenStore(dir)
	for _, in := range counted {
		if err := old.WriteLegacy(in); err != nil {
			t.Fatal(err)
		}
	}
	store, _ := index.OpenStore(dir)
	src.opens.Store(0)
	got, err := index.Lookup{Sources: reg, Store: store, NoBeside: true}.Resolve(ctx, paths)
	if err != nil {
		t.Fatal(err)
	}
	if src.opens.Load() != 0 || !reflect.DeepEqual(got, counted) {
		t.Errorf("from the legacy store: %d opens, same entries %v", src.opens.Load(), reflect.DeepEqual(got, counted))
	}
	var segs int
	filepath.WalkDir(filepath.Join(dir, "v2"), func(p string, d os.DirEntry, err error) error {
		if err == nil && strings.HasSuffix(p, ".idx") {
			segs++
		}
		return nil
	})
	if segs == 0 {
		t.Error("the legacy entries were not written in the new layout")
	}
}

func mustOpen(t *testing.T, dir string) *index.Store {
	t.Helper()
	s, err := index.OpenStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// Keep writes a loader's first entries one by one and later ones in batches: a run
// that stops early keeps all but the last few.
func TestKeepBatches(t *testing.T) {
	dir := t.TempDir()
	store := mustOpen(t, dir)
	var infos []shard.Info
	for i := range 100 {
		infos = append(infos, shard.Info{URL: fmt.Sprintf("s3://b/ds/train-%03d.tar", i), Samples: 1, Version: "v", Size: 4096, Estimated: true})
	}
	keep := store.Keep(infos, t.Logf)
	urls := make([]string, len(infos))
	for i, in := range infos {
		urls[i] = in.URL
		if i < 90 {
			keep(in)
		}
	}
	// 90 of 100 kept, the run stopped: all but at most an eighth are in the store.
	if got := len(mustOpen(t, dir).GetMany(urls)); got < 90-90/8-1 || got > 90 {
		t.Errorf("%d entries in the store after 90 kept", got)
	}
	for _, in := range infos[90:] {
		keep(in)
	}
	if got := len(mustOpen(t, dir).GetMany(urls)); got != 100 {
		t.Errorf("%d entries in the store after the last estimated shard", got)
	}
}
