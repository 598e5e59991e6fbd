package httpsrc

import (
	"fmt"
	"testing"
)

func FuzzParseContentRange(f *testing.F) {
	for _, s := range []string{"bytes 0-9/100", "bytes 5-5/*", "bytes */100", "bytes 9-0/10", "", "bytes -1-2/3", "bytes 0-0/-10", "bytes +1-2/3", "bytes 0-10/10"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		start, end, size, ok := parseContentRange(s)
		if !ok {
			return
		}
		if start < 0 || end < start || size < -1 || size >= 0 && end >= size {
			t.Fatalf("parseContentRange(%q) = %d, %d, %d, true", s, start, end, size)
		}
		total := "*"
		if size >= 0 {
			total = fmt.Sprint(size)
		}
		// What parses must read back the same when written out again.
		if s2, e2, z2, ok2 := parseContentRange(fmt.Sprintf("bytes %d-%d/%s", start, end, total)); !ok2 || s2 != start || e2 != end || z2 != size {
			t.Fatalf("round trip of %q failed", s)
		}
	})
}
