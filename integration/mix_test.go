package integration

import (
	"encoding/json"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/shardload/shardload/internal/shardgen"
	"github.com/shardload/shardload/internal/testutil"
)

var mixCheck = func() string { p, _ := filepath.Abs("../client/python/tests/mix_check.py"); return p }()

// mixResult is mix_check.py's read line.
type mixResult struct {
	Batches     [][]string
	State       map[string]any
	Fingerprint string
	LastEpoch   *struct {
		Samples int
		Streams []struct{ Samples, Bytes, Skipped int64 }
	} `json:"last_epoch"`
}

// mixRead runs mix_check.py read with spec.
func mixRead(t *testing.T, py, socket string, spec map[string]any) mixResult {
	t.Helper()
	b, _ := json.Marshal(spec)
	lines, err := startScript(t, py, mixCheck, "read", socket, string(b)).wait(t)
	if err != nil {
		t.Fatalf("mix_check.py read %s: %v", b, err)
	}
	var r mixResult
	raw, _ := json.Marshal(lines[0])
	if err := json.Unmarshal(raw, &r); err != nil {
		t.Fatal(err)
	}
	return r
}

func flat(batches [][]string) []string {
	var out []string
	for _, b := range batches {
		out = append(out, b...)
	}
	return out
}

// TestMixThroughServe: streams of 1,000 (A) and 4,000 (B) samples at 1:1 in epochs
// of 2,000, through serve and the Python client: each epoch has 1,000 ± 16 of A and
// no sample twice; B's samples over 4 epochs are all its 4,000 once; every 256
// samples hold A at 0.35-0.65; the same settings give the same order; the state
// after 40 batches restores exactly the rest in a new client; two ranks read the
// one-rank epoch's samples once each; stratified batches of 16 at 3:1 hold 12 + 4
// rows; per_stream batches one stream each; the end message counts per stream; an
// endless dataset reads on across epochs.
func TestMixThroughServe(t *testing.T) {
	py := python(t)
	dir := t.TempDir()
	if _, err := shardgen.Generate(dir, shardgen.Spec{Shards: 50, SamplesPerShard: 100,
		Fields: []shardgen.Field{{Ext: "bin", Kind: shardgen.Random, MinBytes: 50, MaxBytes: 200}, {Ext: "cls", Kind: shardgen.Class}}}); err != nil {
		t.Fatal(err)
	}
	a := "file://" + filepath.Join(dir, "train-{000000..000009}.tar")
	b := "file://" + filepath.Join(dir, "train-{000010..000049}.tar")
	inA := func(k string) bool { return k < "s000010" }
	srv := startServer(t, "", "--allow", "file://"+dir+"/")
	streams := []map[string]any{{"urls": a, "weight": 1}, {"urls": b, "weight": 1}}
	seenB := map[string]int{}
	var epoch1 []string
	for epoch := range 4 {
		spec := map[string]any{"streams": streams, "epoch_samples": 2000, "epoch": epoch}
		r := mixRead(t, py, srv.socket, spec)
		keys := flat(r.Batches)
		seen := map[string]bool{}
		nA := 0
		for _, k := range keys {
			if seen[k] {
				t.Fatalf("epoch %d: %s twice", epoch, k)
			}
			seen[k] = true
			if inA(k) {
				nA++
			} else {
				seenB[k]++
			}
		}
		if lo, hi := testutil.WindowCounts(keys, 256, inA); lo < 90 || hi > 166 {
			t.Fatalf("epoch %d: 256 consecutive samples hold %d to %d of A", epoch, lo, hi)
		}
		if len(keys) != 2000 || nA < 1000-16 || nA > 1000+16 {
			t.Fatalf("epoch %d: %d samples, %d of A", epoch, len(keys), nA)
		}
		if e := r.LastEpoch; e == nil || len(e.Streams) != 2 || e.Streams[0].Samples != int64(nA) || e.Streams[1].Samples != int64(2000-nA) || e.Streams[0].Bytes <= 0 {
			t.Fatalf("epoch %d: last_epoch %+v, read %d of A", epoch, r.LastEpoch, nA)
		}
		if epoch == 1 {
			epoch1 = keys
			if again := mixRead(t, py, srv.socket, spec); strings.Join(flat(again.Batches), " ") != strings.Join(keys, " ") {
				t.Fatal("the same settings read another order")
			}
			// Two ranks.
			var two []string
			for rank := range 2 {
				s := map[string]any{"streams": streams, "epoch_samples": 2000, "epoch": epoch, "rank": rank, "world": 2}
				two = append(two, flat(mixRead(t, py, srv.socket, s).Batches)...)
			}
			// The same samples: the window the two share is split by items, each
			// rank yielding its runs of every lane in the window's order.
			if strings.Join(slices.Sorted(slices.Values(two)), " ") != strings.Join(slices.Sorted(slices.Values(keys)), " ") {
				t.Fatal("two ranks read another epoch than one")
			}
			// 40 batches, the state, the rest in a new client.
			s := map[string]any{"streams": streams, "epoch_samples": 2000, "epoch": epoch, "n": 40}
			head := mixRead(t, py, srv.socket, s)
			s = map[string]any{"streams": streams, "epoch_samples": 2000, "state": head.State}
			rest := mixRead(t, py, srv.socket, s)
			if got := append(flat(head.Batches), flat(rest.Batches)...); strings.Join(got, " ") != strings.Join(keys, " ") {
				t.Fatalf("40 batches and the rest after their state: %d samples, not the epoch's %d in order", len(got), len(keys))
			}
		}
	}
	if len(seenB) != 4000 {
		t.Fatalf("B: %d distinct samples in 4 epochs, want 4000", len(seenB))
	}
	for k, n := range seenB {
		if n != 1 {
			t.Fatalf("B: %s read %d times in 4 epochs", k, n)
		}
	}

	// Batching.
	for _, batching := range []string{"stratified", "per_stream"} {
		r := mixRead(t, py, srv.socket, map[string]any{"streams": []map[string]any{{"urls": b, "weight": 3}, {"urls": a, "weight": 1}},
			"batching": batching, "epoch_samples": 1600})
		if len(r.Batches) != 100 {
			t.Fatalf("%s: %d batches", batching, len(r.Batches))
		}
		for i, keys := range r.Batches {
			nA := 0
			for _, k := range keys {
				if inA(k) {
					nA++
				}
			}
			if len(keys) != 16 || batching == "stratified" && nA != 4 || batching == "per_stream" && nA != 0 && nA != 16 {
				t.Fatalf("%s: batch %d holds %d of A in %d rows", batching, i, nA, len(keys))
			}
		}
	}

	// The server's own mix (serve --stream), for a hello that names none.
	own := startServer(t, "", "--stream", a+" weight=1", "--stream", b+" weight=1", "--epoch-samples", "2000")
	r := mixRead(t, py, own.socket, map[string]any{"epoch": 1})
	if got := flat(r.Batches); strings.Join(got, " ") != strings.Join(epoch1, " ") {
		t.Fatalf("the server's own mix read %d samples, not the epoch the hello's mix reads", len(got))
	}

	// Endless: epochs follow one another.
	spec, _ := json.Marshal(map[string]any{"streams": []map[string]any{{"urls": a, "choose": 160}, {"urls": b, "choose": 160}}, "n": 45})
	lines, err := startScript(t, py, mixCheck, "dataset", srv.socket, string(spec)).wait(t)
	if err != nil {
		t.Fatal(err)
	}
	var end struct {
		Batches int
		Epochs  []int
		HasLen  bool `json:"has_len"`
	}
	raw, _ := json.Marshal(lines[0])
	json.Unmarshal(raw, &end)
	if end.Batches != 45 || len(end.Epochs) < 2 || end.HasLen {
		t.Fatalf("endless dataset: %+v (20 batches an epoch)", end)
	}
}
