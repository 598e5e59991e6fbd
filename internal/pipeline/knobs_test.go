package pipeline

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/shardload/shardload/internal/shardgen"
	"github.com/shardload/shardload/internal/testutil"
	"github.com/shardload/shardload/internal/tune"
	"github.com/shardload/shardload/shard"
	"github.com/shardload/shardload/source"
)

func TestGateLimit(t *testing.T) {
	g := newGate(1)
	ctx := context.Background()
	if !g.acquire(ctx) {
		t.Fatal("no first token")
	}
	got := make(chan bool)
	go func() { got <- g.acquire(ctx) }()
	// The second waits until the limit rises.
	testutil.WaitFor(t, "nothing", func() bool { return g.held() == 1 })
	select {
	case <-got:
		t.Fatal("a second token under a limit of 1")
	default:
	}
	g.setLimit(2)
	if !<-got {
		t.Fatal("the waiter got no token after the limit rose")
	}
	// Lowering the limit leaves holders be; the next waits for two releases.
	g.setLimit(1)
	cctx, cancel := context.WithCancel(ctx)
	go func() { got <- g.acquire(cctx) }()
	g.release()
	if g.held() != 1 {
		t.Fatalf("%d held", g.held())
	}
	cancel()
	if <-got {
		t.Fatal("a token over the lowered limit")
	}
	g.release()
	if !g.acquire(ctx) || g.held() != 1 {
		t.Fatal("no token after both releases")
	}
}

func TestFetchContext(t *testing.T) {
	pl := &Pipeline{workers: newGate(1)}
	ctx := context.Background()
	if pl.fetchContext(ctx) != ctx {
		t.Error("a context changed with no fetch settings")
	}
	pl.SetKnobs(tune.Knobs{Workers: 1, FetchParallel: 8, FetchPartSize: 4 << 20})
	if pl.fetchContext(ctx) == ctx {
		t.Error("fetch settings not carried")
	}
}

// Compression tells a compressed shard by its bytes, whatever its name says.
func TestCompressed(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, c shard.Compression) string {
		var b bytes.Buffer
		if err := shardgen.WriteShard(&b, shardgen.Spec{Shards: 1, Samples: []int{3}, Compression: c}.Defaults(), 0); err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	plain, zst, gz := write("plain.tar", shard.None), write("zstd-named.tar", shard.Zstd), write("named.tar.gz", shard.None)
	for _, tc := range []struct {
		infos   []string
		url     string
		want    shard.Compression
		assumed bool
	}{
		{[]string{plain}, plain, shard.None, false},
		{[]string{zst}, zst, shard.Zstd, false},         // its bytes say so
		{[]string{plain, gz}, plain, shard.Gzip, false}, // a name says so
		{[]string{plain}, "", shard.None, true},         // nothing read from its start: assumed
		{[]string{plain}, plain + ".missing", shard.None, true},
	} {
		var infos []shard.Info
		for _, u := range tc.infos {
			infos = append(infos, shard.Info{URL: u})
		}
		if got, assumed := Compression(context.Background(), source.Default, infos, tc.url); got != tc.want || assumed != tc.assumed {
			t.Errorf("%v, %s: compression %v (assumed %v), want %v (%v)", tc.infos, tc.url, got, assumed, tc.want, tc.assumed)
		}
	}
	// Names that say several: the one whose decompressor holds the most.
	if got := CompressionOfNames([]shard.Info{{URL: "a.tar.gz"}, {URL: "b.tar.zst"}, {URL: "c.tar"}}); got != shard.Zstd {
		t.Errorf("gzip and zstd names: %v, want zstd", got)
	}
}

// A free token goes to the waiter whose queue holds the least, ties to the one that
// has waited longest; a waiter whose context ends is dropped, and one handed a token
// as its context ended hands it on.
func TestGateLeastQueuedFirst(t *testing.T) {
	g := newGate(1)
	ctx := context.Background()
	if !g.acquire(ctx) {
		t.Fatal("no first token")
	}
	fills := []int64{100, 0, 0, 50}
	got := make(chan int, len(fills))
	for i, f := range fills {
		go func() {
			if g.acquireFor(ctx, func() int64 { return f }) {
				got <- i
			}
		}()
		testutil.WaitFor(t, "the waiter queued", g.waiters(i+1))
	}
	var order []int
	for range fills {
		g.release()
		order = append(order, <-got)
	}
	if want := []int{1, 2, 3, 0}; !slices.Equal(order, want) {
		t.Fatalf("tokens went to waiters %v, want %v (least queued first, ties in arrival order)", order, want)
	}
	cctx, cancel := context.WithCancel(ctx)
	done := make(chan bool)
	go func() { done <- g.acquireFor(cctx, nil) }()
	testutil.WaitFor(t, "the waiter queued", g.contended)
	cancel()
	if <-done {
		t.Fatal("a token after the context ended")
	}
	if g.contended() || g.held() != 1 {
		t.Fatalf("after a cancelled wait: contended %v, %d held, want false, 1", g.contended(), g.held())
	}
	g.release()
	if g.held() != 0 {
		t.Fatalf("%d held after every release", g.held())
	}
}
