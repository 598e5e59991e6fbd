// Package sourcetest is the conformance suite every source.Source passes: the
// backends shardload ships, a Fetcher in front of each (one stream, and parallel
// parts), cache.Cache, and a source a library user writes. A backend's test stores
// the suite's objects with Put (or WriteDir), then calls Run:
//
//	func TestConformance(t *testing.T) {
//		dir := t.TempDir()
//		sourcetest.WriteDir(t, dir)
//		sourcetest.Run(t, sourcetest.Backend{Src: mySource, Base: "my://" + dir + "/"})
//	}
//
// Objects are read whole and by ranges (at the start, the middle, the end, past the
// end, of length zero) and must come back byte for byte; a missing object must fail
// with a *source.Error wrapping source.ErrNotFound; a source that lists must expand
// a trailing slash and globs as source.Registry.Expand documents.
package sourcetest

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/shardload/shardload/source"
)

// Sizes are the object sizes every source must serve exactly.
var Sizes = []int{0, 1, 1 << 10, 33 << 10, 5<<20 + 1, 65_000_000}

// ListNames are the objects stored under "list/" for the listing cases.
var ListNames = []string{"list/train-000.tar", "list/train-001.tar", "list/train-002.tar", "list/train-003.tar",
	"list/train-004.tar", "list/other.txt", "list/sub/deeper.tar"}

// Name returns the name of the object of size n the suite reads.
func Name(n int) string { return fmt.Sprintf("obj-%d", n) }

// Data returns the object of size n: random, and the same each time.
func Data(n int) []byte {
	b := make([]byte, n)
	rand.NewChaCha8([32]byte{byte(n), byte(n >> 8), byte(n >> 16), byte(n >> 24)}).Read(b)
	return b
}

// Put stores every object the suite reads with store: Data(n) as Name(n) for each
// of Sizes, and each of ListNames with its own name as content.
func Put(store func(name string, data []byte)) {
	for _, n := range Sizes {
		store(Name(n), Data(n))
	}
	for _, name := range ListNames {
		store(name, []byte(name))
	}
}

// WriteDir stores every object the suite reads as files under dir.
func WriteDir(t testing.TB, dir string) {
	t.Helper()
	Put(func(name string, data []byte) {
		p := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
	})
}

// Backend is one Source under test, with the suite's objects already stored (Put).
type Backend struct {
	// Src is the Source under test.
	Src source.Source
	// Base is the URL prefix of the objects: Base + Name(n) is the object of size n.
	Base string
	// Scheme is the URL scheme of Base, used to register Src for the listing cases.
	// Default: the scheme of Base.
	Scheme string
	// Lists runs the listing cases: Src (or what it wraps) is a source.Lister.
	Lists bool
	// NoVersion accepts an empty Info.Version from Stat.
	NoVersion bool
	// NoFetcher runs the cases against Src alone, not also behind a Fetcher.
	NoFetcher bool
}

// Run runs the suite against b.Src as it is and, unless b.NoFetcher, behind a
// source.Fetcher reading one stream after its first part ("fetcher") and behind
// one reading parallel parts only ("fetcher-parts"). A Src without ranged reads
// (no source.RangeReader) skips the range cases.
func Run(t *testing.T, b Backend) {
	t.Helper()
	if b.Scheme == "" {
		b.Scheme = source.Scheme(b.Base)
	}
	type variant struct {
		name string
		src  source.Source
	}
	variants := []variant{{"raw", b.Src}}
	if !b.NoFetcher {
		variants = append(variants,
			// The first part decides: one stream for the rest on loopback, usually.
			variant{"fetcher", source.NewFetcher(b.Src, source.FetchOptions{PartSize: 1 << 20, Parallel: 4})},
			variant{"fetcher-parts", source.NewFetcher(b.Src, source.FetchOptions{PartSize: 1 << 20, Parallel: 4, SingleRate: -1})})
	}
	for _, v := range variants {
		t.Run(v.name, func(t *testing.T) { run(t, b, v.src) })
	}
}

func run(t *testing.T, b Backend, src source.Source) {
	// A Fetcher has an OpenRange method whatever it wraps: ranges are read where the
	// Source under test has them.
	_, ranged := b.Src.(source.RangeReader)
	rr, _ := src.(source.RangeReader)
	for _, size := range Sizes {
		data := Data(size)
		url := b.Base + Name(size)
		n := int64(size)
		t.Run(fmt.Sprint(size), func(t *testing.T) {
			info, err := src.Stat(t.Context(), url)
			if err != nil || info.Size != n || info.URL != url || info.Version == "" && !b.NoVersion {
				t.Fatalf("Stat = %+v, %v; want size %d and a version", info, err, n)
			}
			rc, err := src.Open(t.Context(), url)
			if err != nil {
				t.Fatal(err)
			}
			if got, err := ReadAll(t, rc); err != nil || !bytes.Equal(got, data) {
				t.Fatalf("Open read %d bytes, %v; want %d", len(got), err, n)
			}
			if !ranged {
				return
			}
			ranges := []struct {
				name        string
				off, length int64
			}{
				{"start", 0, 10}, {"middle", n / 2, 1000}, {"end", max(n-7, 0), 7},
				{"to end", n / 3, -1}, {"cut at end", max(n-3, 0), 100},
				{"at end", n, 10}, {"past end", n + 100, 10}, {"past end to end", n + 100, -1},
				{"zero length", n / 2, 0},
			}
			for _, r := range ranges {
				rc, err := rr.OpenRange(t.Context(), url, r.off, r.length)
				if err != nil {
					t.Fatalf("OpenRange %s (%d, %d): %v", r.name, r.off, r.length, err)
				}
				end := n
				if r.length >= 0 {
					end = min(n, r.off+r.length)
				}
				want := data[min(r.off, n):max(end, min(r.off, n))]
				if got, err := ReadAll(t, rc); err != nil || !bytes.Equal(got, want) {
					t.Errorf("OpenRange %s (%d, %d) read %d bytes, %v; want %d", r.name, r.off, r.length, len(got), err, len(want))
				}
			}
		})
	}
	t.Run("missing", func(t *testing.T) {
		url := b.Base + "no-such-object.tar"
		ops := map[string]func() error{
			"stat": func() error { _, err := src.Stat(t.Context(), url); return err },
			"open": func() error { _, err := src.Open(t.Context(), url); return err },
		}
		if ranged {
			ops["range"] = func() error { _, err := rr.OpenRange(t.Context(), url, 10, 10); return err }
		}
		for op, f := range ops {
			err := f()
			var se *source.Error
			if !errors.Is(err, source.ErrNotFound) || !errors.As(err, &se) || se.URL != url {
				t.Errorf("%s of a missing object = %v; want a *source.Error wrapping source.ErrNotFound", op, err)
			}
		}
	})
	if !b.Lists {
		return
	}
	t.Run("list", func(t *testing.T) {
		var reg source.Registry
		reg.Register(b.Scheme, src)
		want := func(names ...string) []string {
			var out []string
			for _, n := range names {
				out = append(out, b.Base+"list/"+n)
			}
			return out
		}
		trains := want("train-000.tar", "train-001.tar", "train-002.tar", "train-003.tar", "train-004.tar")
		tests := []struct {
			in   []string
			want []string
		}{
			{[]string{b.Base + "list/"}, append(want("other.txt"), trains...)},
			{[]string{b.Base + "list/train-*.tar"}, trains},
			{[]string{b.Base + "list/train-00[13].tar", b.Base + "obj-1"}, append(want("train-001.tar", "train-003.tar"), b.Base+"obj-1")},
			{[]string{b.Base + "list/*-00?.tar"}, trains},
		}
		for _, tt := range tests {
			got, err := reg.Expand(t.Context(), tt.in)
			if err != nil || !slices.Equal(got, tt.want) {
				t.Errorf("Expand(%q) = %q, %v; want %q", tt.in, got, err, tt.want)
			}
		}
		if _, err := reg.Expand(t.Context(), []string{b.Base + "list/nothing-*.tar"}); !errors.Is(err, source.ErrNoMatch) {
			t.Errorf("Expand of a pattern matching nothing = %v; want source.ErrNoMatch", err)
		}
	})
}
