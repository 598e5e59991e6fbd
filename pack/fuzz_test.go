package pack

import (
	"testing"
)

// FuzzParseSpec checks that ParseSpec never panics and that whatever it accepts
// round-trips through String.
func FuzzParseSpec(f *testing.F) {
	for _, s := range []string{
		"tokens:2048", "tokens.npy:8:eos=0", "t:8:pad=0:eos=2", "t:8:eos=3:pad=3",
		"t:0", "t:8:", "t:8:eos=1:eos=1", "t:8:eos=-1", ":8", "t:8:bos=1", "a.b:1:pad=9223372036854775807",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		sp, err := ParseSpec(s)
		if err != nil {
			return
		}
		if err := sp.Check(1<<63 - 1); err != nil {
			t.Fatalf("ParseSpec(%q) = %+v, which fails Check: %v", s, sp, err)
		}
		again, err := ParseSpec(sp.String())
		if err != nil {
			t.Fatalf("ParseSpec(%q).String() = %q does not parse: %v", s, sp.String(), err)
		}
		if again != sp || again.String() != sp.String() {
			t.Fatalf("%q: %+v -> %q -> %+v", s, sp, sp.String(), again)
		}
	})
}

// FuzzLayout checks, for fuzzed document lengths, row length, eos and block size,
// that every row built through Pieces and Fill (in batches of a fuzzed size) is the
// reference stream cut into rows, and that Locate agrees with it.
func FuzzLayout(f *testing.F) {
	f.Add([]byte{3, 0, 9, 1, 200, 4}, uint8(4), true, uint8(2), uint8(3))
	f.Add([]byte{0, 0, 0}, uint8(1), true, uint8(1), uint8(1))
	f.Add([]byte{0, 0, 0}, uint8(3), false, uint8(1), uint8(2))
	f.Add([]byte{255, 17, 64, 0, 0, 5}, uint8(16), false, uint8(4), uint8(5))
	f.Fuzz(func(t *testing.T, data []byte, seq uint8, eos bool, k, batch uint8) {
		spec := Spec{Field: "tokens", SeqLen: int(seq%32) + 1, Pad: 2}
		if eos {
			spec.HasEOS, spec.EOS = true, 1
		}
		if len(data) > 300 {
			data = data[:300]
		}
		// A byte is a length up to 3 rows; from 250 on, several rows.
		c := &corpus{lens: make([]int64, len(data))}
		for i, b := range data {
			if b >= 250 {
				c.lens[i] = int64(b-249) * int64(spec.SeqLen) * 3
			} else {
				c.lens[i] = int64(b) % int64(3*spec.SeqLen+1)
			}
		}
		l, err := newLayout(spec, len(c.lens), c.length, int(k%8)+1)
		if err != nil {
			t.Fatal(err)
		}
		want := refRows(spec, c)
		if l.Rows() != int64(len(want)) {
			t.Fatalf("%d rows, want %d", l.Rows(), len(want))
		}
		for i, row := range want {
			for j, w := range row {
				doc, within := l.Locate(int64(i*spec.SeqLen + j))
				if doc != w.doc || (doc >= 0 && within != w.off) {
					t.Fatalf("Locate(%d) = %d, %d, want %+v", i*spec.SeqLen+j, doc, within, w)
				}
			}
		}
		bs := int(batch%5) + 1
		fl, err := NewFiller(spec, bs)
		if err != nil {
			t.Fatal(err)
		}
		b := newBatch(fl, batch%2 == 0)
		var pieces []Piece
		for from := int64(0); from < l.Rows(); from += int64(bs) {
			to := min(from+int64(bs), l.Rows())
			pieces = l.Pieces(from, to, pieces[:0])
			if err := fl.Fill(b, pieces, c.tokens); err != nil {
				t.Fatal(err)
			}
			rows := append([][]tokenRef(nil), want[from:to]...)
			for int64(len(rows)) < int64(bs) {
				rows = append(rows, padRow(spec))
			}
			checkBatch(t, spec, b, rows)
		}
	})
}
