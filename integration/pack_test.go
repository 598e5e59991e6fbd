package integration

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"testing"

	"github.com/shardload/shardload/internal/testutil"
	"github.com/shardload/shardload/megatron"
)

var packCheck = func() string { p, _ := filepath.Abs("../client/python/tests/pack_check.py"); return p }()

// packResult is pack_check.py's line.
type packResult struct {
	Rows    [][]int64
	Batches int
	State   map[string]any
	Length  int
}

func packRead(t *testing.T, py, mode, socket string, spec map[string]any) packResult {
	t.Helper()
	b, _ := json.Marshal(spec)
	lines, err := startScript(t, py, packCheck, mode, socket, string(b)).wait(t)
	if err != nil {
		t.Fatalf("pack_check.py %s %s: %v", mode, b, err)
	}
	var r packResult
	raw, _ := json.Marshal(lines[0])
	if err := json.Unmarshal(raw, &r); err != nil {
		t.Fatal(err)
	}
	return r
}

// megatronDataset returns a Megatron dataset of n documents of 1 to 60 tokens
// (uint16; document i starts with token i+1, none is 0, the eos) as .idx and .bin
// bytes.
func megatronDataset(t *testing.T, n int) (idx, bin []byte) {
	t.Helper()
	var bb, ib bytes.Buffer
	w, err := megatron.NewWriter(&bb, &ib, megatron.Uint16)
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(11, 3))
	for i := range n {
		doc := make([]int64, 1+r.IntN(60))
		doc[0] = int64(i + 1)
		for j := 1; j < len(doc); j++ {
			doc[j] = 1 + r.Int64N(60000)
		}
		if err := w.AddDocument(doc); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return ib.Bytes(), bb.Bytes()
}

func rowKey(r []int64) string { return fmt.Sprint(r) }

// TestPackedThroughServe: a Megatron dataset in MinIO, packed by "shardload serve"
// for the Python client: every batch's columns agree (checked in Python: dtypes,
// shapes, cu_seqlens where position_ids are 0, max_seqlen); two ranks read the
// one-rank epoch's rows once each, with as many batches each; the state after 3
// batches of two ranks resumes on three ranks, which read exactly the rest; the
// same epoch through ShardloadDataset and a DataLoader is the client's rows then
// pad; a hello with pack and fields is refused.
func TestPackedThroughServe(t *testing.T) {
	py := python(t)
	m := testutil.MinIO(t)
	m.CreateBucket(t, "corpora")
	idx, bin := megatronDataset(t, 500)
	m.Put(t, "corpora", "corpus/web.idx", idx)
	m.Put(t, "corpora", "corpus/web.bin", bin)
	url := "s3://corpora/corpus/web.idx"
	srv := startServerEnv(t, m.Env(), "", url)
	const spec = "tokens:32:eos=0"
	base := map[string]any{"pack": spec, "batch": 4, "seed": 9, "epoch": 1}
	with := func(kv ...any) map[string]any {
		out := map[string]any{}
		for k, v := range base {
			out[k] = v
		}
		for i := 0; i < len(kv); i += 2 {
			out[kv[i].(string)] = kv[i+1]
		}
		return out
	}

	one := packRead(t, py, "read", srv.socket, base)
	if len(one.Rows) < 100 || one.Length != one.Batches {
		t.Fatalf("one rank: %d rows in %d batches, len() %d", len(one.Rows), one.Batches, one.Length)
	}
	if one.State["epoch"] != 2.0 || one.State["rows"] != nil {
		t.Fatalf("the state after the epoch is not the next epoch's start: %v", one.State)
	}
	all := map[string]int{}
	for _, r := range one.Rows {
		if len(r) != 32 {
			t.Fatalf("a row of %d tokens", len(r))
		}
		all[rowKey(r)]++
	}

	count := func(what string, parts ...[][]int64) {
		t.Helper()
		seen := map[string]int{}
		n := 0
		for _, p := range parts {
			for _, r := range p {
				seen[rowKey(r)]++
				n++
			}
		}
		if n != len(one.Rows) {
			t.Errorf("%s: %d rows, the epoch has %d", what, n, len(one.Rows))
		}
		for k, c := range all {
			if seen[k] != c {
				t.Errorf("%s: row %.40s... read %d times, want %d", what, k, seen[k], c)
				return
			}
		}
	}

	// input_ids as int32 (checked in Python: an int32 tensor): the same rows.
	i32 := packRead(t, py, "read", srv.socket, with("pack", spec+":ids=int32"))
	if fmt.Sprint(i32.Rows) != fmt.Sprint(one.Rows) || i32.Batches != one.Batches {
		t.Errorf("ids=int32: %d rows in %d batches that differ from int64's %d in %d", len(i32.Rows), i32.Batches, len(one.Rows), one.Batches)
	}

	// Two ranks: the one-rank epoch's rows once, as many batches each.
	r0 := packRead(t, py, "read", srv.socket, with("rank", 0, "world", 2))
	r1 := packRead(t, py, "read", srv.socket, with("rank", 1, "world", 2))
	if r0.Batches != r1.Batches || r0.Batches != r0.Length {
		t.Errorf("two ranks yield %d and %d batches, len() %d", r0.Batches, r1.Batches, r0.Length)
	}
	count("two ranks", r0.Rows, r1.Rows)

	// Two ranks stop after 3 batches; three ranks resume from rank 0's state.
	a0 := packRead(t, py, "read", srv.socket, with("rank", 0, "world", 2, "n", 3))
	a1 := packRead(t, py, "read", srv.socket, with("rank", 1, "world", 2, "n", 3))
	if fmt.Sprint(a0.State) != fmt.Sprint(a1.State) || a0.State["rows"] != float64(3*2*4) {
		t.Fatalf("two ranks after 3 batches of 4 rows: states %v, %v (want rows 24 in both)", a0.State, a1.State)
	}
	parts := [][][]int64{a0.Rows, a1.Rows}
	for rank := range 3 {
		r := packRead(t, py, "read", srv.socket, map[string]any{"pack": spec, "batch": 4, "seed": 9, "rank": rank, "world": 3, "state": a0.State})
		parts = append(parts, r.Rows)
		// len() is a whole epoch's batches at the new world, not the old world's
		// batches added to the new one's.
		if want := (len(one.Rows) + 11) / 12; r.Length != want {
			t.Errorf("rank %d of 3, resumed from two ranks' state: len() %d, a whole epoch of %d rows in batches of 3x4 is %d", rank, r.Length, len(one.Rows), want)
		}
	}
	count("two ranks resumed on three", parts...)

	// ShardloadDataset in a DataLoader: the client's rows, then all-pad rows.
	ds := packRead(t, py, "dataset", srv.socket, base)
	if len(ds.Rows) < len(one.Rows) || ds.Length != one.Batches {
		t.Fatalf("the dataset yields %d rows (len %d), the client %d (%d batches)", len(ds.Rows), ds.Length, len(one.Rows), one.Batches)
	}
	for i, r := range ds.Rows {
		if i < len(one.Rows) && rowKey(r) != rowKey(one.Rows[i]) {
			t.Fatalf("dataset row %d differs from the client's", i)
		}
		if i >= len(one.Rows) && rowKey(r) != rowKey(make([]int64, 32)) {
			t.Fatalf("dataset row %d past the epoch's rows is not pad: %v", i, r)
		}
	}
}
