package index_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"sync"
	"testing"

	"github.com/shardload/shardload/cache"
	"github.com/shardload/shardload/index"
	"github.com/shardload/shardload/plan"
	"github.com/shardload/shardload/shard"
	"github.com/shardload/shardload/source"
)

// objectStore is a remote store in memory ("s3://" URLs): objects with versions,
// ranged and pinned reads, and a count of the reads (GETs, whole or ranged) of each
// object, and apart of its Stats (HEADs).
type objectStore struct {
	mu      sync.Mutex
	objects map[string][]byte
	version map[string]string
	shards  map[string]shard.Info // objects Stat describes without data
	gets    map[string]int
	stats   map[string]int
}

func newObjectStore(shards []shard.Info) *objectStore {
	s := &objectStore{objects: map[string][]byte{}, version: map[string]string{}, shards: map[string]shard.Info{}, gets: map[string]int{}, stats: map[string]int{}}
	for _, in := range shards {
		s.shards[in.URL] = in
	}
	return s
}

func (s *objectStore) put(url, version string, b []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.objects[url], s.version[url] = b, version
}

func (s *objectStore) getsOf(url string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.gets[url]
}

func (s *objectStore) statsOf(url string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stats[url]
}

func (s *objectStore) Stat(_ context.Context, url string) (source.Info, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stats[url]++
	if b, ok := s.objects[url]; ok {
		return source.Info{URL: url, Size: int64(len(b)), Version: s.version[url]}, nil
	}
	if in, ok := s.shards[url]; ok {
		return source.Info{URL: url, Size: in.Size, Version: in.Version}, nil
	}
	return source.Info{}, &source.Error{Op: "stat", URL: url, Err: source.ErrNotFound}
}

func (s *objectStore) Open(ctx context.Context, url string) (io.ReadCloser, error) {
	return s.OpenVersion(ctx, url, "", 0, -1)
}

func (s *objectStore) OpenRange(ctx context.Context, url string, off, length int64) (io.ReadCloser, error) {
	return s.OpenVersion(ctx, url, "", off, length)
}

func (s *objectStore) OpenVersion(_ context.Context, url, version string, off, length int64) (io.ReadCloser, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	b, ok := s.objects[url]
	if !ok {
		return nil, &source.Error{Op: "open", URL: url, Err: source.ErrNotFound}
	}
	if version != "" && version != s.version[url] {
		return nil, &source.Error{Op: "open", URL: url, Err: source.ErrChanged}
	}
	s.gets[url]++
	b = b[min(off, int64(len(b))):]
	if length >= 0 {
		b = b[:min(length, int64(len(b)))]
	}
	return io.NopCloser(bytes.NewReader(b)), nil
}

var _ source.VersionReader = (*objectStore)(nil)

// fetchShards returns n remote shards of samples samples, with offsets.
func fetchShards(n, samples int) []shard.Info {
	infos := make([]shard.Info, n)
	for i := range infos {
		in := shard.Info{URL: fmt.Sprintf("s3://data/train/train-%06d.tar", i), Samples: samples, Version: fmt.Sprintf(`"s%d"`, i)}
		off := int64(0)
		for j := range samples {
			in.Offsets = append(in.Offsets, off)
			off += 2048 * int64(1+(i+j)%3)
		}
		in.Size = in.Offsets[samples-1] + 8192
		infos[i] = in
	}
	return infos
}

const fetchIndexURL = "s3://data/meta/" + index.FileName

// fetchDataset puts an addressable index of shards in a store and returns the store,
// its registry and the shards' URLs.
func fetchDataset(t *testing.T, shards []shard.Info) (*objectStore, *source.Registry, []string) {
	t.Helper()
	var buf bytes.Buffer
	if err := index.WriteAddressable(&buf, shards); err != nil {
		t.Fatal(err)
	}
	st := newObjectStore(shards)
	st.put(fetchIndexURL, `"v1"`, buf.Bytes())
	reg := &source.Registry{}
	reg.Register("s3", st)
	urls := make([]string, len(shards))
	for i, in := range shards {
		urls[i] = in.URL
	}
	return st, reg, urls
}

// loadRank is one rank's start: Quick over the index, then the offsets of its plan.
func loadRank(ctx context.Context, lk index.Lookup, urls []string, rank, world int) ([]shard.Info, plan.Plan, error) {
	infos, err := lk.Quick(ctx, urls, world)
	if err != nil {
		return nil, plan.Plan{}, err
	}
	return index.Plan(ctx, infos, func(in []shard.Info) (plan.Plan, error) {
		return plan.New(in, plan.Config{Seed: 3, Rank: rank, World: world, Shuffle: true, BatchSize: 4, Window: 64, Lanes: 4})
	})
}

// The ranks of a node, each a process of its own with the node's index store (a
// Store of its own over one directory), read the index object once in all: one GET,
// whatever the blocks their plans read; each plans as a rank that read the object
// itself. A new version of the object is read once again, and its old copy goes.
func TestIndexObjectOncePerNodeStore(t *testing.T) {
	ctx := context.Background()
	shards := fetchShards(3000, 20) // several blocks
	st, reg, urls := fetchDataset(t, shards)
	const ranks = 8
	want := make([]plan.Plan, ranks)
	for r := range ranks {
		_, p, err := loadRank(ctx, index.Lookup{Sources: reg, Index: fetchIndexURL, LazyOffsets: true}, urls, r, ranks)
		if err != nil {
			t.Fatal(err)
		}
		want[r] = p
	}
	if n := st.getsOf(fetchIndexURL); n < ranks {
		t.Fatalf("without a store the ranks read the index %d times, want at least %d (the test proves nothing)", n, ranks)
	}
	st.gets, st.stats = map[string]int{}, map[string]int{}

	dir := t.TempDir()
	run := func() {
		t.Helper()
		var wg sync.WaitGroup
		errs := make([]error, ranks)
		for r := range ranks {
			wg.Go(func() {
				store, err := index.OpenStore(dir)
				if err != nil {
					errs[r] = err
					return
				}
				_, p, err := loadRank(ctx, index.Lookup{Sources: reg, Index: fetchIndexURL, Store: store, LazyOffsets: true}, urls, r, ranks)
				if err == nil && !reflect.DeepEqual(p, want[r]) {
					err = fmt.Errorf("rank %d planned otherwise through the node's copy", r)
				}
				errs[r] = err
			})
		}
		wg.Wait()
		for _, err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	run()
	// One GET, and one HEAD: the ranks that start together share the first's.
	if n, stats := st.getsOf(fetchIndexURL), st.statsOf(fetchIndexURL); n != 1 || stats != 1 {
		t.Fatalf("%d ranks with a node store read the index object %d times (want 1) and asked for its version %d times (want 1 for the node)", ranks, n, stats)
	}
	run() // the copy is there: no read at all
	if n := st.getsOf(fetchIndexURL); n != 1 {
		t.Fatalf("a second start read the index object again: %d reads in all", n)
	}

	// A new version (the same entries, written again): read once more, and the old
	// copy goes.
	var buf bytes.Buffer
	if err := index.WriteAddressable(&buf, shards); err != nil {
		t.Fatal(err)
	}
	st.put(fetchIndexURL, `"v2"`, buf.Bytes())
	defer index.SetStatFresh(0)() // the node's last version check is too old to serve
	run()
	if n := st.getsOf(fetchIndexURL); n != 2 {
		t.Fatalf("after the object changed: %d reads in all, want 2", n)
	}
	copies, _ := filepath.Glob(filepath.Join(dir, "objects", "*.idx"))
	if len(copies) != 1 {
		t.Fatalf("copies %v, want the new version's alone", copies)
	}
}

// With the node cache in front of the store (each process its own Cache over one
// directory) and no index store, the ranks read the index object once in all too.
func TestIndexObjectOncePerNodeCache(t *testing.T) {
	ctx := context.Background()
	shards := fetchShards(3000, 20)
	st, reg, urls := fetchDataset(t, shards)
	dir := t.TempDir()
	const ranks = 8
	var wg sync.WaitGroup
	errs := make([]error, ranks)
	for r := range ranks {
		wg.Go(func() {
			wrapped, c, err := cache.Wrap(cache.Options{Dir: dir}, reg)
			if err != nil {
				errs[r] = err
				return
			}
			defer c.Close()
			_, _, errs[r] = loadRank(ctx, index.Lookup{Sources: wrapped, Index: fetchIndexURL, LazyOffsets: true}, urls, r, ranks)
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if n := st.getsOf(fetchIndexURL); n != 1 {
		t.Fatalf("%d ranks through the node cache read the index object %d times, want 1", ranks, n)
	}
	// At most one version check a rank, not one per block read from the cache (fewer
	// when a rank's check, recorded on the cached copy, serves another's open within
	// the cache's validation interval: how many do depends on the ranks' timing).
	if n := st.statsOf(fetchIndexURL); n < 1 || n > ranks {
		t.Fatalf("%d ranks through the node cache asked for the index object's version %d times, want 1 to %d", ranks, n, ranks)
	}
}

// An index object the store does not have is not found, with or without a store; a
// local index is read as it is, and no copy is made of it.
func TestIndexObjectCopyMissingAndLocal(t *testing.T) {
	ctx := context.Background()
	shards := fetchShards(10, 4)
	_, reg, urls := fetchDataset(t, shards)
	dir := t.TempDir()
	store, err := index.OpenStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	lk := index.Lookup{Sources: reg, Index: "s3://data/meta/missing.index", Store: store, LazyOffsets: true}
	if _, err := lk.Quick(ctx, urls, 2); !errors.Is(err, source.ErrNotFound) {
		t.Fatalf("a missing index: %v, want not found", err)
	}
	p := filepath.Join(t.TempDir(), index.FileName)
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	if err := index.WriteAddressable(f, shards); err != nil {
		t.Fatal(err)
	}
	f.Close()
	reg.Register("file", &source.File{})
	lk.Index = p
	if _, _, err := loadRank(ctx, lk, urls, 0, 2); err != nil {
		t.Fatal(err)
	}
	if copies, _ := filepath.Glob(filepath.Join(dir, "objects", "*.idx")); len(copies) != 0 {
		t.Fatalf("a local index was copied: %v", copies)
	}
}
