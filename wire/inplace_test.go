package wire

import (
	"bytes"
	"math/rand/v2"
	"testing"

	"github.com/shardload/shardload/decode"
)

// placedBatch returns a random batch of fields raw, int, fixed npy, ragged text and a
// second view of the raw member, its values in memory of their own.
func placedBatch(tb testing.TB, rng *rand.Rand, n int) ([]decode.Field, []string, [][]decode.Value) {
	fields := []decode.Field{mustField(tb, "jpg"), mustField(tb, "cls"), mustField(tb, "tok=npy:npy:int32:3"), mustField(tb, "txt:text"), mustField(tb, "again=jpg")}
	keys := make([]string, n)
	rows := make([][]decode.Value, n)
	for i := range rows {
		keys[i] = string(seq(rng.IntN(20)))
		jpg := seq(rng.IntN(300))
		rows[i] = []decode.Value{{Data: jpg}, {Int: rng.Int64()}, {Data: seq(12)}, {Data: bytes.Repeat([]byte("ab"), rng.IntN(40))}, {Data: jpg}}
	}
	return fields, keys, rows
}

// Values read to their places in the slab (where PlanColumns says, from their sizes
// alone) are left there, the others copied: the slab is byte for byte what Collate
// writes from values of their own, and InPlace says so. A value in the slab away
// from its place is reported, and a view of a placed value is not.
func TestInPlaceCollate(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for trial := range 200 {
		n := 1 + rng.IntN(20)
		fields, keys, rows := placedBatch(t, rng, n)
		want := make([]byte, 1<<16)
		wl, err := Collate(want, fields, keys, rows)
		if err != nil {
			t.Fatal(err)
		}
		totals := make([]int64, len(fields))
		for j := range fields {
			for i := range rows {
				totals[j] += int64(len(rows[i][j].Data))
			}
		}
		offsets := make([]int64, len(fields))
		planned, _ := PlanColumns(offsets, fields, n, totals)
		if planned != len(fields) {
			t.Fatalf("planned %d columns of %d", planned, len(fields))
		}
		for j := range fields {
			if offsets[j] != wl.Columns[j].Offset {
				t.Fatalf("trial %d: column %d planned at %d, collated at %d", trial, j, offsets[j], wl.Columns[j].Offset)
			}
		}
		// Read some raw and text values to their places, as a loader does.
		slab := bytes.Repeat([]byte{0xee}, 1<<16)
		got := make([][]decode.Value, n)
		placed := 0
		for _, j := range []int{0, 3} {
			o := offsets[j]
			for i := range rows {
				if got[i] == nil {
					got[i] = append([]decode.Value(nil), rows[i]...)
				}
				v := rows[i][j].Data
				if len(v) > 0 && rng.IntN(3) > 0 {
					dst := slab[o : o+int64(len(v)) : o+int64(len(v))]
					copy(dst, v)
					got[i][j].Data = dst
					if j == 0 {
						got[i][4].Data = dst // the second field of the same member
					}
					placed++
				}
				o += int64(len(v))
			}
		}
		if !InPlace(slab, fields, keys, got) {
			t.Fatalf("trial %d: values at their places reported out of place", trial)
		}
		gl, err := Collate(slab, fields, keys, got)
		if err != nil {
			t.Fatal(err)
		}
		if gl.Used != wl.Used || !bytes.Equal(slab[:gl.Used], want[:wl.Used]) {
			t.Fatalf("trial %d (%d values placed): the slab differs from the copying collate's", trial, placed)
		}
	}

	// Out of place: row 1's jpg read where row 0's goes.
	fields, keys, rows := placedBatch(t, rng, 3)
	rows[0][0].Data, rows[1][0].Data = seq(10), seq(10)
	rows[0][4].Data, rows[1][4].Data = rows[0][0].Data, rows[1][0].Data
	slab := make([]byte, 1<<16)
	var l Layout
	if err := CollateInto(&l, slab, fields, keys, rows); err != nil {
		t.Fatal(err)
	}
	o := l.Columns[0].Offset
	rows[1][0].Data = slab[o : o+10]
	if InPlace(slab, fields, keys, rows) {
		t.Fatal("a value in the slab away from its place reported in place")
	}
	rows[1][0].Data = seq(10)
	rows[0][0].Data = slab[o : o+10]
	if !InPlace(slab, fields, keys, rows) {
		t.Fatal("a value at its place reported out of place")
	}
	// The batch does not fit: no value may stay in the slab.
	if InPlace(slab[:o+20], fields, keys, rows) {
		t.Fatal("a value in a slab too small for its batch reported in place")
	}
}

// PlanColumns stops at the first ragged column whose total is not known.
func TestPlanColumnsUnknown(t *testing.T) {
	fields := []decode.Field{mustField(t, "jpg"), mustField(t, "cls"), mustField(t, "txt:text"), mustField(t, "js:json")}
	offsets := make([]int64, len(fields))
	n, used := PlanColumns(offsets, fields, 4, []int64{100, 0, -1, 5})
	if n != 2 {
		t.Fatalf("planned %d columns, want 2", n)
	}
	if used != offsets[1]+4*8 || offsets[0] != alignUp(8*5) {
		t.Fatalf("offsets %v, used %d", offsets[:2], used)
	}
}
