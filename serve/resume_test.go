package serve

import (
	"bytes"
	"encoding/json"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/shardload/shardload"
	"github.com/shardload/shardload/plan"
	"github.com/shardload/shardload/wire"
)

// seen is a batch a test client read: its number, keys, state and message as sent.
type seen struct {
	seq   int
	keys  []string
	state *wire.State
	raw   []byte
}

// epochSeen reads one epoch's batches, releasing each, and returns them with the wire.End
// and the end's message as sent.
func (cl *client) epochSeen() ([]seen, wire.End, []byte) {
	cl.t.Helper()
	var out []seen
	for {
		typ, b := cl.recv()
		switch typ {
		case wire.TypeBatch:
			var m wire.Batch
			if err := json.Unmarshal(b, &m); err != nil {
				cl.t.Fatal(err)
			}
			out = append(out, seen{seq: m.Seq, keys: cl.keys(m), state: m.State, raw: b})
			cl.release(m)
		case wire.TypeEnd:
			var e wire.End
			if err := json.Unmarshal(b, &e); err != nil {
				cl.t.Fatal(err)
			}
			return out, e, b
		default:
			cl.t.Fatalf("unexpected %s", b)
		}
	}
}

// untilError reads messages until an error message, and returns it.
func (cl *client) untilError() map[string]any {
	cl.t.Helper()
	for {
		typ, b := cl.recv()
		if typ == wire.TypeError {
			var m map[string]any
			json.Unmarshal(b, &m)
			return m
		}
	}
}

// sameSeen fails unless got are the batches want: the same numbers, keys and states.
func sameSeen(t *testing.T, what string, got, want []seen) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d batches, want %d", what, len(got), len(want))
	}
	for i := range want {
		g, w := got[i], want[i]
		if g.seq != w.seq || !slices.Equal(g.keys, w.keys) {
			t.Fatalf("%s: batch %d: seq %d keys %v, want seq %d keys %v", what, i, g.seq, g.keys, w.seq, w.keys)
		}
		if !samePosition(t, g.state, w.state) {
			t.Fatalf("%s: batch %d (seq %d): state %+v, want %+v", what, i, g.seq, g.state, w.state)
		}
	}
}

// samePosition reports whether two states are the same position: the same epoch,
// order and batch count, and runs that consumed as many samples of the order. (A
// resumed loader writes its runs after the state's: "2x14,2x7" where an
// uninterrupted one writes "2x21".)
func samePosition(t *testing.T, a, b *wire.State) bool {
	t.Helper()
	if a == nil || b == nil {
		return a == b
	}
	consumed := func(s *wire.State) int64 {
		runs, err := plan.ParseRuns(s.Runs)
		if err != nil {
			t.Fatalf("state %+v: %v", s, err)
		}
		var n int64
		for _, r := range runs {
			n += int64(r.World) * r.Consumed
		}
		return n
	}
	return a.Epoch == b.Epoch && a.Order == b.Order && a.Samples == b.Samples && a.Batches == b.Batches && consumed(a) == consumed(b)
}

// A session of version 3 opened with the state saved after k batches sends exactly
// the batches an uninterrupted session sends from batch k on, with the same states;
// so does an epoch message that carries a state, also when it abandons an epoch.
func TestResumeSession(t *testing.T) {
	pattern := dataset(t)
	fs := fields(t, "cls:int")
	s := start(t, Options{URLs: []string{pattern}, Pipeline: shardload.Config{Fields: fs, Slabs: 3, SlabBytes: 4 << 20, ShuffleBuffer: 30}})
	h := wire.Hello{Version: Version, Rank: 1, World: 2, Seed: 5, Epoch: 3, BatchSize: 7}

	// The uninterrupted session: epochs 3 and 4.
	cl, errm := dial(t, s.Addr(), h)
	if errm != nil {
		t.Fatal(errm)
	}
	if cl.ready.Version != Version {
		t.Errorf("ready of version %d to a hello of version %d", cl.ready.Version, Version)
	}
	first := cl.ready.State
	if first == nil || first.Epoch != 3 || first.Order == "" || first.Samples != 100 || first.Runs != "" || first.Batches != 0 {
		t.Fatalf("ready's state %+v: want the start of epoch 3", first)
	}
	e3, end3, _ := cl.epochSeen()
	if len(e3) != 8 || len(e3) != cl.ready.Batches {
		t.Fatalf("epoch 3: %d batches, ready said %d, want 8", len(e3), cl.ready.Batches)
	}
	for i, b := range e3 {
		if b.state == nil || b.state.Epoch != 3 || b.state.Batches != i+1 || b.state.Order != first.Order || b.state.Samples != 100 {
			t.Fatalf("batch %d: state %+v", i, b.state)
		}
	}
	if end3.State == nil || *end3.State != *e3[len(e3)-1].state {
		t.Fatalf("end of epoch 3: state %+v, want the last batch's %+v", end3.State, e3[len(e3)-1].state)
	}
	if next := shardload.State(*end3.State).NextEpoch(); next.Epoch != 4 || next.Batches != 0 || next.Runs != "" {
		t.Fatalf("the next epoch's start %+v", next)
	}
	cl.send(wire.EpochRequest{Type: wire.TypeEpoch, Epoch: 4})
	e4, end4, _ := cl.epochSeen()
	if len(e4) != 8 || end4.State == nil || end4.State.Epoch != 4 {
		t.Fatalf("epoch 4: %d batches, end %+v", len(e4), end4)
	}
	cl.send(map[string]string{"type": wire.TypeBye})
	// The library agrees with the uninterrupted session.
	want := libraryKeys(t, shardload.Config{URLs: []string{pattern}, Fields: fs, Rank: 1, World: 2, Seed: 5, Epoch: 3,
		BatchSize: 7, ShuffleBuffer: 30, Logf: t.Logf})
	for i := range want {
		if !slices.Equal(e3[i].keys, want[i]) {
			t.Fatalf("epoch 3 batch %d: keys %v, the library's %v", i, e3[i].keys, want[i])
		}
	}

	// after returns the state after k batches of an epoch read in full.
	after := func(batches []seen, start wire.State, k int) wire.State {
		if k == 0 {
			return start
		}
		return *batches[k-1].state
	}
	for _, k := range []int{0, 1, 4, 7, 8} {
		st := after(e3, *first, k)
		hk := h
		hk.State = &st
		if k%2 == 1 {
			hk.Epoch = 0 // the state's epoch, 3, is read
		}
		rc, errm := dial(t, s.Addr(), hk)
		if errm != nil {
			t.Fatalf("state after %d batches: %v", k, errm)
		}
		if rc.ready.State == nil || *rc.ready.State != st || rc.ready.Epoch != 3 || rc.ready.Batches != 8-k {
			t.Fatalf("state after %d batches: ready epoch %d, %d batches, state %+v; want epoch 3, %d batches, state %+v",
				k, rc.ready.Epoch, rc.ready.Batches, rc.ready.State, 8-k, st)
		}
		got, e, _ := rc.epochSeen()
		sameSeen(t, "epoch 3 resumed after "+strconv.Itoa(k)+" batches", got, e3[k:])
		if e.Epoch != 3 || e.Batches != 8-k || !samePosition(t, e.State, end3.State) {
			t.Fatalf("end of epoch 3 resumed after %d batches: %+v (state %+v), want %d batches, state %+v", k, e, e.State, 8-k, end3.State)
		}
		// The next epoch from a state in it, through the epoch message.
		j := (k + 2) % 8
		st4 := after(e4, wire.State(shardload.State(*end3.State).NextEpoch()), j)
		rc.send(wire.EpochRequest{Type: wire.TypeEpoch, State: &st4})
		got, e, _ = rc.epochSeen()
		sameSeen(t, "epoch 4 resumed after "+strconv.Itoa(j)+" batches (epoch message)", got, e4[j:])
		if !samePosition(t, e.State, end4.State) {
			t.Fatalf("end of epoch 4 resumed after %d batches: state %+v, want %+v", j, e.State, end4.State)
		}
		rc.send(map[string]string{"type": wire.TypeBye})
	}

	// An epoch message with a state abandons the epoch being read, and the epoch it
	// names starts from the state.
	st := *e3[2].state
	h3 := h
	h3.State = &st
	rc, errm := dial(t, s.Addr(), h3)
	if errm != nil {
		t.Fatal(errm)
	}
	b := rc.batch() // held: the server takes it back
	if b.Seq != 3 {
		t.Fatalf("first batch after a state after 3 batches: seq %d", b.Seq)
	}
	st4 := *e4[4].state
	rc.send(wire.EpochRequest{Type: wire.TypeEpoch, Epoch: 4, State: &st4})
	for {
		typ, msg := rc.recv()
		if typ == wire.TypeEnd {
			var e wire.End
			json.Unmarshal(msg, &e)
			if e.Epoch != 3 || !e.Abandoned {
				t.Fatalf("end after the epoch message: %s", msg)
			}
			break
		}
		if typ != wire.TypeBatch {
			t.Fatalf("while epoch 3 is abandoned: %s", msg)
		}
	}
	got, _, _ := rc.epochSeen()
	sameSeen(t, "epoch 4 resumed after 5 batches, abandoning epoch 3", got, e4[5:])
}

// A state that does not fit is refused with a code and a message that say why.
func TestResumeRefusals(t *testing.T) {
	pattern := dataset(t)
	fs := fields(t, "cls:int")
	s := start(t, Options{URLs: []string{pattern}, Pipeline: shardload.Config{Fields: fs, Slabs: 3, SlabBytes: 4 << 20, ShuffleBuffer: 30}})
	h := wire.Hello{Version: Version, Rank: 0, World: 2, Seed: 5, Epoch: 3, BatchSize: 7}
	cl, errm := dial(t, s.Addr(), h)
	if errm != nil {
		t.Fatal(errm)
	}
	good := *cl.ready.State
	b := cl.batch()
	cl.release(b)
	saved := *b.State

	for _, tc := range []struct {
		name       string
		epoch      int
		state      wire.State
		code, text string
	}{
		{"another epoch", 5, saved, CodeBadRequest, "hello: epoch 5, but the state is in epoch 3"},
		{"negative epoch", 0, wire.State{Epoch: -1}, CodeBadRequest, "the state's epoch -1 < 0"},
		{"another order", 3, wire.State{Epoch: 3, Order: "0123456789abcdef", Samples: 100, Runs: "2x7", Batches: 1}, CodeResume, "saved under another order"},
		{"another dataset size", 3, wire.State{Epoch: 3, Order: good.Order, Samples: 99, Runs: "2x7", Batches: 1}, CodeResume, "saved under another order"},
		{"bad runs", 3, wire.State{Epoch: 3, Order: good.Order, Samples: 100, Runs: "2y7", Batches: 1}, CodeResume, "is not WORLDxCONSUMED"},
	} {
		hk := h
		hk.Epoch, hk.State = tc.epoch, &tc.state
		_, m := dial(t, s.Addr(), hk)
		if m == nil || m["code"] != tc.code || !strings.Contains(m["message"].(string), tc.text) {
			t.Errorf("%s: %v, want code %s with %q", tc.name, m, tc.code, tc.text)
		}
	}

	// In an epoch message: a mismatched epoch is a protocol error, a state of
	// another order a resume error.
	cl.send(wire.EpochRequest{Type: wire.TypeEpoch, Epoch: 9, State: &saved})
	if m := cl.untilError(); m["code"] != CodeBadRequest || !strings.Contains(m["message"].(string), "epoch: epoch 9, but the state is in epoch 3") {
		t.Errorf("epoch message for epoch 9 with a state of epoch 3: %v", m)
	}
	cl, errm = dial(t, s.Addr(), h)
	if errm != nil {
		t.Fatal(errm)
	}
	other := wire.State{Epoch: 4, Order: "0123456789abcdef", Samples: 100, Runs: "2x7", Batches: 1}
	cl.send(wire.EpochRequest{Type: wire.TypeEpoch, State: &other})
	if m := cl.untilError(); m["code"] != CodeResume || !strings.Contains(m["message"].(string), "another order") {
		t.Errorf("epoch message with a state of another order: %v", m)
	}
}

// A hello of version 2 behaves as before version 3: a ready of version 2, no state in
// any message, and a state in the hello is ignored like any unknown member.
func TestResumeVersion2(t *testing.T) {
	pattern := dataset(t)
	fs := fields(t, "cls:int")
	s := start(t, Options{URLs: []string{pattern}, Pipeline: shardload.Config{Fields: fs, Slabs: 3, SlabBytes: 4 << 20, ShuffleBuffer: 30}})
	st := wire.State{Epoch: 1, Order: "0123456789abcdef", Samples: 100, Runs: "2x7", Batches: 1}
	cl, errm := dial(t, s.Addr(), wire.Hello{Version: 2, Rank: 1, World: 2, Seed: 5, Epoch: 3, BatchSize: 7, State: &st})
	if errm != nil {
		t.Fatal(errm)
	}
	if cl.ready.Version != 2 || cl.ready.Epoch != 3 || cl.ready.Batches != 8 {
		t.Fatalf("ready %+v: want version 2, epoch 3 from its start", cl.ready)
	}
	if _, ok := cl.raw["state"]; ok {
		t.Errorf("ready of a version 2 session has a state: %v", cl.raw)
	}
	want := libraryKeys(t, shardload.Config{URLs: []string{pattern}, Fields: fs, Rank: 1, World: 2, Seed: 5, Epoch: 3,
		BatchSize: 7, ShuffleBuffer: 30, Logf: t.Logf})
	for _, epoch := range []int{3, 4} {
		if epoch == 4 {
			cl.send(wire.EpochRequest{Type: wire.TypeEpoch, Epoch: 4, State: &st}) // the state is no member of version 2
			want = libraryKeys(t, shardload.Config{URLs: []string{pattern}, Fields: fs, Rank: 1, World: 2, Seed: 5, Epoch: 4,
				BatchSize: 7, ShuffleBuffer: 30, Logf: t.Logf})
		}
		got, e, raw := cl.epochSeen()
		var keys [][]string
		for i, b := range got {
			keys = append(keys, b.keys)
			if b.seq != i || bytes.Contains(b.raw, []byte(`"state"`)) {
				t.Fatalf("epoch %d batch %d of a version 2 session: %s", epoch, i, b.raw)
			}
		}
		if !slices.EqualFunc(keys, want, slices.Equal) {
			t.Fatalf("epoch %d: keys\n%v\nwant\n%v", epoch, keys, want)
		}
		if e.Epoch != epoch || bytes.Contains(raw, []byte(`"state"`)) {
			t.Errorf("end of a version 2 session: %s", raw)
		}
	}
}
