package pipeline

import (
	"context"
	"io"
	"sync"
	"testing"

	"github.com/shardload/shardload/decode"
	"github.com/shardload/shardload/internal/shardgen"
	"github.com/shardload/shardload/internal/testutil"
	"github.com/shardload/shardload/plan"
	"github.com/shardload/shardload/shard"
	"github.com/shardload/shardload/source"
)

// heldAtOpen is an Opener that records, at each open, how many worker tokens the
// pipeline's producers hold.
type heldAtOpen struct {
	Opener
	gate *gate
	mu   sync.Mutex
	held []int
}

func (o *heldAtOpen) record() {
	o.mu.Lock()
	o.held = append(o.held, o.gate.held())
	o.mu.Unlock()
}

func (o *heldAtOpen) Open(ctx context.Context, url string) (io.ReadCloser, error) {
	o.record()
	return o.Opener.Open(ctx, url)
}

func (o *heldAtOpen) OpenRange(ctx context.Context, url string, off, length int64) (io.ReadCloser, error) {
	o.record()
	return o.Opener.OpenRange(ctx, url, off, length)
}

func (o *heldAtOpen) OpenVersion(ctx context.Context, url, version string, off, length int64) (io.ReadCloser, error) {
	o.record()
	return o.Opener.OpenVersion(ctx, url, version, off, length)
}

// A producer opens its shard without a worker token: the open (on a store, a stat and
// the wait for the request's first byte) uses none of the process's CPU, and a token
// held through it would keep another shard's decoding waiting. It takes the token to
// read, gives it back at the end, and delivers every sample.
func TestProducerOpensWithoutWorker(t *testing.T) {
	path, f := binShard(t, 50, 5, 8, 64)
	workers := newGate(1)
	src := &heldAtOpen{Opener: source.Default, gate: workers}
	l := &Pipeline{p: Params{Sources: src, Shards: []shard.Info{{URL: path, Samples: 50}}, Fields: []decode.Field{f}, Logf: t.Logf}, workers: workers}
	l.pool.MaxFree = 1 << 20
	s := newSlot(plan.Span{URL: path, Take: 50}, 1<<20, nil) // room for every sample
	l.produce(context.Background(), s)

	if len(src.held) != 1 || src.held[0] != 0 {
		t.Fatalf("worker tokens held at each open: %v, want [0] (one open, no token)", src.held)
	}
	if n := workers.held(); n != 0 {
		t.Fatalf("%d worker tokens held after the producer ended", n)
	}
	got := 0
	for {
		m, ok, err := s.msgs.pop(context.Background())
		if !ok {
			break
		}
		if err != nil || m.err != nil || m.it == nil {
			t.Fatalf("message %d: %+v, %v", got, m, err)
		}
		got++
	}
	if got != 50 {
		t.Fatalf("%d samples delivered, want 50", got)
	}
}

// A producer gives its worker token to a waiting producer whose queue holds less once
// it has queued a quarter of its own queue, instead of reading on until its queue is
// full: the first window of an epoch needs samples of every lane.
func TestProducerYieldsToEmptierQueue(t *testing.T) {
	path, f := binShard(t, 200, 7, 1000, 2000)
	ctx := context.Background()
	workers := newGate(1)
	l := &Pipeline{p: Params{Sources: source.Default, Shards: []shard.Info{{URL: path, Samples: 200}}, Fields: []decode.Field{f}, Logf: t.Logf}, workers: workers}
	l.pool.MaxFree = 1 << 20
	const capacity = 1 << 20 // room for every sample: only the gate can stop it
	s := newSlot(plan.Span{URL: path, Take: 200}, capacity, nil)

	// The test holds the one token; the producer waits for it, then a second waiter,
	// whose queue holds more than the producer's, so that the producer gets it first.
	if !workers.acquire(ctx) {
		t.Fatal("no token")
	}
	done := make(chan struct{})
	go func() { l.produce(ctx, s); close(done) }()
	testutil.WaitFor(t, "the producer waits for a token", workers.waiters(1))
	other := make(chan bool)
	go func() { other <- workers.acquireFor(ctx, func() int64 { return 1 << 40 }) }()
	testutil.WaitFor(t, "a second waiter", workers.waiters(2))
	workers.release()

	// The producer yields once it has queued a quarter: the other waiter has the token
	// while the producer waits, and its queue holds a quarter and at most one sample more.
	if !<-other {
		t.Fatal("the other waiter got no token")
	}
	queued := s.queued.Load()
	maxWeight := s.weight(slotMsg{it: &item{buf: make([]byte, 0, 4096), key: "sample-00000000"}})
	if queued < capacity/4 || queued > capacity/4+maxWeight {
		t.Fatalf("the producer yielded with %d bytes queued, want %d to %d", queued, capacity/4, capacity/4+maxWeight)
	}
	if n := s.msgs.len(); n == 0 || n >= 200 {
		t.Fatalf("%d samples queued when it yielded", n)
	}
	workers.release()
	<-done
	if n := s.msgs.len(); n != 200 {
		t.Fatalf("%d samples queued in all, want 200", n)
	}
	if n := workers.held(); n != 0 {
		t.Fatalf("%d tokens held at the end", n)
	}
}

// binShard writes one shard of n samples, each a "bin" member of minBytes to
// maxBytes random bytes, and returns its path and the field that reads it.
func binShard(t *testing.T, n int, seed uint64, minBytes, maxBytes int) (string, decode.Field) {
	t.Helper()
	spec := shardgen.Spec{Shards: 1, SamplesPerShard: n, Seed: seed,
		Fields: []shardgen.Field{{Ext: "bin", Kind: shardgen.Random, MinBytes: minBytes, MaxBytes: maxBytes}}}
	paths, err := shardgen.Generate(t.TempDir(), spec)
	if err != nil {
		t.Fatal(err)
	}
	f, err := decode.ParseField("bin")
	if err != nil {
		t.Fatal(err)
	}
	return paths[0], f
}

// waiters returns a condition that holds when n producers wait for a token of g.
func (g *gate) waiters(n int) func() bool {
	return func() bool { g.mu.Lock(); defer g.mu.Unlock(); return len(g.waiting) == n }
}
