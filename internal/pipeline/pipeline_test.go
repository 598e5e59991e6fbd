package pipeline

import (
	"context"
	"io"
	"math"
	"runtime"
	"sync/atomic"
	"testing"

	"github.com/shardload/shardload/decode"
	"github.com/shardload/shardload/internal/testutil"
	"github.com/shardload/shardload/internal/tune"
	"github.com/shardload/shardload/plan"
	"github.com/shardload/shardload/shard"
	"github.com/shardload/shardload/source"
)

// A producer whose sample the mixer took while the producer waited for room on a
// full queue, and that is then stopped while it waits for its worker token again,
// must not recycle that sample: the mixer owns it. (It did, and -race reported the
// producer's put against the mixer's use under repeated mid-epoch Close.)
// The test plays the mixer: it lets the producer fill its queue's bytes, takes the
// worker token, takes one message and frees its bytes so that the producer's waiting
// send goes through, and stops the loader while the producer waits for the token.
func TestProducerStoppedAfterSendKeepsSample(t *testing.T) {
	path, f := binShard(t, 600, 3, 8, 16)
	l := &Pipeline{p: Params{Sources: source.Default, Shards: []shard.Info{{URL: path, Samples: 600}}, Fields: []decode.Field{f}, Logf: t.Logf}, workers: newGate(1)}
	l.pool.MaxFree = 1 << 20
	s := newSlot(plan.Span{URL: path, Take: 600}, 64<<10, nil) // a few dozen samples fill it
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan struct{})
	go func() { defer close(done); l.produce(ctx, s) }()

	// The producer waits for room without its worker token (it gives the token up
	// only then, or at the end of its 600 samples).
	testutil.WaitFor(t, "the queue is full and the token free", func() bool { return s.msgs.len() > 0 && l.workers.held() == 0 })
	full := s.msgs.len()
	if !l.workers.acquire(ctx) { // another producer's turn: the token is taken
		t.Fatal("no token")
	}
	first, ok, err := s.msgs.pop(ctx)
	if !ok || err != nil {
		t.Fatalf("pop: %v, %v", ok, err)
	}
	s.q.Release(first.weight) // the mixer takes a sample; the waiting send goes through
	testutil.WaitFor(t, "the producer's send went through", func() bool { return s.msgs.len() == full })
	cancel() // Close, while the producer waits for the token
	<-done

	got := []slotMsg{first}
	for {
		m, ok, _ := s.msgs.pop(context.Background())
		if !ok {
			break
		}
		got = append(got, m)
	}
	if len(got) != full+1 {
		t.Fatalf("%d messages, want %d", len(got), full+1)
	}
	for i, m := range got {
		if m.err != nil {
			continue
		}
		if m.it == nil || m.it.key == "" || m.it.refs != 1 || len(m.it.values) != 1 || len(m.it.values[0].Data) == 0 {
			t.Fatalf("message %d: the sample the mixer owns was recycled by the producer: %+v", i, m.it)
		}
	}
}

// A slot's queue is bounded by its bytes, not by a message count: small samples fill
// it until their weights (buffers, keys and bookkeeping) reach its bytes, far more
// of them than the 4096 messages the channel of a 4 MiB queue used to hold; large
// ones fill it by their bytes too, and one larger than the whole queue fits alone.
// A producer on a full queue waits without its worker token, goes on once the mixer
// frees a message's bytes, and gives up undelivered when the loader stops.
func TestSlotQueueBoundedByBytes(t *testing.T) {
	for _, tc := range []struct {
		queue   int64
		bufCap  int
		atLeast int // messages a full queue holds at least
	}{{4 << 20, 16, 8192}, {4 << 20, 64 << 10, 60}, {64 << 10, 1 << 20, 1}} {
		l := &Pipeline{workers: newGate(1)}
		s := newSlot(plan.Span{}, tc.queue, nil)
		ctx, cancel := context.WithCancel(context.Background())
		p := producer{pl: l, s: s, ctx: ctx}
		if !p.acquire() {
			t.Fatal("no worker token")
		}
		sample := func() *item {
			return &item{key: "sample-000000", buf: make([]byte, 8, tc.bufCap), values: make([]decode.Value, 1), refs: 1}
		}
		w := s.weight(slotMsg{it: sample()})
		want := int(tc.queue / w)
		type result struct{ delivered, goOn bool }
		stopped := make(chan result, 1)
		var sent atomic.Int64
		go func() {
			for {
				if d, g := p.send(slotMsg{it: sample()}); !g {
					stopped <- result{d, g}
					return
				}
				sent.Add(1)
			}
		}()
		testutil.WaitFor(t, "the queue is full", func() bool { return l.workers.held() == 0 })
		if got := s.msgs.len(); got != want || got < tc.atLeast {
			t.Errorf("queue of %d bytes, samples of %d buffer bytes (weight %d): %d messages, want %d (at least %d)", tc.queue, tc.bufCap, w, got, want, tc.atLeast)
		}
		m, ok, err := s.msgs.pop(ctx)
		if !ok || err != nil || m.weight != w {
			t.Fatalf("pop: %v, %v, weight %d, want %d", ok, err, m.weight, w)
		}
		s.q.Release(m.weight)
		// Past want+1 sends with its token given up, the producer waits for room again.
		testutil.WaitFor(t, "the producer's send went through and it waits again", func() bool { return sent.Load() == int64(want)+1 && l.workers.held() == 0 })
		cancel()
		if r := <-stopped; r.delivered {
			t.Errorf("a send stopped while it waited for room reports its sample delivered")
		}
		if got := s.msgs.len(); got != want {
			t.Errorf("%d messages after the stop, want %d", got, want)
		}
	}
	// Notices are charged their message: a shard of bad samples fills the queue too.
	if w := newSlot(plan.Span{}, 4<<20, nil).weight(slotMsg{skipped: 1, cause: io.ErrUnexpectedEOF}); w <= 0 {
		t.Errorf("a skip notice weighs %d bytes", w)
	}
}

// A slot's fixed cost is small and does not depend on its queue's bytes: a shard of
// four samples costs the same with a 64 KiB queue as with a 1 GiB one. (Its channel
// of a message per KiB cost 229 KB at 4 MiB, and makechan was a third of the CPU time
// on datasets of tiny shards.) With NoShuffle the queues take the shuffle buffer's
// bytes, and the budget stays what MemoryBudget counts.
func TestSlotQueues(t *testing.T) {
	perSlot := func(queue int64) (allocs, bytes float64) {
		it := &item{key: "k", buf: make([]byte, 8), refs: 1}
		ctx := context.Background()
		open := func() {
			s := newSlot(plan.Span{}, queue, nil)
			for range 4 {
				w := s.weight(slotMsg{it: it})
				if !s.q.TryAcquire(w) {
					t.Fatal("no room for a sample")
				}
				s.msgs.push(slotMsg{it: it, weight: w})
			}
			s.msgs.close()
			for {
				m, ok, _ := s.msgs.pop(ctx)
				if !ok {
					break
				}
				s.q.Release(m.weight)
			}
		}
		const runs = 1000
		allocs = testing.AllocsPerRun(runs, open)
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		for range runs {
			open()
		}
		runtime.ReadMemStats(&after)
		return allocs, float64(after.TotalAlloc-before.TotalAlloc) / runs
	}
	allocs0, bytes0 := perSlot(64 << 10)
	for _, queue := range []int64{64 << 10, 4 << 20, 64 << 20, 1 << 30} {
		allocs, bytes := perSlot(queue)
		t.Logf("queue of %d bytes: %.0f allocations, %.0f bytes per slot", queue, allocs, bytes)
		if allocs != allocs0 || math.Abs(bytes-bytes0) > 64 {
			t.Errorf("queue of %d bytes: %.0f allocations of %.0f bytes per slot, but %.0f of %.0f at 64 KiB", queue, allocs, bytes, allocs0, bytes0)
		}
		if bytes > 2048 {
			t.Errorf("queue of %d bytes: %.0f bytes per slot", queue, bytes)
		}
	}
	cfg := Params{Knobs: tune.Knobs{QueueBytes: 4 << 20}, ShuffleBytes: 64 << 20, OpenShards: 4}
	pl := &Pipeline{p: cfg, workers: newGate(1)}
	pl.SetKnobs(cfg.Knobs)
	if got := pl.slotQueueBytes(); got != cfg.Knobs.QueueBytes {
		t.Errorf("shuffled: queue %d, want %d", got, cfg.Knobs.QueueBytes)
	}
	pl.SetKnobs(tune.Knobs{Workers: 2, QueueBytes: 8 << 20})
	if got := pl.slotQueueBytes(); got != 8<<20 {
		t.Errorf("after SetKnobs: queue %d, want %d", got, 8<<20)
	}
	pl.SetKnobs(tune.Knobs{Workers: 2, QueueBytes: cfg.Knobs.QueueBytes})
	pl.p.NoShuffle, cfg.NoShuffle = true, true
	got := pl.slotQueueBytes()
	if got != cfg.Knobs.QueueBytes+cfg.ShuffleBytes/int64(cfg.OpenShards) {
		t.Errorf("no shuffle: queue %d", got)
	}
	if int64(cfg.OpenShards)*got > int64(cfg.OpenShards)*cfg.Knobs.QueueBytes+cfg.ShuffleBytes {
		t.Errorf("no shuffle: %d queues of %d bytes exceed the budget's %d", cfg.OpenShards, got, int64(cfg.OpenShards)*cfg.Knobs.QueueBytes+cfg.ShuffleBytes)
	}
}
