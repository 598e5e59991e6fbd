package shardgen

import (
	"archive/tar"
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"strings"
	"testing"
)

// npyUint16 parses a version 1.0 .npy file of a 1-D little-endian uint16 array and
// returns its elements; it fails the test on anything else.
func npyUint16(t *testing.T, name string, b []byte) []uint16 {
	t.Helper()
	if len(b) < 10 || string(b[:8]) != "\x93NUMPY\x01\x00" {
		t.Fatalf("%s: no .npy 1.0 magic: %q", name, b[:min(len(b), 10)])
	}
	hlen := int(binary.LittleEndian.Uint16(b[8:10]))
	if (10+hlen)%64 != 0 || len(b) < 10+hlen || b[10+hlen-1] != '\n' {
		t.Fatalf("%s: header of %d bytes", name, hlen)
	}
	header, data := string(b[10:10+hlen]), b[10+hlen:]
	var n int
	if _, err := fmt.Sscanf(strings.TrimSpace(header), "{'descr': '<u2', 'fortran_order': False, 'shape': (%d,), }", &n); err != nil {
		t.Fatalf("%s: header %q: %v", name, header, err)
	}
	if len(data) != 2*n {
		t.Fatalf("%s: shape (%d,) but %d data bytes", name, n, len(data))
	}
	out := make([]uint16, n)
	for i := range out {
		out[i] = binary.LittleEndian.Uint16(data[2*i:])
	}
	return out
}

// docs returns the documents of shard i of s, written by WriteShard, by sample key.
func docs(t *testing.T, s Spec, i int) map[string][]uint16 {
	t.Helper()
	var buf bytes.Buffer
	if err := WriteShard(&buf, s, i); err != nil {
		t.Fatal(err)
	}
	out := map[string][]uint16{}
	tr := tar.NewReader(&buf)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		key, ext, ok := strings.Cut(h.Name, ".")
		if !ok || ext != "tokens.npy" {
			t.Fatalf("member %q: want KEY.tokens.npy", h.Name)
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		if _, dup := out[key]; dup {
			t.Fatalf("key %s twice", key)
		}
		out[key] = npyUint16(t, h.Name, b)
	}
	return out
}

// The docs preset: one tokens.npy per sample, a 1-D uint16 array of 1 to 1024 ids in
// [2, 1024), of lengths that vary; the same seed gives the same documents, another
// seed others.
func TestDocsPreset(t *testing.T) {
	s := Spec{Shards: 2, SamplesPerShard: 300, Fields: Presets["docs"], Seed: 7}
	lengths := map[int]int{}
	tokens, follow := 0, 0
	for i := range s.Shards {
		d := docs(t, s, i)
		if len(d) != s.SamplesPerShard {
			t.Fatalf("shard %d: %d samples, want %d", i, len(d), s.SamplesPerShard)
		}
		for j := range s.SamplesPerShard {
			doc, ok := d[Key(i, j)]
			if !ok {
				t.Fatalf("shard %d: no sample %s", i, Key(i, j))
			}
			if len(doc) < 1 || len(doc) > 1024 {
				t.Errorf("%s: %d tokens, want 1 to 1024", Key(i, j), len(doc))
			}
			lengths[len(doc)]++
			for k, id := range doc {
				if id < FirstToken || id >= 1024 {
					t.Fatalf("%s: token %d is %d, want 2 <= id < 1024", Key(i, j), k, id)
				}
				if k > 0 && id == doc[k-1]+1 {
					follow++
				}
			}
			tokens += len(doc)
		}
	}
	// 600 lengths drawn uniformly from 1024: far more than 100 distinct ones, unless
	// the length does not vary; their mean near 512.
	if len(lengths) < 100 {
		t.Errorf("%d distinct lengths over %d documents: %v", len(lengths), 2*s.SamplesPerShard, lengths)
	}
	if mean := float64(tokens) / float64(2*s.SamplesPerShard); mean < 400 || mean > 625 {
		t.Errorf("mean length %.1f, want about 512", mean)
	}
	// About half of the tokens follow their predecessor's id.
	if f := float64(follow) / float64(tokens); f < 0.4 || f > 0.6 {
		t.Errorf("%.2f of the tokens are their predecessor's next id, want about 0.5", f)
	}

	again := docs(t, s, 1)
	other := docs(t, Spec{Shards: 2, SamplesPerShard: 300, Fields: Presets["docs"], Seed: 8}, 1)
	same, differ := 0, 0
	for k, d := range docs(t, s, 1) {
		if fmt.Sprint(d) == fmt.Sprint(again[k]) {
			same++
		}
		if fmt.Sprint(d) != fmt.Sprint(other[k]) {
			differ++
		}
	}
	if same != s.SamplesPerShard || differ < s.SamplesPerShard-1 {
		t.Errorf("seed 7 twice: %d of %d documents equal; seeds 7 and 8: %d differ", same, s.SamplesPerShard, differ)
	}
}

// A Document field's bounds: a fixed length, and the largest vocabulary uint16 holds.
func TestDocumentBounds(t *testing.T) {
	s := Spec{Shards: 1, SamplesPerShard: 50, Fields: []Field{{Ext: "tokens.npy", Kind: Document, MinTokens: 7, MaxTokens: 7, Vocab: 1 << 16}}}
	high := false
	for k, doc := range docs(t, s, 0) {
		if len(doc) != 7 {
			t.Errorf("%s: %d tokens, want 7", k, len(doc))
		}
		for _, id := range doc {
			if id < FirstToken {
				t.Errorf("%s: token %d", k, id)
			}
			high = high || id >= 1024
		}
	}
	if !high {
		t.Error("no id of 1024 or more in a vocabulary of 65536")
	}
}
