package pipeline

import (
	"context"
	"testing"
	"time"

	"github.com/shardload/shardload/decode"
	"github.com/shardload/shardload/internal/shardgen"
	"github.com/shardload/shardload/shard"
	"github.com/shardload/shardload/source"
)

// A producer whose sample the mixer took while the producer waited for a full
// channel, and that is then stopped while it waits for its worker token again, must
// not recycle that sample: the mixer owns it. (It did, and -race reported the
// producer's put against the mixer's use under repeated mid-epoch Close.)
// The test plays the mixer: it lets the producer fill its channel, takes the worker
// token, takes one message so that the producer's blocked send goes through, and
// stops the loader while the producer waits for the token.
func TestProducerStoppedAfterSendKeepsSample(t *testing.T) {
	spec := shardgen.Spec{Shards: 1, SamplesPerShard: 600, Seed: 3,
		Fields: []shardgen.Field{{Ext: "bin", Kind: shardgen.Random, MinBytes: 8, MaxBytes: 16}}}
	paths, err := shardgen.Generate(t.TempDir(), spec)
	if err != nil {
		t.Fatal(err)
	}
	f, err := decode.ParseField("bin")
	if err != nil {
		t.Fatal(err)
	}
	l := &Pipeline{p: Params{Sources: source.Default, Shards: []shard.Info{{URL: paths[0], Samples: 600}}, Fields: []decode.Field{f}, Logf: t.Logf}, workers: make(chan struct{}, 1)}
	l.pool.MaxFree = 1 << 20
	s := newSlot(shard.Span{URL: paths[0], Take: 600}, 256<<10) // the channel, not the bytes, fills
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan struct{})
	go func() { defer close(done); l.produce(ctx, s) }()

	// waitFor polls cond; the deadline only guards against a hang.
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(20 * time.Second); !cond(); {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting until %s", what)
			}
			time.Sleep(time.Millisecond)
		}
	}
	// The producer blocks on its full channel without its worker token.
	waitFor("the channel is full and the token free", func() bool { return len(s.ch) == cap(s.ch) && len(l.workers) == 0 })
	l.workers <- struct{}{} // another producer's turn: the token is taken
	first := <-s.ch         // the mixer takes a sample; the blocked send goes through
	waitFor("the producer's send went through", func() bool { return len(s.ch) == cap(s.ch) })
	cancel() // Close, while the producer waits for the token
	<-done

	got := []slotMsg{first}
	for m := range s.ch {
		got = append(got, m)
	}
	if len(got) != cap(s.ch)+1 {
		t.Fatalf("%d messages, want %d", len(got), cap(s.ch)+1)
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

// A slot's channel holds a message per KiB of its queue (256 to 16384), so that the
// bytes bound the queue, not the message count; with NoShuffle the queues take the
// shuffle buffer's bytes, and the budget stays what MemoryBudget counts.
func TestSlotQueues(t *testing.T) {
	for _, tc := range []struct {
		queue int64
		want  int
	}{{4 << 20, 4096}, {64 << 10, 256}, {1 << 30, 16384}} {
		if got := cap(newSlot(shard.Span{}, tc.queue).ch); got != tc.want {
			t.Errorf("queue of %d bytes: channel of %d messages, want %d", tc.queue, got, tc.want)
		}
	}
	cfg := Params{QueueBytes: 4 << 20, ShuffleBytes: 64 << 20, OpenShards: 4}
	if got := slotQueueBytes(cfg); got != cfg.QueueBytes {
		t.Errorf("shuffled: queue %d, want %d", got, cfg.QueueBytes)
	}
	cfg.NoShuffle = true
	got := slotQueueBytes(cfg)
	if got != cfg.QueueBytes+cfg.ShuffleBytes/int64(cfg.OpenShards) {
		t.Errorf("no shuffle: queue %d", got)
	}
	if int64(cfg.OpenShards)*got > int64(cfg.OpenShards)*cfg.QueueBytes+cfg.ShuffleBytes {
		t.Errorf("no shuffle: %d queues of %d bytes exceed the budget's %d", cfg.OpenShards, got, int64(cfg.OpenShards)*cfg.QueueBytes+cfg.ShuffleBytes)
	}
}
