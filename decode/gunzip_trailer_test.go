package decode

import (
	"bytes"
	stdgzip "compress/gzip"
	"strings"
	"testing"
)

// A Gunzip member is accepted only whole: every gzip member's CRC-32 and ISIZE are
// checked, the last one's included, and a member cut anywhere fails, except exactly
// between two gzip members (what remains is then a complete gzip file of fewer
// members, as gzip itself reads it).
func TestGunzipEveryTrailerChecked(t *testing.T) {
	text := []byte(strings.Repeat("the trailer of every member counts; ", 40))
	one := gz(t, text[:700], stdgzip.Header{})
	two := gz(t, text[700:], stdgzip.Header{Name: "second"})
	both := append(bytes.Clone(one), two...)
	flip := func(b []byte, i int) []byte { b = bytes.Clone(b); b[i] ^= 0x10; return b }
	f := mustField(t, "t=txt.gz")
	for _, c := range []struct {
		name string
		in   []byte
		msg  string
	}{
		{"first member's CRC-32", flip(both, len(one)-8), "CRC-32 mismatch"},
		{"first member's ISIZE", flip(both, len(one)-3), "size mismatch"},
		{"second member's CRC-32", flip(both, len(both)-6), "CRC-32 mismatch"},
		{"second member's ISIZE", flip(both, len(both)-1), "size mismatch"},
		{"second member's trailer cut", both[:len(both)-1], "truncated trailer"},
		{"garbage after the second member", append(bytes.Clone(both), 0, 0, 'j', 'u', 'n', 'k'), "not gzip"},
	} {
		_, _, err := new(Decoder).Decode(&f, c.in, nil)
		t.Run(c.name, func(t *testing.T) { wantErr(t, err, ErrCorrupt, c.msg) })
	}
	var d Decoder
	for cut := 0; cut < len(both); cut++ {
		v, _, err := d.Decode(&f, both[:cut], nil)
		switch {
		case cut == len(one):
			if err != nil || !bytes.Equal(v.Data, text[:700]) {
				t.Errorf("cut between the members: %d bytes, %v", len(v.Data), err)
			}
		case err == nil:
			t.Errorf("cut at %d of %d: accepted %d bytes", cut, len(both), len(v.Data))
		}
	}
	for i := 0; i < len(both); i++ {
		if i == 4 || i >= 4 && i < 8 || i == 9 || i >= len(one) && i < len(one)+10 {
			continue // MTIME, XFL and OS of either header change nothing inflated
		}
		v, _, err := d.Decode(&f, flip(both, i), nil)
		if err == nil && !bytes.Equal(v.Data, text) {
			t.Errorf("byte %d flipped: accepted other bytes", i)
		}
	}
}
