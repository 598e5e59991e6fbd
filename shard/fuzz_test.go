package shard

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"
)

// FuzzReader feeds arbitrary bytes to the sample reader, seeded from the real shards in
// testdata/. The reader must never panic or hang, must fail only with *Error, and must
// agree with itself in sizes-only mode.
func FuzzReader(f *testing.F) {
	for _, name := range []string{"webdataset__sample.tgz", "aistore__small-mnist-3.tar", "pytorch-data__wds.tar", "webdataset__testgz.tar"} {
		data, err := os.ReadFile(filepath.Join("..", "testdata", name))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data[:min(len(data), 4<<10)])
	}
	f.Add(buildTar(f, member{name: "a.x", data: "1"}, member{name: "a.x", data: "2"}, member{name: "b.y", data: "3"}))
	f.Add(compress(f, Zstd, buildTar(f, member{name: "k.seg.png", data: "abc"})))
	f.Fuzz(func(t *testing.T, data []byte) {
		full := fuzzRead(t, data, false)
		sizes := fuzzRead(t, data, true)
		if len(full) != len(sizes) {
			t.Fatalf("%d samples with data, %d sizes-only", len(full), len(sizes))
		}
		for i := range full {
			if full[i] != sizes[i] {
				t.Fatalf("sample %d: %q vs sizes-only %q", i, full[i], sizes[i])
			}
		}
	})
}

// fuzzRead returns one line per sample (key, extensions, sizes), checking errors and,
// for plain tars, that each field's data is the input's bytes at its offset.
func fuzzRead(t *testing.T, data []byte, sizesOnly bool) []string {
	r := NewReader(bytes.NewReader(data), Options{URL: "fuzz", MaxMemberSize: 1 << 20, SizesOnly: sizesOnly})
	defer r.Close()
	var out []string
	for {
		s, err := r.Next()
		if err == io.EOF {
			return out
		}
		var se *Error
		if err != nil && !errors.As(err, &se) {
			t.Fatalf("error of type %T: %v", err, err)
		}
		if err != nil && !se.Skippable() {
			return out
		}
		if err != nil {
			out = append(out, "error "+se.Key)
			continue
		}
		line := s.Key
		for _, f := range s.Fields {
			line += " " + f.Ext
			if !sizesOnly && r.Compression() == None && !bytes.Equal(f.Data, data[f.Offset:f.Offset+f.Size]) {
				t.Fatalf("%s: data differs from the input at offset %d", f.Name, f.Offset)
			}
		}
		out = append(out, line)
	}
}
