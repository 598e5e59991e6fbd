package source

import (
	"bytes"
	"context"
	"errors"
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

// statCounter is a File that counts its Stats.
type statCounter struct {
	File
	stats int
}

func (s *statCounter) Stat(ctx context.Context, url string) (Info, error) {
	s.stats++
	return s.File.Stat(ctx, url)
}

// OpenInfo reads the object at the Info given, without a Stat of its own, and pinned
// to that version: an object written since fails with ErrChanged. Open asks first.
func TestFetcherOpenInfoAsksNothing(t *testing.T) {
	p := filepath.Join(t.TempDir(), "obj")
	data := make([]byte, 300<<10)
	for i := range data {
		data[i] = byte(i * 7)
	}
	if err := os.WriteFile(p, data, 0o600); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, parallel := range []int{1, 4} {
		src := &statCounter{}
		f := NewFetcher(src, FetchOptions{PartSize: 64 << 10, Parallel: parallel, SingleRate: -1})
		info, err := f.Stat(ctx, p)
		if err != nil {
			t.Fatal(err)
		}
		rc, err := f.OpenInfo(ctx, info)
		if err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(rc)
		rc.Close()
		if err != nil || !bytes.Equal(got, data) {
			t.Fatalf("parallel %d: %d bytes, %v; want the object's %d", parallel, len(got), err, len(data))
		}
		if src.stats != 1 {
			t.Errorf("parallel %d: %d Stats for a Stat and an OpenInfo; want 1", parallel, src.stats)
		}
		rc, err = f.Open(ctx, p)
		if err != nil {
			t.Fatal(err)
		}
		rc.Close()
		if src.stats != 2 {
			t.Errorf("parallel %d: Open made %d Stats; want 1", parallel, src.stats-1)
		}
	}
	// Written since the Stat: the read fails, it does not serve other bytes under the
	// version given.
	f := NewFetcher(&File{}, FetchOptions{PartSize: 64 << 10, Parallel: 4, SingleRate: -1})
	info, err := f.Stat(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, data[:200<<10], 0o600); err != nil {
		t.Fatal(err)
	}
	rc, err := f.OpenInfo(ctx, info)
	if err == nil {
		_, err = io.ReadAll(rc)
		rc.Close()
	}
	if !errors.Is(err, ErrChanged) {
		t.Errorf("OpenInfo of an object written since its Stat: %v; want ErrChanged", err)
	}
}

// OpenInfoRange reads a range at the Info given (an index's size and version), with
// no Stat of its own, through a Registry as well; pinned like OpenInfo: an object
// written since fails with ErrChanged. Without a version it asks first.
func TestFetcherOpenInfoRangeAsksNothing(t *testing.T) {
	p := filepath.Join(t.TempDir(), "obj")
	data := make([]byte, 300<<10)
	for i := range data {
		data[i] = byte(i * 11)
	}
	if err := os.WriteFile(p, data, 0o600); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	src := &statCounter{}
	f := NewFetcher(src, FetchOptions{PartSize: 64 << 10, Parallel: 4, SingleRate: -1})
	reg := &Registry{}
	reg.Register("file", f)
	info, err := f.Stat(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	info.URL = "file://" + p
	for _, r := range [][2]int64{{0, 100}, {1000, 200 << 10}, {250 << 10, 50 << 10}} {
		rc, err := reg.OpenInfoRange(ctx, info, r[0], r[1])
		if err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(rc)
		rc.Close()
		if err != nil || !bytes.Equal(got, data[r[0]:r[0]+r[1]]) {
			t.Fatalf("range %v: %d bytes, %v", r, len(got), err)
		}
	}
	if src.stats != 1 {
		t.Errorf("%d Stats for a Stat and three OpenInfoRange; want 1", src.stats)
	}
	unversioned := info
	unversioned.Version = ""
	rc, err := reg.OpenInfoRange(ctx, unversioned, 0, 10)
	if err != nil {
		t.Fatal(err)
	}
	rc.Close()
	if src.stats != 2 {
		t.Errorf("OpenInfoRange without a version made %d Stats; want 1", src.stats-1)
	}
	if err := os.WriteFile(p, data[:200<<10], 0o600); err != nil {
		t.Fatal(err)
	}
	rc, err = reg.OpenInfoRange(ctx, info, 0, 1000)
	if err == nil {
		_, err = io.ReadAll(rc)
		rc.Close()
	}
	if !errors.Is(err, ErrChanged) {
		t.Errorf("OpenInfoRange of an object written since its Stat: %v; want ErrChanged", err)
	}
}
