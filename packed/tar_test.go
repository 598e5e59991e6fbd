package packed

import (
	"archive/tar"
	"bytes"
	"math/rand/v2"
	"strings"
	"testing"
)

// plainMember finds the member archive/tar finds in plain headers, and leaves what
// it does not read (PAX and GNU long names) to archive/tar.
func TestPlainMember(t *testing.T) {
	c := &corpus{field: "tokens.npy"}
	for _, tc := range []struct {
		name   string
		format tar.Format
		plain  bool
	}{
		{"d/x0001.tokens.npy", tar.FormatUSTAR, true},
		{"x0001.tokens.npy", tar.FormatGNU, true},
		{strings.Repeat("x", 120) + ".tokens.npy", tar.FormatPAX, false},
		{strings.Repeat("x", 120) + ".tokens.npy", tar.FormatGNU, false},
		{strings.Repeat("d/", 40) + "x.tokens.npy", tar.FormatUSTAR, true}, // a prefix
	} {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		for _, m := range []struct {
			name string
			body string
		}{{"x0001.txt", "some text"}, {tc.name, "tokens here"}, {"x0001.json", "{}"}} {
			if err := tw.WriteHeader(&tar.Header{Name: m.name, Size: int64(len(m.body)), Mode: 0o644, Typeflag: tar.TypeReg, Format: tc.format}); err != nil {
				t.Fatal(err)
			}
			tw.Write([]byte(m.body))
		}
		tw.Flush()
		b := buf.Bytes()
		at, size, err := c.tarMember(b)
		if err != nil || string(b[at:at+size]) != "tokens here" {
			t.Fatalf("%s: archive/tar: %q %v", tc.name, b[at:at+size], err)
		}
		pat, psize, ok := plainMember(b, c.field)
		if ok != tc.plain || ok && (pat != at || psize != size) {
			t.Errorf("%s (%v): plainMember %d %d %v, archive/tar %d %d", tc.name, tc.format, pat, psize, ok, at, size)
		}
		b[at-512+3] ^= 1 // the member's header's checksum fails
		if _, _, ok := plainMember(b, c.field); ok && tc.plain {
			t.Errorf("%s: a header whose checksum fails was read", tc.name)
		}
	}
}

// headerSum, eight bytes at a time, is the byte-by-byte checksum of a tar header,
// on random headers and on one of 0xff bytes (the largest sums its lanes take).
func TestHeaderSum(t *testing.T) {
	naive := func(h []byte) int64 {
		var sum int64
		for i, c := range h[:512] {
			if i >= 148 && i < 156 {
				c = ' '
			}
			sum += int64(c)
		}
		return sum
	}
	r := rand.New(rand.NewPCG(7, 7))
	h := make([]byte, 512)
	for k := range 200 {
		for i := range h {
			h[i] = byte(r.Uint32())
			if k == 0 {
				h[i] = 0xff
			}
		}
		if got, want := headerSum(h), naive(h); got != want {
			t.Fatalf("header %d: sum %d, want %d", k, got, want)
		}
	}
}
