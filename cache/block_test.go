package cache

import (
	"bytes"
	"errors"
	"io"
	"os"
	"testing"

	"github.com/zeebo/xxh3"
)

func TestBlockSize(t *testing.T) {
	for _, c := range []struct{ size, want int64 }{
		{0, minBlock},
		{1, minBlock},
		{minBlock * maxBlocks, minBlock},
		{minBlock*maxBlocks + 1, 2 * minBlock},
		{64 << 30, 64 << 20},
	} {
		if got := blockSize(c.size); got != c.want {
			t.Errorf("blockSize(%d) = %d, want %d", c.size, got, c.want)
		}
		if b := blockSize(c.size); (c.size+b-1)/b > maxBlocks {
			t.Errorf("blockSize(%d) = %d gives more than %d blocks", c.size, b, maxBlocks)
		}
	}
}

// The checksums do not depend on how the writes were split.
func TestBlockHasherSplitWrites(t *testing.T) {
	data := randBytes(1, 3*minBlock+1234)
	h := newBlockHasher(int64(len(data)))
	for p := data; len(p) > 0; {
		k := min(len(p), 1+len(p)%77777)
		h.Write(p[:k])
		p = p[k:]
	}
	sums := h.finish()
	if len(sums) != 4 {
		t.Fatalf("%d sums, want 4", len(sums))
	}
	for i, s := range sums {
		end := min((i+1)*minBlock, len(data))
		if want := xxh3.Hash(data[i*minBlock : end]); s != want {
			t.Errorf("block %d: %016x, want %016x", i, s, want)
		}
	}
	back, err := parseSums(formatSums(sums), 4)
	if err != nil || len(back) != 4 || back[3] != sums[3] {
		t.Errorf("parseSums(formatSums) = %x, %v", back, err)
	}
	if sums := newBlockHasher(0).finish(); len(sums) != 0 {
		t.Errorf("empty object: %d sums", len(sums))
	}
}

// corruptAt caches url, closes the cache and flips the byte at off of its data file.
func corruptAt(t *testing.T, dir, url string, up *fakeSource, off int) {
	t.Helper()
	c := newCache(t, Options{Dir: dir, DiskBytes: 64 << 20}, up)
	readAll(t, c, url)
	c.Close()
	path := dataFile(t, dir, url)
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	b[off] ^= 0x01
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// openCorrupted caches data as url, flips the byte at flip in the cache file, and
// opens url again through a new Cache on the same directory.
func openCorrupted(t *testing.T, url string, data []byte, flip int) (*Cache, *fakeSource, string, io.ReadCloser) {
	t.Helper()
	up := newFake()
	up.put(url, data, "v1")
	dir := t.TempDir()
	corruptAt(t, dir, url, up, flip)
	c := newCache(t, Options{Dir: dir, DiskBytes: 64 << 20}, up)
	r, err := c.Open(t.Context(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return c, up, dir, r
}

// A flipped byte in a later block: the blocks before it are served from the file,
// the stream goes on from the same byte through a new fetch, and the result is the
// source's bytes.
func TestCorruptLaterBlockContinuesFromTheSource(t *testing.T) {
	const url = "s3://b/big.tar"
	want := randBytes(7, 5*minBlock+100)
	c, up, dir, r := openCorrupted(t, url, want, 3*minBlock+5)
	head := make([]byte, 3*minBlock)
	if _, err := io.ReadFull(r, head); err != nil {
		t.Fatal(err)
	}
	if st := c.Stats(); st.DiskHits != 1 || st.Corrupt != 0 || up.openCount(url) != 1 {
		t.Fatalf("before the bad block: %+v, %d source opens; want a disk hit and no new fetch", st, up.openCount(url))
	}
	rest, err := io.ReadAll(r)
	r.Close()
	if err != nil {
		t.Fatal(err)
	}
	if got := append(head, rest...); !bytes.Equal(got, want) {
		t.Fatal("the stream differs from the source's bytes")
	}
	if st := c.Stats(); st.Corrupt != 1 || st.Fetches != 1 {
		t.Errorf("stats %+v: want 1 corrupt entry and 1 refetch", st)
	}
	if got, err := os.ReadFile(dataFile(t, dir, url)); err != nil || !bytes.Equal(got, want) {
		t.Errorf("the new cache file does not hold the source's bytes (%v)", err)
	}
}

// A flipped byte found after the object changed at the source: the bytes served so
// far were of the old version, so the read fails instead of mixing two versions.
func TestCorruptBlockAfterSourceChangedFails(t *testing.T) {
	const url = "s3://b/big.tar"
	_, up, _, r := openCorrupted(t, url, randBytes(8, 3*minBlock), 2*minBlock+1)
	if _, err := io.ReadFull(r, make([]byte, minBlock)); err != nil {
		t.Fatal(err)
	}
	up.put(url, randBytes(9, 3*minBlock), "v2")
	_, err := io.ReadAll(r)
	if !errors.Is(err, ErrCorrupt) || !errors.Is(err, ErrChanged) {
		t.Fatalf("got %v, want the corrupt block and the changed object reported", err)
	}
}

// Seeking a disk entry serves the bytes at the new position, verified.
func TestDiskEntrySeek(t *testing.T) {
	const url = "s3://b/seek.tar"
	up := newFake()
	want := randBytes(10, 2*minBlock+10)
	up.put(url, want, "v1")
	dir := t.TempDir()
	c := newCache(t, Options{Dir: dir, DiskBytes: 64 << 20}, up)
	readAll(t, c, url)
	c.Close()
	c = newCache(t, Options{Dir: dir, DiskBytes: 64 << 20}, up)
	r, err := c.Open(t.Context(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	sk := r.(io.Seeker)
	for _, off := range []int64{minBlock + 3, 5, 2 * minBlock, int64(len(want))} {
		if _, err := sk.Seek(off, io.SeekStart); err != nil {
			t.Fatal(err)
		}
		got := make([]byte, 8)
		n, err := io.ReadFull(r, got)
		if end := min(off+8, int64(len(want))); !bytes.Equal(got[:n], want[off:end]) || (err != nil && end-off == 8) {
			t.Errorf("at %d: got %x (%v), want %x", off, got[:n], err, want[off:end])
		}
	}
	if st := c.Stats(); st.DiskHits != 1 || st.Corrupt != 0 {
		t.Errorf("stats %+v", st)
	}
}
