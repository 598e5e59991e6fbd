package wire

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"testing"

	"github.com/shardload/shardload/decode"
)

// The golden fixtures in testdata are what the loader and its trainers agree on byte
// for byte: every message of the protocol with every member set (messages.json), and
// a collated batch's slab (slab.bin) with its batch message, its fields and the
// values a trainer must read from it (slab.json). The Python client's tests read the
// same files (client/python/tests/wire_check.py), so that neither side can drift.
// go test ./wire -update rewrites them from the Go types; review the diff.
var update = flag.Bool("update", false, "rewrite the golden fixtures in testdata")

// golden compares got with the fixture file name, or writes it with -update.
func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (go test ./wire -update writes it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs from what this code writes: a change of the protocol's bytes (bump Version, keep the old one accepted, and rewrite the fixture with -update), or a bug", path)
	}
}

func indentJSON(t *testing.T, v any) []byte {
	t.Helper()
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// goldenMessages are one of each message, every member set.
func goldenMessages() map[string]any {
	wait := 1.25
	state := &State{Epoch: 2, Order: "o1-5f1c0a7e93b2d4c8", Samples: 1000, Runs: "0-63,128-191", Batches: 4, Rows: 96}
	return map[string]any{
		"hello": Hello{Type: TypeHello, Version: Version, Rank: 1, World: 4, LocalRank: 1, Seed: 7, Epoch: 2,
			BatchSize: 32, DropLast: true, Fields: []string{"jpg", "label=cls:int"}, URLs: []string{"s3://bucket/train-{000000..000099}.tar"},
			Client: "shardload-python/0.4.0", GPUPCI: "0000:3b:00.0", CUDAVisible: "1,0", State: state, ImageLayout: "chw",
			Settings: map[string]json.RawMessage{"allow_estimate": json.RawMessage("true"), "count_first": json.RawMessage("false"),
				"slab_bytes": json.RawMessage("8388608"), "slabs": json.RawMessage("4"), "shuffle": json.RawMessage("true"),
				"shuffle_buffer": json.RawMessage("1000"), "shuffle_bytes": json.RawMessage("67108864"),
				"open_shards": json.RawMessage("8"), "read_gap": json.RawMessage("0"), "ranks_per_node": json.RawMessage("2"),
				"node_affinity": json.RawMessage("true")},
			Streams:      []Stream{{URLs: []string{"s3://bucket/web-{000..099}.tar"}, Weight: 0.7}, {URLs: []string{"s3://bucket/code-{00..09}.tar"}, Repeat: 2, Choose: 0}},
			EpochSamples: 100000, Batching: "stratified", Pack: "tokens:2048:eos=0:pad=0", EpochTokens: 1 << 30},
		"ready": Ready{Type: TypeReady, Version: Version, Session: 3, Slabs: 4, SlabBytes: 8 << 20,
			Fields: []FieldInfo{{Name: "jpg", Ext: "jpg", Kind: "image", DType: "|u1", Shape: []int{3, 224, 224}}, {Name: "label", Ext: "cls", Kind: "int"}},
			Epoch:  2, Batches: 31, Samples: 1000, Estimated: true, Shards: 10,
			Order:        OrderInfo{Fingerprint: "o1-5f1c0a7e93b2d4c8", Job: "j1-0c4d2e6f8a1b3c5d", Settings: OrderSettings{Dataset: "d1-9a8b7c6d5e4f3a2b", Shards: 10, Samples: 1000, Seed: 7, Epoch: 2, World: 4, BatchSize: 32, DropLast: true, Shuffle: true, Lanes: 8, Window: 500, Runs: "", Mix: "5e2a9c0b7d31f4a8"}},
			Placement:    Placement{GPU: 0, PCI: "0000:3b:00.0", Node: 0, CPUs: "0-15", Reason: "GPU 0000:3b:00.0 is on node 0"},
			State:        state,
			EpochBatches: 35},
		"batch": Batch{Type: TypeBatch, Epoch: 2, Seq: 5, Slab: 1, Rows: 2, Padded: 1, Used: 256,
			Columns: []ColumnInfo{{Name: "label", Kind: "int", DType: "<i8", Shape: []int{2}, Offset: 0, Length: 16},
				{Name: "__key__", Kind: "text", DType: "|u1", Shape: []int{6}, Offset: 128, Length: 6, Ragged: true, OffsetsOffset: 64}},
			State: state, SlabBytes: 16 << 20, Backpressure: 0.5},
		"release": Release{Type: TypeRelease, Slab: 1, Seq: 5, Epoch: 2, Wait: &wait},
		"end": End{Type: TypeEnd, Epoch: 2, Batches: 31, Samples: 992, Skipped: 1, Padded: 1, Abandoned: false, Trimmed: 8, Estimated: true,
			Streams: []StreamEnd{{Samples: 700, Bytes: 7 << 20, Skipped: 1}, {Samples: 292, Bytes: 3 << 20}}, State: state},
		"epoch": EpochRequest{Type: TypeEpoch, Epoch: 3, State: state},
		"error": ErrorMessage{Type: TypeError, Code: CodeResume, Message: "the state was saved under another order"},
	}
}

// Every message reads back from its fixture as the Go type writes it: no member
// lost or renamed.
func TestGoldenMessages(t *testing.T) {
	msgs := goldenMessages()
	golden(t, "messages.json", indentJSON(t, msgs))
	raw, err := os.ReadFile(filepath.Join("testdata", "messages.json"))
	if err != nil {
		t.Fatal(err)
	}
	var fixture map[string]json.RawMessage
	if err := json.Unmarshal(raw, &fixture); err != nil {
		t.Fatal(err)
	}
	read := map[string]any{"hello": &Hello{}, "ready": &Ready{}, "batch": &Batch{}, "release": &Release{},
		"end": &End{}, "epoch": &EpochRequest{}, "error": &ErrorMessage{}}
	for name, v := range read {
		if err := json.Unmarshal(fixture[name], v); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		var a, b any
		json.Unmarshal(fixture[name], &a)
		again, _ := json.Marshal(v)
		json.Unmarshal(again, &b)
		if !bytes.Equal(indentJSON(t, a), indentJSON(t, b)) {
			t.Errorf("%s: read and written again:\n%s\nthe fixture:\n%s", name, indentJSON(t, b), indentJSON(t, a))
		}
	}
}

// A collated batch's slab is the fixture's byte for byte, and the fixture says what
// each column's rows hold.
func TestGoldenSlab(t *testing.T) {
	fx := newBatchFixture(t, 7)
	// Past the rows of the real (1 MB) features: the fixture stays small.
	fx.keys, fx.rows = fx.keys[2:], fx.rows[2:]
	slab := make([]byte, Needed(fx.fields, fx.keys, fx.rows))
	l, err := Collate(slab, fx.fields, fx.keys, fx.rows)
	if err != nil {
		t.Fatal(err)
	}
	values := map[string]any{}
	for j, c := range l.Columns {
		rows := make([]any, l.Rows)
		for i := range rows {
			switch {
			case j == len(fx.fields):
				rows[i] = fx.keys[i]
			case c.Kind == decode.KindInt:
				rows[i] = fx.rows[i][j].Int
			case c.Ragged:
				rows[i] = hex.EncodeToString(fx.rows[i][j].Data)
			default:
				rows[i] = nested(t, c.DType, fx.rows[i][j].Data, c.Shape[1:])
			}
		}
		values[c.Name] = rows
	}
	golden(t, "slab.bin", slab)
	golden(t, "slab.json", indentJSON(t, map[string]any{
		"fields": Fields(fx.fields),
		"batch": Batch{Type: TypeBatch, Epoch: 0, Seq: 0, Slab: 0, Rows: l.Rows, Used: l.Used, Columns: Columns(&l),
			SlabBytes: int64(len(slab))},
		"values": values,
	}))
}

// nested returns a fixed column's row as nested lists of its elements (int16 only:
// the fixture's one fixed array type).
func nested(t *testing.T, dt decode.DType, data []byte, shape []int) any {
	if dt.Descr() != "<i2" {
		t.Fatalf("fixture: a fixed column of %s", dt.Descr())
	}
	if len(shape) == 0 {
		return int16(binary.LittleEndian.Uint16(data))
	}
	n := len(data) / shape[0]
	out := make([]any, shape[0])
	for i := range out {
		out[i] = nested(t, dt, data[i*n:(i+1)*n], shape[1:])
	}
	return out
}
