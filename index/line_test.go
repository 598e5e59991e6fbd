package index

import (
	"encoding/json"
	"testing"
)

// parseLine reads what json.Unmarshal reads, where it reads a line at all.
func FuzzParseLine(f *testing.F) {
	for _, s := range []string{
		`{"url":"s3://b/a.tar","version":"\"9b2c\"","size":2048,"samples":2,"offsets":"AIAI"}`,
		`{"url":"s3://b/a.tar","version":"v","size":2048,"samples":2,"offsets":"AIAI"}`,
		`{"url":"a","samples":3}`,
		`{"url":"a","size":0,"samples":0}`,
		`{"url":"a","samples":01}`,
		`{"url":"a","samples":1e3}`,
		`{"url":"a","samples":-1}`,
		`{"url":"a","samples":1,"x":2}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		l, samples, ok := parseLine(b, "s3://b/a.tar")
		if !ok {
			return
		}
		var want line
		if err := json.Unmarshal(b, &want); err != nil {
			t.Fatalf("parsed %q, which json.Unmarshal does not: %v", b, err)
		}
		if want.Samples == nil || *want.Samples != samples || want.URL != l.URL || want.Version != l.Version || want.Size != l.Size || want.Offsets != l.Offsets {
			t.Fatalf("%q: %+v, %d; json.Unmarshal %+v", b, l, samples, want)
		}
	})
}
