package index

import (
	"bytes"
	"encoding/json"
	"slices"
	"testing"
)

// parseLine reads what json.Unmarshal reads, where it reads a line at all.
func FuzzParseLine(f *testing.F) {
	for _, s := range []string{
		`{"url":"s3://b/a.tar","version":"\"9b2c\"","size":2048,"samples":2,"offsets":"AIAI"}`,
		`{"url":"s3://b/a.tar","version":"v","size":2048,"samples":2,"offsets":"AIAI"}`,
		`{"url":"a","version":"\\\"x\\","samples":1}`,
		`{"url":"a","version":"\"x","samples":1,"x":2}`,
		`{"url":"a","version":"\n","samples":1}`,
		`{"url":"a","samples":3}`,
		`{"url":"a","size":0,"samples":0}`,
		`{"url":"a","samples":01}`,
		`{"url":"a","samples":1e3}`,
		`{"url":"a","samples":-1}`,
		`{"url":"a","samples":1,"x":2}`,
		`{"url":"s3://b/a.tar","version":"v","size":4096,"samples":2,"offsets":"AIAI","exts":["cls","jpg","tokens.npy"],"dtypes":["","","<u2"],"sizes":"AgICAgIC","items":"gQiBCA"}`,
		`{"url":"a","samples":0,"exts":[]}`,
		`{"url":"a","samples":1,"exts":["cls"],"sizes":"Ag"}`,
		`{"url":"a","samples":1,"exts":["a\"b"],"sizes":"Ag"}`,
		`{"url":"a","samples":1,"exts":["cls",],"sizes":"Ag"}`,
		`{"url":"a","samples":1,"sizes":"Ag"}`,
		`{"url":"a","samples":1,"dtypes":[]}`,
		`{"url":"a","samples":1,"exts":null}`,
		`{"url":"a","samples":1,"exts":["x"],"exts":["y"]}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		orig := bytes.Clone(b) // parseLine removes a version's escapes in place
		l, ok := parseLine(b)
		if !ok {
			if !bytes.Equal(b, orig) {
				t.Fatalf("%q: changed to %q, and not parsed (json.Unmarshal reads what is left)", orig, b)
			}
			return
		}
		b = orig
		var want line
		if err := json.Unmarshal(b, &want); err != nil {
			t.Fatalf("parsed %q, which json.Unmarshal does not: %v", b, err)
		}
		if want.Samples == nil || *want.Samples != l.samples || want.URL != string(l.url) || want.Version != string(l.version) || want.Size != l.size || want.Offsets != string(l.offsets) {
			t.Fatalf("%q: %+v; json.Unmarshal %+v", b, l, want)
		}
		m := l.members
		strings := func(raw []byte) []string {
			out := []string{}
			for _, p := range splitStrs(raw, nil) {
				out = append(out, string(p))
			}
			return out
		}
		wantBad := want.Exts == nil && (want.DTypes != nil || want.Sizes != "" || want.Items != "")
		switch {
		case m.known != (want.Exts != nil || wantBad) || m.bad != wantBad:
			t.Fatalf("%q: members known %v bad %v; json.Unmarshal %+v", b, m.known, m.bad, want)
		case want.Exts != nil && !slices.Equal(strings(m.rawExts), *want.Exts):
			t.Fatalf("%q: exts %q; json.Unmarshal %q", b, strings(m.rawExts), *want.Exts)
		case m.hasDTypes != (want.DTypes != nil) || (m.hasDTypes && !slices.Equal(strings(m.rawDTypes), want.DTypes)):
			t.Fatalf("%q: dtypes %q; json.Unmarshal %q", b, m.rawDTypes, want.DTypes)
		case string(m.sizes) != want.Sizes || string(m.items) != want.Items:
			t.Fatalf("%q: sizes %q items %q; json.Unmarshal %+v", b, m.sizes, m.items, want)
		}
	})
}
