package source

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"testing"
)

// The Fetcher counts the objects it is reading (for SingleRate): every stream it
// hands out counts from Open to its first Close, whichever kind it is.
func TestFetcherCountsStreams(t *testing.T) {
	dir := t.TempDir()
	big := filepath.Join(dir, "big")
	small := filepath.Join(dir, "small")
	if err := os.WriteFile(big, make([]byte, 300<<10), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(small, make([]byte, 10), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, single := range []float64{0, -1} {
		f := NewFetcher(&File{}, FetchOptions{PartSize: 64 << 10, Parallel: 4, SingleRate: single})
		var open []io.ReadCloser
		for _, p := range []string{big, small, big} {
			rc, err := f.Open(ctx, p)
			if err != nil {
				t.Fatal(err)
			}
			open = append(open, rc)
		}
		if n := f.streams.Load(); single >= 0 && n != 3 {
			t.Errorf("SingleRate %v: %d streams counted with 3 open", single, n)
		}
		for _, rc := range open {
			if _, err := io.Copy(io.Discard, rc); err != nil {
				t.Fatal(err)
			}
			rc.Close()
			rc.Close() // a second Close counts nothing
		}
		if n := f.streams.Load(); n != 0 {
			t.Errorf("SingleRate %v: %d streams counted after every Close", single, n)
		}
	}
}
