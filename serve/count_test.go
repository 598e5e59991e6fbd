package serve

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shardload/shardload"
	"github.com/shardload/shardload/index"
	"github.com/shardload/shardload/source"
	"github.com/shardload/shardload/wire"
)

// blockSource serves block:///path URLs from the file at path, but each Open waits
// until the test unblocks it or its context ends. It says when an Open begins and
// when one gives up because its context ended.
type blockSource struct {
	file      source.File
	opened    chan string
	cancelled chan string
	unblocked chan struct{}
	once      sync.Once
}

func newBlockSource(t *testing.T) *blockSource {
	b := &blockSource{opened: make(chan string, 64), cancelled: make(chan string, 64), unblocked: make(chan struct{})}
	t.Cleanup(b.unblock)
	return b
}

func (b *blockSource) unblock() { b.once.Do(func() { close(b.unblocked) }) }

func (b *blockSource) path(url string) string { return strings.TrimPrefix(url, "block://") }

func (b *blockSource) Stat(ctx context.Context, url string) (source.Info, error) {
	return b.file.Stat(ctx, b.path(url))
}

func (b *blockSource) Open(ctx context.Context, url string) (io.ReadCloser, error) {
	if _, err := os.Stat(b.path(url)); err != nil {
		return b.file.Open(ctx, b.path(url)) // a missing object (an index beside the shards) answers at once
	}
	select {
	case b.opened <- url:
	default:
	}
	select {
	case <-b.unblocked:
		return b.file.Open(ctx, b.path(url))
	case <-ctx.Done():
		select {
		case b.cancelled <- url:
		default:
		}
		return nil, ctx.Err()
	}
}

var _ source.Source = (*blockSource)(nil)

// recvOr returns the next value of c, failing the test when none comes in time (a
// guard against a hang, not a synchronisation).
func recvOr[T any](t *testing.T, c <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-c:
		return v
	case <-time.After(30 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
		panic("unreachable")
	}
}

// shardPaths returns the paths of the shards of dataset(t), in order.
func shardPaths(t *testing.T, pattern string) []string {
	t.Helper()
	shards, err := filepath.Glob(filepath.Join(filepath.Dir(pattern), "*.tar"))
	if err != nil || len(shards) != 4 {
		t.Fatalf("shards %v: %v", shards, err)
	}
	return shards
}

// blockServer serves the dataset of dataset(t) and lets trainers name block:/// URLs;
// it returns the server, the blocking source and the dataset's shard paths.
func blockServer(t *testing.T, opts Options) (*Server, *blockSource, []string) {
	t.Helper()
	pattern := dataset(t)
	// No index: the block:/// datasets are counted (their sizes and first samples
	// read), through the blocking source.
	os.Remove(filepath.Join(filepath.Dir(pattern), index.FileName))
	shards := shardPaths(t, pattern)
	bs := newBlockSource(t)
	reg := &source.Registry{}
	reg.Register("file", &source.File{})
	reg.Register("block", bs)
	opts.URLs = []string{pattern}
	opts.Allow = append(opts.Allow, "block:///")
	opts.Pipeline = shardload.Config{Fields: fields(t, "cls:int"), Slabs: 2, SlabBytes: 4 << 20, Sources: reg}
	return start(t, opts), bs, shards
}

// TestCountPerDataset: while one dataset's count is stuck, a session on another
// dataset gets its ready and its batches; the stuck one's session follows once the
// count goes on.
func TestCountPerDataset(t *testing.T) {
	s, bs, shards := blockServer(t, Options{})
	a := dialRaw(t, s.Addr(), wire.Hello{Version: Version, World: 1, BatchSize: 5, URLs: []string{"block://" + shards[0]}})
	recvOr(t, bs.opened, "the count of dataset A")

	b, m := dial(t, s.Addr(), wire.Hello{Version: Version, World: 1, BatchSize: 10})
	if m != nil {
		t.Fatal(m)
	}
	if _, e := b.epoch(); e.Samples != 100 {
		t.Errorf("dataset B: end %+v", e)
	}
	select {
	case <-bs.cancelled:
		t.Fatal("dataset A's count was cancelled")
	default:
	}

	bs.unblock()
	if m := a.awaitReady(); m != nil {
		t.Fatal(m)
	}
	if _, e := a.epoch(); e.Samples != 25 {
		t.Errorf("dataset A: end %+v", e)
	}
}

// TestCountWaitersLeave: a session waiting for a stuck count ends when its trainer
// leaves; the count goes on while another session waits for it, and is cancelled
// when none does. Nothing is kept of it: a later session counts again.
func TestCountWaitersLeave(t *testing.T) {
	s, bs, shards := blockServer(t, Options{})
	url := "block://" + shards[1]
	h := wire.Hello{Version: Version, World: 1, BatchSize: 5, URLs: []string{url}}
	key := countKey(shardload.Config{URLs: []string{url}})
	waiters := func() int {
		s.countMu.Lock()
		defer s.countMu.Unlock()
		if c := s.counting[key]; c != nil {
			return c.waiters
		}
		return 0
	}

	a1 := dialRaw(t, s.Addr(), h)
	recvOr(t, bs.opened, "the count")
	a2 := dialRaw(t, s.Addr(), h)
	waitUntil(t, "two sessions wait for the count", func() bool { return waiters() == 2 })
	if n := s.Sessions(); n != 2 {
		t.Fatalf("%d sessions", n)
	}

	a1.c.Close()
	waitUntil(t, "the first session ends", func() bool { return s.Sessions() == 1 })
	if n := waiters(); n != 1 {
		t.Fatalf("%d sessions wait for the count, want 1: it must go on", n)
	}

	a2.c.Close()
	waitUntil(t, "the second session ends", func() bool { return s.Sessions() == 0 })
	if got := recvOr(t, bs.cancelled, "the count's cancellation"); got != url {
		t.Errorf("cancelled %s", got)
	}
	s.countMu.Lock()
	inFlight, kept := len(s.counting), len(s.counts)
	s.countMu.Unlock()
	if inFlight != 0 || kept != 0 {
		t.Errorf("%d counts in flight, %d kept after a cancelled count", inFlight, kept)
	}

	bs.unblock()
	a3, m := dial(t, s.Addr(), h)
	if m != nil {
		t.Fatal(m)
	}
	if _, e := a3.epoch(); e.Samples != 25 {
		t.Errorf("end %+v", e)
	}
}

// TestCountCacheBounded: with MaxDatasets 2, the counts of at most two datasets are
// kept, the least recently used dropped first.
func TestCountCacheBounded(t *testing.T) {
	s, bs, shards := blockServer(t, Options{MaxDatasets: 2})
	bs.unblock()
	urls := make([]string, len(shards))
	for i, p := range shards {
		urls[i] = "block://" + p
	}
	for _, i := range []int{0, 1, 0, 2} {
		cl, m := dial(t, s.Addr(), wire.Hello{Version: Version, World: 1, BatchSize: 5, URLs: []string{urls[i]}})
		if m != nil {
			t.Fatal(m)
		}
		cl.c.Close()
		s.countMu.Lock()
		n, l := len(s.counts), s.lru.Len()
		s.countMu.Unlock()
		if n > 2 || l != n {
			t.Fatalf("%d datasets kept (%d in the LRU list), want at most 2", n, l)
		}
	}
	s.countMu.Lock()
	defer s.countMu.Unlock()
	for i, want := range []bool{true, false, true} {
		if _, ok := s.counts[countKey(shardload.Config{URLs: []string{urls[i]}})]; ok != want {
			t.Errorf("dataset %d kept: %v, want %v", i, ok, want)
		}
	}

	if _, err := Listen(Options{Socket: filepath.Join(t.TempDir(), "s.sock"), MaxDatasets: -1}); err == nil {
		t.Error("Listen with MaxDatasets -1")
	}
}
