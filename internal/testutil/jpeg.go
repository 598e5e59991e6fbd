package testutil

import "testing"

// JPEGWithout returns a copy of the JPEG data with every segment of the given
// marker (0xdb quantization tables, 0xc4 Huffman tables) before its first scan
// removed: a JPEG that leaves those tables to the decoder, as an abbreviated
// datastream or a Motion-JPEG frame does. It fails the test when there is none.
func JPEGWithout(t testing.TB, data []byte, marker byte) []byte {
	t.Helper()
	out := append([]byte(nil), data[:2]...)
	removed := 0
	for i := 2; i+4 <= len(data); {
		m := data[i+1]
		if m == 0xda {
			out = append(out, data[i:]...)
			break
		}
		n := int(data[i+2])<<8 | int(data[i+3])
		if m == marker {
			removed++
		} else {
			out = append(out, data[i:i+2+n]...)
		}
		i += 2 + n
	}
	if removed == 0 {
		t.Fatalf("no segment %#x before the first scan", marker)
	}
	return out
}
