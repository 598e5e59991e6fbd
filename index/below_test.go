package index_test

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/shardload/shardload/index"
	"github.com/shardload/shardload/internal/shardgen"
	"github.com/shardload/shardload/shard"
	"github.com/shardload/shardload/source"
)

// indexed returns four shards of 64 samples and their exact entries.
func indexed(t *testing.T) (dir string, urls []string, infos []shard.Info) {
	t.Helper()
	dir = t.TempDir()
	spec := shardgen.Spec{Shards: 4, SamplesPerShard: 64, Seed: 3,
		Fields: []shardgen.Field{{Ext: "bin", Kind: shardgen.Random, MinBytes: 10 << 10, MaxBytes: 12 << 10}, {Ext: "cls", Kind: shardgen.Class}}}
	urls, err := shardgen.Generate(dir, spec)
	if err != nil {
		t.Fatal(err)
	}
	reg := &source.Registry{}
	reg.Register("file", &source.File{})
	if infos, err = (index.Lookup{Sources: reg, NoBeside: true}).Resolve(t.Context(), urls); err != nil {
		t.Fatal(err)
	}
	return dir, urls, infos
}

func writeIndex(t *testing.T, path string, infos []shard.Info) {
	t.Helper()
	var b bytes.Buffer
	if err := index.Write(&b, infos, false); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestIndexCountsCheckedFromBelow: an index whose count of a shard is too low for
// the shard's size (0 for a shard that is not empty, or fewer samples than the
// largest sample the index knows of could fill it with) is an error naming the
// shard and the index, given or found beside the shards, in a full lookup and a
// quick one, instead of a plan that leaves the shard's samples out unseen.
func TestIndexCountsCheckedFromBelow(t *testing.T) {
	dir, urls, infos := indexed(t)
	// Entries as an index written for another count of the shard has them: offsets
	// and members of that count (none).
	cases := map[string]func(e *shard.Info){
		"zero":            func(e *shard.Info) { e.Samples, e.Offsets, e.Members = 0, nil, nil },
		"zero-no-version": func(e *shard.Info) { e.Samples, e.Offsets, e.Members, e.Version, e.Size = 0, nil, nil, "", 0 },
		"too-low":         func(e *shard.Info) { e.Samples, e.Offsets, e.Members = 40, e.Offsets[:40], nil },
	}
	for name, edit := range cases {
		t.Run(name, func(t *testing.T) {
			bad := append([]shard.Info(nil), infos...)
			edit(&bad[2])
			for _, beside := range []bool{false, true} {
				path := filepath.Join(t.TempDir(), "given.index")
				lk := index.Lookup{Sources: &source.Registry{}, Index: path}
				if beside {
					path, lk = filepath.Join(dir, index.FileName), index.Lookup{Sources: &source.Registry{}}
				}
				lk.Sources.Register("file", &source.File{})
				writeIndex(t, path, bad)
				for _, quick := range []bool{false, true} {
					var err error
					if quick {
						_, err = lk.Quick(t.Context(), urls, 2)
					} else {
						_, err = lk.Resolve(t.Context(), urls)
					}
					if !errors.Is(err, shard.ErrBadCount) || !strings.Contains(err.Error(), filepath.Base(urls[2])) || !strings.Contains(err.Error(), filepath.Base(path)) {
						t.Errorf("beside=%v quick=%v: %v, want ErrBadCount naming %s and the index", beside, quick, err, filepath.Base(urls[2]))
					}
				}
			}
		})
	}
	// The same index, as written, is taken.
	path := filepath.Join(t.TempDir(), "good.index")
	writeIndex(t, path, infos)
	reg := &source.Registry{}
	reg.Register("file", &source.File{})
	got, err := index.Lookup{Sources: reg, Index: path}.Resolve(t.Context(), urls)
	if err != nil || len(got) != 4 || got[2].Samples != 64 {
		t.Fatalf("the index as written: %v, %v", got, err)
	}
}

// TestIndexChecksum: an index whose lines were edited after it was written (a count
// changed by hand, a line dropped) is refused with ErrChecksum, given or beside the
// shards, rather than read, or passed over for estimates.
func TestIndexChecksum(t *testing.T) {
	dir, urls, infos := indexed(t)
	for i := range infos {
		infos[i].Offsets = nil // counts alone (and members, whose mismatch is said after the sum)
	}
	var b bytes.Buffer
	if err := index.Write(&b, infos, false); err != nil {
		t.Fatal(err)
	}
	lines := strings.SplitAfter(b.String(), "\n")
	edits := map[string]string{
		"count":   strings.Join(lines[:3], "") + strings.Replace(lines[3], `"samples":64`, `"samples":63`, 1) + strings.Join(lines[4:], ""),
		"dropped": strings.Join(lines[:3], "") + strings.Join(lines[4:], ""),
	}
	if edits["count"] == b.String() {
		t.Fatalf("the edit changed nothing: %q", lines[3])
	}
	for name, text := range edits {
		for _, beside := range []bool{false, true} {
			path := filepath.Join(t.TempDir(), "given.index")
			lk := index.Lookup{Sources: &source.Registry{}, Index: path}
			if beside {
				path, lk = filepath.Join(dir, index.FileName), index.Lookup{Sources: &source.Registry{}}
			}
			lk.Sources.Register("file", &source.File{})
			if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
				t.Fatal(err)
			}
			_, err := lk.Quick(t.Context(), urls, 1)
			if name == "count" && !errors.Is(err, index.ErrChecksum) || err == nil {
				t.Errorf("%s, beside=%v: %v, want the index refused (ErrChecksum for the count)", name, beside, err)
			}
		}
	}
	if _, err := index.Read(strings.NewReader(b.String()), "ok.index"); err != nil {
		t.Fatalf("the index as written: %v", err)
	}
}
