package pipeline

import (
	"context"
	"testing"

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
	waitFor(t, "nothing", func() bool { return g.held() == 1 })
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
	pl.SetKnobs(1, 0, 0, source.Tuning{Parallel: 8, PartSize: 4 << 20})
	if pl.fetchContext(ctx) == ctx {
		t.Error("fetch settings not carried")
	}
}
