package source

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// BenchmarkCanonical: the relative paths of a dataset's shards in one directory, as
// planning local shards makes them canonical: one call per path (each reads the
// working directory), and a batch (CanonicalAll: one read for all).
func BenchmarkCanonical(b *testing.B) {
	dir := b.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "data"), 0o755); err != nil {
		b.Fatal(err)
	}
	b.Chdir(dir)
	names := make([]string, 1000)
	for i := range names {
		names[i] = fmt.Sprintf("data/train-%06d.tar", i)
	}
	b.Run("each", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			for _, n := range names {
				Canonical(n)
			}
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(names)), "ns/path")
	})
	b.Run("all", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			CanonicalAll(names)
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(names)), "ns/path")
	})
}
