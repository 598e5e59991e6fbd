package main

import (
	"strings"
	"testing"

	"github.com/shardload/shardload/index"
	"github.com/shardload/shardload/internal/shardgen"
)

// ls and cat read shards whole, and keep their entries in the node's index store: a
// bench on the same node afterwards plans from exact counts and reads no shard to
// count it; with --no-index-store nothing is kept.
func TestReadsKeepIndexEntries(t *testing.T) {
	dir := t.TempDir()
	spec := shardgen.Spec{Shards: 3, Samples: []int{9, 2, 15}, Seed: 6}
	paths, err := shardgen.Generate(dir, spec)
	if err != nil {
		t.Fatal(err)
	}
	pattern := dir + "/" + spec.Pattern()
	for _, cmd := range []string{"ls", "cat"} {
		store := t.TempDir()
		if code, _, stderr := runCLI(t, cmd, "--index-dir", store, pattern); code != 0 {
			t.Fatalf("%s: exit %d: %s", cmd, code, stderr)
		}
		s, err := index.OpenStore(store)
		if err != nil {
			t.Fatal(err)
		}
		for i, p := range paths {
			e, ok := s.Get(p)
			if want := []int{9, 2, 15}[i]; !ok || e.Samples != want || len(e.Offsets) != want || e.Version == "" {
				t.Errorf("%s: the store's entry of %s: %+v, %v; want %d samples with offsets", cmd, p, e, ok, want)
			}
		}
		code, stdout, stderr := runCLI(t, "bench", "--index-dir", store, pattern)
		if code != 0 || strings.Contains(stdout+stderr, "estimated") || strings.Contains(stderr, "no index") || !strings.Contains(stdout, "26 samples") {
			t.Errorf("%s, then bench: exit %d:\n%s%s", cmd, code, stdout, stderr)
		}
	}
	store := t.TempDir()
	runCLI(t, "ls", "--index-dir", store, "--no-index-store", pattern)
	if s, _ := index.OpenStore(store); s != nil {
		if _, ok := s.Get(paths[0]); ok {
			t.Error("--no-index-store kept an entry")
		}
	}
}
