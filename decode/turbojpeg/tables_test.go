package turbojpeg

import (
	"bytes"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/shardload/shardload/internal/testutil"
)

// TestTablesNotLentByEarlierImages: libjpeg keeps a decompressor's quantization
// and Huffman tables from one image to the next, so an instance from the pool would
// lend an earlier image's tables to a JPEG that does not define its own. A JPEG
// without its quantization tables must fail whatever came before it, as on a fresh
// library; one without its Huffman tables must decode with the standard ones (what
// a fresh libjpeg, and so PIL, uses), not with the tables of the image before.
func TestTablesNotLentByEarlierImages(t *testing.T) {
	l := testLib(t)
	const w, h = 48, 32
	ref := encode(t, photo(w, h, 6, 3), 90)
	want := make([]byte, w*h*3)
	if err := l.Decode(ref, want, w, h, RGB, 0); err != nil {
		t.Fatal(err)
	}
	// Earlier images: other quantization tables (quality 20), and a progressive
	// JPEG whose scans define optimised Huffman tables.
	low := encode(t, photo(w, h, 6, 3), 20)
	prog, err := os.ReadFile("testdata/prog420.jpg")
	if err != nil {
		t.Fatal(err)
	}
	phd, err := l.Header(prog)
	if err != nil {
		t.Fatal(err)
	}
	pdst := make([]byte, phd.Width*phd.Height*3)
	earlier := func() {
		t.Helper()
		if err := l.Decode(low, want[:0:0], 0, 0, RGB, 0); err == nil {
			t.Fatal("a zero size decoded")
		}
		lowDst := make([]byte, w*h*3)
		if err := l.Decode(low, lowDst, w, h, RGB, 0); err != nil {
			t.Fatal(err)
		}
		if err := l.Decode(prog, pdst, phd.Width, phd.Height, RGB, 0); err != nil {
			t.Fatal(err)
		}
	}

	noDQT := testutil.JPEGWithout(t, ref, 0xdb)
	noDHT := testutil.JPEGWithout(t, ref, 0xc4)
	dst := make([]byte, w*h*3)
	for round := range 3 {
		earlier()
		err := l.Decode(noDQT, dst, w, h, RGB, 0)
		if err == nil || !strings.Contains(err.Error(), "Quantization table 0x00 was not defined") {
			t.Fatalf("round %d: a JPEG without quantization tables after others: %v, want libjpeg's error", round, err)
		}
		earlier()
		clear(dst)
		if err := l.Decode(noDHT, dst, w, h, RGB, 0); err != nil {
			t.Fatalf("round %d: a JPEG without Huffman tables after others: %v", round, err)
		}
		if !bytes.Equal(dst, want) {
			t.Fatalf("round %d: a JPEG without Huffman tables decoded with an earlier image's (mean difference %.1f)", round, meanAbsDiff(dst, want))
		}
	}
}

// seg is a marker segment: 0xff, the code, the length, the payload.
func seg(code byte, payload ...byte) []byte {
	n := len(payload) + 2
	return append([]byte{0xff, code, byte(n >> 8), byte(n)}, payload...)
}

// dqt defines quantization table t (8-bit, all ones).
func dqt(t byte) []byte { return seg(0xdb, append([]byte{t}, bytes.Repeat([]byte{1}, 64)...)...) }

// dht defines Huffman table idx (0x0t DC, 0x1t AC) with one 1-bit code.
func dht(idx byte) []byte {
	p := make([]byte, 18)
	p[0], p[1] = idx, 1
	return seg(0xc4, p...)
}

// sof is a frame of the given marker with components 1..len(tq) using tq's tables.
func sof(code byte, tq ...byte) []byte {
	p := []byte{8, 0, 8, 0, 8, byte(len(tq))}
	for i, q := range tq {
		p = append(p, byte(i+1), 0x11, q)
	}
	return seg(code, p...)
}

// sos is a scan of the components ids, each with DC table 0 and AC table 0 (Ss
// 0, Se 63: a sequential scan, or a progressive DC scan when Se is 0).
func sos(se byte, ids ...byte) []byte {
	p := []byte{byte(len(ids))}
	for _, id := range ids {
		p = append(p, id, 0x00)
	}
	return seg(0xda, append(p, 0, se, 0)...)
}

// entropy is entropy-coded data holding a stuffed 0xff and a restart marker.
var entropy = []byte{0x12, 0xff, 0x00, 0x34, 0xff, 0xd3, 0x56}

func jpegOf(parts ...[]byte) []byte {
	out := []byte{0xff, 0xd8}
	for _, p := range parts {
		out = append(out, p...)
	}
	return append(out, 0xff, 0xd9)
}

func TestWalkTables(t *testing.T) {
	prog, err := os.ReadFile("testdata/prog420.jpg")
	if err != nil {
		t.Fatal(err)
	}
	ref := encode(t, photo(24, 16, 6, 1), 90)
	noDQT := testutil.JPEGWithout(t, ref, 0xdb)
	tables := append(append(dqt(0), dht(0x00)...), dht(0x10)...)
	for _, c := range []struct {
		name    string
		data    []byte
		own     bool
		missing string // a part of CheckTables' error, "" for none
	}{
		{"image/jpeg's baseline", ref, true, ""},
		{"without quantization tables", noDQT, false, "quantization table 0 of component 1 is not defined before its first scan (SOS at byte "},
		{"without Huffman tables", testutil.JPEGWithout(t, ref, 0xc4), false, ""},
		{"progressive", prog, false, ""},
		{"one scan, tables before it", jpegOf(tables, sof(0xc0, 0), sos(63, 1), entropy), true, ""},
		{"tables after the frame", jpegOf(sof(0xc1, 0), tables, sos(63, 1), entropy), true, ""},
		{"no AC table", jpegOf(dqt(0), dht(0x00), sof(0xc0, 0), sos(63, 1), entropy), false, ""},
		{"an AC table in another slot", jpegOf(tables[:len(tables)-22], dht(0x11), sof(0xc0, 0), sos(63, 1), entropy), false, ""},
		{"arithmetic", jpegOf(dqt(0), sof(0xc9, 0), sos(63, 1), entropy), false, ""},
		{"arithmetic without its table", jpegOf(sof(0xc9, 0), sos(63, 1), entropy), false, "quantization table 0 of component 1"},
		{"stray bytes before a marker", jpegOf(tables, []byte{0x00, 0x12}, sof(0xc0, 0), sos(63, 1), entropy), true, ""},
		{"table 4", jpegOf(tables, sof(0xc0, 4), sos(63, 1), entropy), false, "quantization table 4 of component 1"},
		// Scans of one component each: the second's table is defined between them,
		// after entropy-coded data with a stuffed byte and a restart marker.
		{"a table between scans", jpegOf(tables, sof(0xc0, 0, 1), sos(63, 1), entropy, dqt(1), sos(63, 2), entropy), false, ""},
		{"a table missing at the second scan", jpegOf(tables, sof(0xc0, 0, 1), sos(63, 1), entropy, sos(63, 2), entropy), false, "quantization table 1 of component 2"},
		{"a table defined too late", jpegOf(tables, sof(0xc0, 0, 1), sos(63, 1), entropy, sos(63, 2), entropy, dqt(1)), false, "quantization table 1 of component 2"},
		{"lossless (no quantization)", jpegOf(dht(0x00), sof(0xc3, 0), sos(63, 1), entropy), false, ""},
		{"cut in the frame", jpegOf(tables, sof(0xc0, 0)[:6]), false, ""},
		{"a scan before the frame", jpegOf(tables, sos(63, 1), entropy), false, ""},
		{"an unknown component", jpegOf(tables, sof(0xc0, 0), sos(63, 7), entropy), false, ""},
		{"two frames", jpegOf(tables, sof(0xc0, 0), sof(0xc0, 0), sos(63, 1), entropy), false, ""},
		{"not a JPEG", []byte("\x89PNG\r\n\x1a\n"), false, ""},
		{"empty", nil, false, ""},
	} {
		if got := selfContained(c.data); got != c.own {
			t.Errorf("%s: selfContained %v, want %v", c.name, got, c.own)
		}
		err := CheckTables(c.data)
		switch {
		case c.missing == "" && err != nil:
			t.Errorf("%s: CheckTables: %v", c.name, err)
		case c.missing != "" && (err == nil || !strings.Contains(err.Error(), c.missing)):
			t.Errorf("%s: CheckTables: %v, want %q", c.name, err, c.missing)
		}
	}
	// The offset is the scan's: image/jpeg writes its tables, the frame and the
	// Huffman tables, then the scan.
	want := bytes.Index(noDQT, []byte{0xff, 0xda})
	if err := CheckTables(noDQT); err == nil || !strings.Contains(err.Error(), fmt.Sprintf("at byte %d)", want)) {
		t.Errorf("CheckTables: %v, want the scan at byte %d", err, want)
	}
}

// FuzzCheckTables: neither walk panics, and an image whose headers show it
// self-contained has no missing table for CheckTables either.
func FuzzCheckTables(f *testing.F) {
	f.Add(encode(f, photo(24, 16, 6, 1), 90))
	if prog, err := os.ReadFile("testdata/prog420.jpg"); err == nil {
		f.Add(prog)
	}
	tables := append(append(dqt(0), dht(0x00)...), dht(0x10)...)
	f.Add(jpegOf(tables, sof(0xc0, 0, 1), sos(63, 1), entropy, dqt(1), sos(63, 2), entropy))
	f.Add(jpegOf(sof(0xc2, 0), sos(0, 1), entropy))
	f.Fuzz(func(t *testing.T, data []byte) {
		own := selfContained(data)
		if err := CheckTables(data); own && err != nil {
			t.Fatalf("self-contained, yet %v", err)
		}
	})
}
