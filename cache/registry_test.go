package cache

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"

	"github.com/shardload/shardload/source"
)

func TestWrapRegistry(t *testing.T) {
	up := newFake()
	up.put("mem://b/a.tar", []byte("remote"), "v1")
	local := filepath.Join(t.TempDir(), "x.tar")
	os.WriteFile(local, []byte("local"), 0o600)
	reg := &source.Registry{}
	reg.Register("mem", up)
	reg.Register("file", &source.File{})
	out, c, err := Wrap(Options{MemoryBytes: 1 << 20}, reg, "file")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if got := readAll(t, out, "mem://b/a.tar"); string(got) != "remote" {
		t.Fatal(string(got))
	}
	if got := readAll(t, out, local); string(got) != "local" {
		t.Fatal(string(got))
	}
	if st := c.Stats(); st.Fetches != 1 || st.MemoryEntries != 1 {
		t.Errorf("stats %+v: want the mem object cached and the file not", st)
	}
}

// Listing URLs expand through a wrapped registry as through the bare one, and a
// scheme whose source cannot list says so.
func TestWrappedRegistryLists(t *testing.T) {
	dir := t.TempDir()
	for _, n := range []string{"train-1.tar", "train-2.tar", "eval-1.tar"} {
		os.WriteFile(filepath.Join(dir, n), []byte(n), 0o600)
	}
	reg := &source.Registry{}
	// Listed through the cache here (not left uncached), to exercise Cache.List.
	reg.Register("file", &source.File{})
	reg.Register("mem", newFake())
	out, c, err := Wrap(Options{MemoryBytes: 1 << 20}, reg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	pattern := "file://" + dir + "/train-*.tar"
	want, err := reg.Expand(context.Background(), []string{pattern})
	if err != nil {
		t.Fatal(err)
	}
	got, err := out.Expand(context.Background(), []string{pattern})
	if err != nil || !slices.Equal(got, want) || len(got) != 2 {
		t.Fatalf("through the cache: %v %v, bare: %v", got, err, want)
	}
	if _, err := out.Expand(context.Background(), []string{"mem://b/train-*.tar"}); !errors.Is(err, source.ErrNotLister) {
		t.Errorf("listing a source that cannot list: %v", err)
	}
}

// Behind a Registry, as Wrap builds it, a range of an object not cached is read from
// the scheme's source as a range, not cut from a whole fetch; the whole object is
// fetched into the cache behind it, once, and the next range is a hit.
func TestOpenRangeBehindRegistryReadsARangeAndFillsBehind(t *testing.T) {
	up := &rangeFake{fakeSource: newFake()}
	data := randBytes(10, 50_000)
	up.put("mem://b/a.tar", data, "v1")
	reg := &source.Registry{}
	reg.Register("mem", up)
	_, c, err := Wrap(Options{Dir: t.TempDir(), DiskBytes: 1 << 20}, reg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	read := func(off, n int64) {
		t.Helper()
		r, err := c.OpenRange(t.Context(), "mem://b/a.tar", off, n)
		if err != nil {
			t.Fatal(err)
		}
		got, _ := io.ReadAll(r)
		r.Close()
		if !bytes.Equal(got, data[off:off+n]) {
			t.Fatalf("range %d+%d: wrong bytes", off, n)
		}
	}
	read(40_000, 100)
	read(41_000, 100) // while the object may still be filling: another range, no second fetch
	c.behindWG.Wait()
	st := c.Stats()
	if up.openCount("mem://b/a.tar") != 1 || st.Fetches != 1 || st.DiskEntries != 1 || up.ranges < 1 || up.ranges > 2 {
		t.Fatalf("%d ranged reads, %d whole opens, stats %+v: want the ranges read as ranges and one fetch behind them", up.ranges, up.openCount("mem://b/a.tar"), st)
	}
	ranges := up.ranges
	read(10_000, 5_000)
	if st := c.Stats(); up.ranges != ranges || up.openCount("mem://b/a.tar") != 1 || st.DiskHits != 1 {
		t.Errorf("%d ranged reads, stats %+v: want the third range from the cache", up.ranges, st)
	}
}

// TestWholeObjectRangeIsCached: OpenRange and OpenVersion of a whole object (off 0,
// length < 0, as a loader reading a shard of known version asks) fill the cache even
// when the source reads ranges, and the next open is a hit.
func TestWholeObjectRangeIsCached(t *testing.T) {
	up := &rangeFake{fakeSource: newFake()}
	data := randBytes(11, 50_000)
	up.put("mem://b/a.tar", data, "v1")
	up.put("mem://b/b.tar", data, "v1")
	reg := &source.Registry{}
	reg.Register("mem", up)
	_, c, err := Wrap(Options{Dir: t.TempDir(), DiskBytes: 1 << 20}, reg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	open := []func(url string) (io.ReadCloser, error){
		func(url string) (io.ReadCloser, error) { return c.OpenRange(t.Context(), url, 0, -1) },
		func(url string) (io.ReadCloser, error) { return c.OpenVersion(t.Context(), url, "v1", 0, -1) },
	}
	for i, url := range []string{"mem://b/a.tar", "mem://b/b.tar"} {
		for range 2 {
			r, err := open[i](url)
			if err != nil {
				t.Fatal(err)
			}
			got, _ := io.ReadAll(r)
			r.Close()
			if !bytes.Equal(got, data) {
				t.Fatalf("%s: wrong bytes", url)
			}
		}
		if n := up.openCount(url); n != 1 || up.ranges != 0 {
			t.Errorf("%s: %d whole opens, %d ranged reads: want one fetch into the cache", url, n, up.ranges)
		}
	}
	if st := c.Stats(); st.Fetches != 2 || st.DiskHits != 2 || st.Bypassed != 0 {
		t.Errorf("stats %+v: want 2 fetches, 2 hits, no bypass", st)
	}
}

// preparingSource is a fakeSource that records what it was asked to prepare.
type preparingSource struct {
	*fakeSource
	prepared []string
}

func (p *preparingSource) Prepare(url string) { p.prepared = append(p.prepared, url) }

func TestPrepareReachesTheUpstream(t *testing.T) {
	up := &preparingSource{fakeSource: newFake()}
	reg := &source.Registry{}
	reg.Register("s3", up)
	wrapped, c, err := Wrap(Options{Dir: t.TempDir(), DiskBytes: 1 << 20, Logf: t.Logf}, reg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	source.Prepare(wrapped, "s3://b/a.tar")
	if len(up.prepared) != 1 || up.prepared[0] != "s3://b/a.tar" {
		t.Fatalf("upstream prepared %v, want the URL once", up.prepared)
	}
}

// OpenVersion of ranges of an object not cached, no larger than rangeFillMax (the
// ranks of a node reading the parts of a shard they split), is served from one
// fetch of the whole object: the store sends it once, and no range. A larger one's
// range is read as a range, the object fetched behind it. An object the budget
// cannot hold has each range read from the store as that range alone.
func TestOpenVersionRangesOfASmallObjectFetchItOnce(t *testing.T) {
	data := randBytes(12, 50_000)
	setup := func(t *testing.T, budget int64) (*rangeFake, *Cache) {
		up := &rangeFake{fakeSource: newFake()}
		up.put("mem://b/a.tar", data, "v1")
		reg := &source.Registry{}
		reg.Register("mem", up)
		_, c, err := Wrap(Options{Dir: t.TempDir(), DiskBytes: budget}, reg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return up, c
	}
	read := func(t *testing.T, c *Cache, tally *Tally, off, n int64) {
		r, err := c.OpenVersion(WithTally(t.Context(), tally), "mem://b/a.tar", "v1", off, n)
		if err != nil {
			t.Error(err)
			return
		}
		got, err := io.ReadAll(r)
		r.Close()
		if err != nil || !bytes.Equal(got, data[off:off+n]) {
			t.Errorf("range %d+%d: %d bytes, %v", off, n, len(got), err)
		}
	}
	t.Run("small", func(t *testing.T) {
		up, c := setup(t, 1<<20)
		var a, b Tally
		var wg sync.WaitGroup
		wg.Add(2)
		go func() { defer wg.Done(); read(t, c, &a, 0, 20_000) }()
		go func() { defer wg.Done(); read(t, c, &b, 20_000, 30_000) }()
		wg.Wait()
		c.behindWG.Wait()
		st := c.Stats()
		if up.ranges != 0 || up.openCount("mem://b/a.tar") != 1 || st.BytesFetched != int64(len(data)) || st.BytesBypassed != 0 {
			t.Errorf("%d ranged reads, %d whole opens, stats %+v: want one fetch and nothing else from the store", up.ranges, up.openCount("mem://b/a.tar"), st)
		}
		if got := a.Bytes().Store + b.Bytes().Store; got != int64(len(data)) {
			t.Errorf("the readers' tallies count %d bytes from the store, want %d", got, len(data))
		}
	})
	t.Run("large", func(t *testing.T) {
		defer func(m int64) { rangeFillMax = m }(rangeFillMax)
		rangeFillMax = 10_000
		up, c := setup(t, 1<<20)
		read(t, c, &Tally{}, 20_000, 1_000)
		c.behindWG.Wait()
		if st := c.Stats(); up.ranges != 1 || up.openCount("mem://b/a.tar") != 1 || st.BytesBypassed != 1_000 || st.Fetches != 1 {
			t.Errorf("%d ranged reads, %d whole opens, stats %+v: want the range read as a range and one fetch behind it", up.ranges, up.openCount("mem://b/a.tar"), st)
		}
	})
	t.Run("no room", func(t *testing.T) {
		up, c := setup(t, 10_000)
		read(t, c, &Tally{}, 20_000, 1_000)
		read(t, c, &Tally{}, 0, 500)
		if st := c.Stats(); up.openCount("mem://b/a.tar") != 0 || st.BytesBypassed != 1_500 || st.DiskEntries != 0 {
			t.Errorf("%d whole opens, stats %+v: want each range alone from the store", up.openCount("mem://b/a.tar"), st)
		}
	})
}
