package wire

import (
	"bytes"
	stdgzip "compress/gzip"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/shardload/shardload/decode"

	"github.com/shardload/shardload/internal/testutil"
)

// batchFixture decodes a batch of samples with mixed fields: an int label, a
// fixed-shape int16 array, a ragged float32 array (the real Lhotse features and small
// hand-built ones), raw bytes, text (one gzipped), and JSON.
type batchFixture struct {
	fields []decode.Field
	keys   []string
	rows   [][]decode.Value
}

func newBatchFixture(t *testing.T, n int) batchFixture {
	t.Helper()
	var fx batchFixture
	for _, s := range []string{"label=cls", "tok=npy:npy:int16:2x5", "feats=feats.npy:npy:float32", "img=jpg", "cap=txt.gz", "meta=json"} {
		fx.fields = append(fx.fields, mustField(t, s))
	}
	var lhotse [][]byte
	for _, b := range lhotseNPYs(t) {
		lhotse = append(lhotse, b)
	}
	var d decode.Decoder
	for i := range n {
		key := fmt.Sprintf("shard-%03d/sample-%d", i%3, i)
		if i == 2 {
			key = "ключ-ü" // keys are UTF-8
		}
		var feats []byte
		if i < len(lhotse) {
			feats = lhotse[i]
		} else {
			feats = npyFile(1, "<f4", false, []int{i % 4, 3}, seq((i%4)*12))
		}
		members := [][]byte{
			fmt.Appendf(nil, "%d\n", i*11-5),
			// the int16 array's data differs per row
			npyFile(1, "<i2", false, []int{2, 5}, bytes.Repeat([]byte{byte(i), byte(i + 1)}, 10)),
			feats,
			bytes.Repeat([]byte{byte(i)}, i*37%101),
			gz(t, []byte(strings.Repeat("word ", i)), stdgzip.Header{}),
			fmt.Appendf(nil, `{"i": %d}`, i),
		}
		row := make([]decode.Value, len(fx.fields))
		for j := range fx.fields {
			v, _, err := d.Decode(&fx.fields[j], members[j], nil) // fresh buf per value
			if err != nil {
				t.Fatal(err)
			}
			row[j] = v
		}
		fx.keys = append(fx.keys, key)
		fx.rows = append(fx.rows, row)
	}
	return fx
}

func TestCollate(t *testing.T) {
	for _, n := range []int{0, 1, 5, 32} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			fx := newBatchFixture(t, n)
			need := Needed(fx.fields, fx.keys, fx.rows)
			slab := bytes.Repeat([]byte{0xAA}, int(need)+1000)
			b, err := Collate(slab, fx.fields, fx.keys, fx.rows)
			if err != nil {
				t.Fatal(err)
			}
			if b.Rows != n || b.Used != need || len(b.Columns) != len(fx.fields)+1 {
				t.Fatalf("Rows %d Used %d (Needed %d) columns %d", b.Rows, b.Used, need, len(b.Columns))
			}
			// Nothing written past Used.
			for _, c := range slab[b.Used:] {
				if c != 0xAA {
					t.Fatal("bytes written past Used")
				}
			}
			checkBatch(t, slab, &b, fx)
		})
	}
}

// checkBatch checks every column and row of a collated batch against the values.
func checkBatch(t *testing.T, slab []byte, b *Layout, fx batchFixture) {
	t.Helper()
	n := len(fx.rows)
	var prevEnd int64
	for j := range b.Columns {
		c := &b.Columns[j]
		if c.Offset%Align != 0 || c.OffsetsOffset%Align != 0 {
			t.Fatalf("%s: offsets %d, %d not aligned", c.Name, c.Offset, c.OffsetsOffset)
		}
		// Columns follow each other without overlap; padding is zeroed.
		start := c.Offset
		if c.Ragged {
			start = c.OffsetsOffset
		}
		if start < prevEnd || start-prevEnd >= Align {
			t.Fatalf("%s: starts at %d, previous ended at %d", c.Name, start, prevEnd)
		}
		if !allZero(slab[prevEnd:start]) {
			t.Fatalf("%s: padding not zeroed", c.Name)
		}
		prevEnd = c.Offset + c.Length
		if got, ok := b.Column(c.Name); !ok || got != c {
			t.Fatalf("Column(%q) = %v, %v", c.Name, got, ok)
		}
		if j == len(fx.fields) {
			// the key column
			if c.Name != KeyColumn || !c.Ragged || c.DType != decode.Uint8 || c.Kind != decode.KindText {
				t.Fatalf("key column %+v", c)
			}
			checkRagged(t, slab, c, n, func(i int) []byte { return []byte(fx.keys[i]) })
			continue
		}
		f := &fx.fields[j]
		if c.Name != f.ColumnName() || c.Kind != f.Kind {
			t.Fatalf("column %d: %+v for field %v", j, c, f)
		}
		switch {
		case f.Kind == decode.KindInt:
			if c.Ragged || c.DType != decode.Int64 || !slices.Equal(c.Shape, []int{n}) || c.Length != int64(8*n) {
				t.Fatalf("%s: %+v", c.Name, c)
			}
			want := make([]int64, n)
			for i := range n {
				want[i] = fx.rows[i][j].Int
				var le [8]byte
				binary.LittleEndian.PutUint64(le[:], uint64(want[i]))
				if !bytes.Equal(c.Row(slab, i), le[:]) {
					t.Fatalf("%s row %d: %x", c.Name, i, c.Row(slab, i))
				}
			}
			if got := c.Int64s(slab); !slices.Equal(got, want) {
				t.Fatalf("%s: Int64s %v, want %v", c.Name, got, want)
			}
		case len(f.Shape) > 0:
			if c.Ragged || c.DType != f.DType || !slices.Equal(c.Shape, append([]int{n}, f.Shape...)) {
				t.Fatalf("%s: %+v", c.Name, c)
			}
			if c.Length != int64(n*f.DType.Size()*prod(f.Shape)) {
				t.Fatalf("%s: Length %d", c.Name, c.Length)
			}
			for i := range n {
				if !bytes.Equal(c.Row(slab, i), fx.rows[i][j].Data) {
					t.Fatalf("%s row %d differs", c.Name, i)
				}
			}
			if c.Int64s(slab) != nil || c.Offsets(slab, n) != nil {
				t.Fatalf("%s: Int64s or Offsets of an int16 column", c.Name)
			}
		default:
			if !c.Ragged || c.DType != decode.Uint8 {
				t.Fatalf("%s: %+v", c.Name, c)
			}
			checkRagged(t, slab, c, n, func(i int) []byte { return fx.rows[i][j].Data })
		}
	}
	if prevEnd != b.Used {
		t.Fatalf("last column ends at %d, Used %d", prevEnd, b.Used)
	}
}

func checkRagged(t *testing.T, slab []byte, c *Column, n int, want func(i int) []byte) {
	t.Helper()
	offs := c.Offsets(slab, n)
	if len(offs) != n+1 || offs[0] != 0 || offs[n] != c.Length {
		t.Fatalf("%s: offsets %v, Length %d", c.Name, offs, c.Length)
	}
	if c.OffsetsOffset+8*int64(n+1) > c.Offset {
		t.Fatalf("%s: offsets overlap data", c.Name)
	}
	if !slices.Equal(c.Shape, []int{int(c.Length)}) {
		t.Fatalf("%s: shape %v", c.Name, c.Shape)
	}
	var total int64
	for i := range n {
		w := want(i)
		if offs[i+1]-offs[i] != int64(len(w)) {
			t.Fatalf("%s row %d: offsets %d..%d for %d bytes", c.Name, i, offs[i], offs[i+1], len(w))
		}
		if got := c.Row(slab, i); !bytes.Equal(got, w) {
			t.Fatalf("%s row %d: %q, want %q", c.Name, i, got, w)
		}
		total += int64(len(w))
	}
	if total != c.Length {
		t.Fatalf("%s: Length %d, items total %d", c.Name, c.Length, total)
	}
}

func prod(s []int) int {
	p := 1
	for _, d := range s {
		p *= d
	}
	return p
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

func TestCollateLayout(t *testing.T) {
	// Hand-computed layout of a small batch: 3 rows, an int column and a raw column.
	fields := []decode.Field{{Name: "y", Ext: "cls", Kind: decode.KindInt}, {Name: "x", Ext: "bin"}}
	keys := []string{"a", "bb", "ccc"}
	rows := [][]decode.Value{
		{{Int: 1}, {Data: []byte("x")}},
		{{Int: -2}, {Data: nil}},
		{{Int: 3}, {Data: []byte("zzzz")}},
	}
	slab := make([]byte, 1024)
	b, err := Collate(slab, fields, keys, rows)
	if err != nil {
		t.Fatal(err)
	}
	want := []Column{
		{Name: "y", Kind: decode.KindInt, DType: decode.Int64, Shape: []int{3}, Offset: 0, Length: 24},
		// offsets at 64 (4 x 8 bytes), data at 128
		{Name: "x", Kind: decode.KindRaw, Ragged: true, DType: decode.Uint8, Shape: []int{5}, Offset: 128, Length: 5, OffsetsOffset: 64},
		// offsets at 192, data at 256
		{Name: KeyColumn, Kind: decode.KindText, Ragged: true, DType: decode.Uint8, Shape: []int{6}, Offset: 256, Length: 6, OffsetsOffset: 192},
	}
	if b.Rows != 3 || b.Used != 262 || !slices.EqualFunc(b.Columns, want, func(a, b Column) bool {
		return fmt.Sprint(a) == fmt.Sprint(b)
	}) {
		t.Fatalf("got %+v", b)
	}
	if got := b.Columns[1].Offsets(slab, 3); !slices.Equal(got, []int64{0, 1, 1, 5}) {
		t.Fatalf("offsets %v", got)
	}
	if string(slab[256:262]) != "abbccc" || string(slab[128:133]) != "xzzzz" {
		t.Fatalf("data %q %q", slab[256:262], slab[128:133])
	}
	if Needed(fields, keys, rows) != 262 {
		t.Fatalf("Needed %d", Needed(fields, keys, rows))
	}
	if _, ok := b.Column("nope"); ok {
		t.Fatal("Column(nope) found")
	}
}

func TestCollateSlabTooSmall(t *testing.T) {
	fx := newBatchFixture(t, 8)
	need := Needed(fx.fields, fx.keys, fx.rows)
	for _, size := range []int64{0, 100, need - 1} {
		slab := bytes.Repeat([]byte{0x5C}, int(size))
		orig := bytes.Clone(slab)
		_, err := Collate(slab, fx.fields, fx.keys, fx.rows)
		wantErr(t, err, ErrSlabTooSmall, fmt.Sprintf("needs %d bytes, slab has %d", need, size))
		if !bytes.Equal(slab, orig) {
			t.Fatalf("slab of %d bytes changed", size)
		}
	}
	// One byte more than the exact size is not needed.
	slab := make([]byte, need)
	if _, err := Collate(slab, fx.fields, fx.keys, fx.rows); err != nil {
		t.Fatal(err)
	}
}

func TestCollateErrors(t *testing.T) {
	fields := []decode.Field{mustField(t, "a=npy:npy:float32:2"), mustField(t, "cls")}
	good := func() []decode.Value {
		return []decode.Value{{Data: seq(8), DType: decode.Float32, Shape: []int{2}}, {Int: 1}}
	}
	cases := []struct {
		name   string
		keys   []string
		rows   [][]decode.Value
		target error
		msg    string
	}{
		{"keys", []string{"a"}, [][]decode.Value{good(), good()}, nil, "1 keys for 2 rows"},
		{"row length", []string{"a"}, [][]decode.Value{good()[:1]}, nil, "row 0 has 1 values for 2 fields"},
		{"data size", []string{"a"}, [][]decode.Value{{{Data: seq(12)}, {}}}, decode.ErrWrongShape, "12 data bytes, want 8"},
		{"shape", []string{"a"}, [][]decode.Value{{{Data: seq(8), Shape: []int{1, 2}}, {}}}, decode.ErrWrongShape, "got (1, 2), want (2,)"},
		{"dtype", []string{"a"}, [][]decode.Value{{{Data: seq(8), DType: decode.Int32}, {}}}, decode.ErrWrongDType, "got int32, want float32"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			slab := bytes.Repeat([]byte{1}, 4096)
			_, err := Collate(slab, fields, c.keys, c.rows)
			wantErr(t, err, c.target, c.msg)
			if !bytes.Equal(slab, bytes.Repeat([]byte{1}, 4096)) {
				t.Fatal("slab written on error")
			}
			if Needed(fields, c.keys, c.rows) != -1 {
				t.Fatal("Needed of a bad batch is not -1")
			}
			if c.target != nil {
				var fe *decode.FieldError
				if !errors.As(err, &fe) || fe.Field != "a" {
					t.Fatalf("%v is not a decode.FieldError of field a", err)
				}
			}
		})
	}
}

func TestCollateIntoReuse(t *testing.T) {
	fx := newBatchFixture(t, 16)
	slab := make([]byte, Needed(fx.fields, fx.keys, fx.rows))
	var b Layout
	if err := CollateInto(&b, slab, fx.fields, fx.keys, fx.rows); err != nil {
		t.Fatal(err)
	}
	checkBatch(t, slab, &b, fx)
	// A smaller batch into the same Layout: the layout is recomputed.
	small := batchFixture{fields: fx.fields, keys: fx.keys[5:9], rows: fx.rows[5:9]}
	clear(slab)
	if err := CollateInto(&b, slab, small.fields, small.keys, small.rows); err != nil {
		t.Fatal(err)
	}
	checkBatch(t, slab, &b, small)
	if testing.CoverMode() == "" && !testutil.Race {
		got := testing.AllocsPerRun(20, func() {
			if err := CollateInto(&b, slab, fx.fields, fx.keys, fx.rows); err != nil {
				t.Fatal(err)
			}
		})
		if got != 0 {
			t.Fatalf("CollateInto: %v allocs per batch", got)
		}
	}
	// Fewer fields than last time, then more.
	one := fx.fields[:1]
	rows := make([][]decode.Value, len(fx.rows))
	for i := range rows {
		rows[i] = fx.rows[i][:1]
	}
	if err := CollateInto(&b, slab, one, fx.keys, rows); err != nil || len(b.Columns) != 2 {
		t.Fatalf("%v, %d columns", err, len(b.Columns))
	}
	checkBatch(t, slab, &b, batchFixture{fields: one, keys: fx.keys, rows: rows})
	if err := CollateInto(&b, slab, fx.fields, fx.keys, fx.rows); err != nil {
		t.Fatal(err)
	}
	checkBatch(t, slab, &b, fx)
}

// Values of 32 KiB and more (copied into the slab with non-temporal stores where
// the CPU has them, mem.CopyOut) land where smaller ones would: a ragged column of
// sizes around and above that, and a fixed column of 48 KiB rows.
func TestCollateLargeValues(t *testing.T) {
	fields := []decode.Field{
		{Name: "jpg", Kind: decode.KindRaw},
		{Name: "x", Kind: decode.KindNPY, DType: decode.Uint8, Shape: []int{48 << 10}},
	}
	sizes := []int{0, 1, 32<<10 - 1, 32 << 10, 32<<10 + 1, 110<<10 + 17, 7}
	var keys []string
	var rows [][]decode.Value
	for i, n := range sizes {
		raw := make([]byte, n)
		fixed := make([]byte, 48<<10)
		for k := range raw {
			raw[k] = byte(k*13 + i)
		}
		for k := range fixed {
			fixed[k] = byte(k*5 + i)
		}
		keys = append(keys, fmt.Sprint("k", i))
		rows = append(rows, []decode.Value{{Data: raw}, {Data: fixed}})
	}
	need := Needed(fields, keys, rows)
	slab := bytes.Repeat([]byte{0xAA}, int(need)+3) // odd length: nothing aligned by chance
	b, err := Collate(slab[3:], fields, keys, rows)
	if err != nil {
		t.Fatal(err)
	}
	for j, name := range []string{"jpg", "x"} {
		c, ok := b.Column(name)
		if !ok {
			t.Fatalf("no column %s", name)
		}
		for i := range rows {
			if got := c.Row(slab[3:], i); !bytes.Equal(got, rows[i][j].Data) {
				t.Fatalf("column %s row %d: %d bytes, differ from the value's %d", name, i, len(got), len(rows[i][j].Data))
			}
		}
	}
	if !bytes.Equal(slab[:3], []byte{0xAA, 0xAA, 0xAA}) {
		t.Fatal("bytes written before the slab")
	}
}
