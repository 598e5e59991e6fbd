package serve

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/shardload/shardload"
	"github.com/shardload/shardload/shard"
	"github.com/shardload/shardload/source"
	"github.com/shardload/shardload/wire"
)

// TestAbandonEpoch breaks out of an epoch part-way: the server stops the epoch's
// pipeline (blocked on a full ring: the trainer holds two of its three slabs and one
// batch is on its way), takes the slabs back, ends the epoch as abandoned and streams
// the next one in full, as a fresh session at that epoch gets it.
func TestAbandonEpoch(t *testing.T) {
	pattern := dataset(t)
	s := start(t, Options{URLs: []string{pattern}, Pipeline: shardload.Config{
		Fields: fields(t, "jpg", "cls:int"), Slabs: 3, SlabBytes: 4 << 20, ShuffleBuffer: 30}})
	h := wire.Hello{Version: Version, World: 1, Seed: 5, Epoch: 0, BatchSize: 7}
	cl, m := dial(t, s.Addr(), h)
	if m != nil {
		t.Fatal(m)
	}
	if cl.ready.Batches != 15 {
		t.Fatalf("ready %+v", cl.ready)
	}
	// Two batches, held and never released.
	for range 2 {
		if b := cl.batch(); b.Epoch != 0 {
			t.Fatalf("batch %+v", b)
		}
	}
	cl.send(wire.EpochRequest{Type: wire.TypeEpoch, Epoch: 1})
	// Batches of epoch 0 that were on their way are dropped, unreleased, until its end.
	var e wire.End
	for done := false; !done; {
		typ, b := cl.recv()
		switch typ {
		case wire.TypeBatch:
			var m wire.Batch
			json.Unmarshal(b, &m)
			if m.Epoch != 0 {
				t.Fatalf("batch of epoch %d before the end of epoch 0", m.Epoch)
			}
		case wire.TypeEnd:
			json.Unmarshal(b, &e)
			done = true
		default:
			t.Fatalf("unexpected %s", b)
		}
	}
	if e.Epoch != 0 || !e.Abandoned || e.Batches < 2 || e.Batches > 3 || e.Samples != int64(7*e.Batches) {
		t.Errorf("end of the abandoned epoch: %+v", e)
	}
	// Epoch 1 needs every slab: the server released epoch 0's.
	got, e1 := cl.epoch()
	if e1.Epoch != 1 || e1.Abandoned || e1.Batches != 15 || e1.Samples != 100 {
		t.Errorf("end of epoch 1: %+v", e1)
	}
	h.Epoch = 1
	fresh, m := dial(t, s.Addr(), h)
	if m != nil {
		t.Fatal(m)
	}
	want, _ := fresh.epoch()
	if !slices.EqualFunc(got, want, slices.Equal) {
		t.Fatalf("epoch 1 after an abandoned epoch 0: keys\n%v\nwant, as a fresh session gets them,\n%v", got, want)
	}
	// The session goes on: epoch 1 ended normally, and epoch 2 can be abandoned at once.
	cl.send(wire.EpochRequest{Type: wire.TypeEpoch, Epoch: 2})
	cl.batch()
	cl.send(wire.EpochRequest{Type: wire.TypeEpoch, Epoch: 3})
	for {
		typ, b := cl.recv()
		if typ == wire.TypeEnd {
			json.Unmarshal(b, &e)
			break
		}
	}
	if e.Epoch != 2 || !e.Abandoned {
		t.Errorf("end %+v, want epoch 2 abandoned", e)
	}
	if _, e := cl.epoch(); e.Epoch != 3 || e.Batches != 15 {
		t.Errorf("end %+v, want all of epoch 3", e)
	}
}

// TestAbandonedBatchesAreTheServers: after its epoch message, the trainer may not
// release the batches of the epoch it abandoned; a release must name the batch's
// epoch too.
func TestAbandonedBatchesAreTheServers(t *testing.T) {
	pattern := dataset(t)
	s := start(t, Options{URLs: []string{pattern}, Pipeline: shardload.Config{
		Fields: fields(t, "cls:int"), Slabs: 2, SlabBytes: 4 << 20}})
	h := wire.Hello{Version: Version, World: 1, BatchSize: 10}

	errorOf := func(cl *client) string {
		t.Helper()
		for {
			typ, b := cl.recv()
			if typ == wire.TypeError {
				var m wire.ErrorMessage
				json.Unmarshal(b, &m)
				if m.Code != CodeBadRequest {
					t.Errorf("error %s", b)
				}
				return m.Message
			}
		}
	}

	cl, m := dial(t, s.Addr(), h)
	if m != nil {
		t.Fatal(m)
	}
	b := cl.batch()
	cl.send(wire.EpochRequest{Type: wire.TypeEpoch, Epoch: 1})
	cl.release(b)
	if msg := errorOf(cl); !strings.Contains(msg, "release of slab") {
		t.Errorf("release after abandoning: %q", msg)
	}

	cl, m = dial(t, s.Addr(), h)
	if m != nil {
		t.Fatal(m)
	}
	b = cl.batch()
	b.Epoch = 4
	cl.release(b)
	if msg := errorOf(cl); !strings.Contains(msg, "of epoch 4, but it holds batch 0 of epoch 0") {
		t.Errorf("release naming another epoch: %q", msg)
	}
}

// TestReadyOrder: ready carries the order of the session's first epoch, the library's
// for the same settings, and the same for every rank of a job.
func TestReadyOrder(t *testing.T) {
	pattern := dataset(t)
	pipe := shardload.Config{Fields: fields(t, "cls:int"), Slabs: 2, SlabBytes: 4 << 20, ShuffleBuffer: 30}
	s := start(t, Options{URLs: []string{pattern}, Pipeline: pipe})
	var fps []string
	for rank := range 2 {
		cl, m := dial(t, s.Addr(), wire.Hello{Version: Version, Rank: rank, World: 2, Seed: 9, Epoch: 3, BatchSize: 8, DropLast: true})
		if m != nil {
			t.Fatal(m)
		}
		fps = append(fps, cl.ready.Order.Fingerprint)
		o := cl.ready.Order.Settings
		if o.Shards != 4 || o.Samples != 100 || o.Seed != 9 || o.Epoch != 3 || o.World != 2 || o.BatchSize != 8 ||
			!o.DropLast || !o.Shuffle || o.Window != 15 {
			t.Errorf("rank %d: order %+v", rank, o)
		}
		if fp := shardload.Order(o).Fingerprint(); fp != cl.ready.Order.Fingerprint {
			t.Errorf("rank %d: fingerprint %s of settings whose fingerprint is %s", rank, cl.ready.Order.Fingerprint, fp)
		}
	}
	if fps[0] != fps[1] || len(fps[0]) != 16 {
		t.Errorf("fingerprints %q", fps)
	}
	cfg := pipe
	cfg.URLs, cfg.World, cfg.Seed, cfg.Epoch, cfg.BatchSize, cfg.DropLast, cfg.Logf = []string{pattern}, 2, 9, 3, 8, true, t.Logf
	l, err := shardload.Open(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if want := l.Order().Fingerprint(); fps[0] != want {
		t.Errorf("fingerprint %s, the library's is %s", fps[0], want)
	}
}

// TestAbandonSlowSource abandons an epoch whose pipeline is stuck reading a shard: the
// read is cancelled and the epoch ends at once, with no batches.
func TestAbandonSlowSource(t *testing.T) {
	shards := shardPaths(t, dataset(t))
	bs := newBlockSource(t)
	reg := &source.Registry{}
	reg.Register("block", bs)
	// The counts are given: only the pipeline reads the shards.
	var infos []shard.Info
	for _, p := range shards {
		infos = append(infos, shard.Info{URL: "block://" + p, Samples: 25})
	}
	s := start(t, Options{Pipeline: shardload.Config{Shards: infos, Fields: fields(t, "cls:int"), Slabs: 2, SlabBytes: 4 << 20, Sources: reg}})
	cl, m := dial(t, s.Addr(), wire.Hello{Version: Version, World: 1, BatchSize: 10})
	if m != nil {
		t.Fatal(m)
	}
	recvOr(t, bs.opened, "the pipeline's first read")
	cl.send(wire.EpochRequest{Type: wire.TypeEpoch, Epoch: 1})
	typ, b := cl.recv()
	var e wire.End
	json.Unmarshal(b, &e)
	if typ != wire.TypeEnd || e.Epoch != 0 || !e.Abandoned || e.Batches != 0 {
		t.Fatalf("got %s, want the end of epoch 0, abandoned", b)
	}
	recvOr(t, bs.cancelled, "the cancelled read")
	bs.unblock()
	if _, e := cl.epoch(); e.Epoch != 1 || e.Batches != 10 || e.Samples != 100 {
		t.Errorf("end %+v", e)
	}
}
