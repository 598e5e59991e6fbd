package cache

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"testing"
)

// flipKeepTime flips the byte at off of the file at path in place (same inode) and
// sets its modification time back to what it was, as a change of the bytes on the
// medium under the file system, or a write followed by touch -r, leaves it.
func flipKeepTime(t *testing.T, path string, off int64) {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var b [1]byte
	if _, err := f.ReadAt(b[:], off); err != nil {
		t.Fatal(err)
	}
	b[0] ^= 0x01
	if _, err := f.WriteAt(b[:], off); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(path, fi.ModTime(), fi.ModTime()); err != nil {
		t.Fatal(err)
	}
	if fi2, err := os.Stat(path); err != nil || !fi2.ModTime().Equal(fi.ModTime()) || fi2.Size() != fi.Size() {
		t.Fatalf("the flipped file's modification time or size moved (%v)", err)
	}
}

// A byte flipped in the middle of a committed data file, its modification time
// kept, is found on the next read of its block, however recently the entry was
// checked: by the same process that fetched it (which read every block back), and
// by a new process on the directory in the same boot. The reader is served the
// source's bytes, fetched again from the byte of the bad block on; the entry is
// counted in Stats.Corrupt and the log names the URL, the block and its bytes. With
// a memory tier the entry is checked whole as it is loaded into memory, with the
// same outcome.
func TestFlippedByteFoundOnEveryRead(t *testing.T) {
	const url = "s3://b/flip.tar"
	want := randBytes(41, 4*minBlock+999)
	const off = 2*minBlock + 4321 // in block 2, the middle of the file
	for _, tc := range []struct {
		name   string
		same   bool // read by the process that fetched it
		memory int64
		reads  int // opens after the flip
	}{
		{"same process", true, 0, 1},
		{"new process", false, 0, 1},
		{"new process, memory tier", false, 8 << 20, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			up := newFake()
			up.put(url, want, "v1")
			dir := t.TempDir()
			lines := &logLines{t: t}
			opts := Options{Dir: dir, DiskBytes: 64 << 20, MemoryBytes: tc.memory, Logf: lines.logf}
			c := newCache(t, opts, up)
			if got := readAll(t, c, url); !bytes.Equal(got, want) {
				t.Fatal("the fetch served other bytes than the source's")
			}
			// Read once more from the disk tier, so that the process has served
			// every block of the entry from its file before the flip.
			if got := readAll(t, c, url); !bytes.Equal(got, want) {
				t.Fatal("the first disk hit served other bytes than the source's")
			}
			flipKeepTime(t, dataFile(t, dir, url), off)
			if !tc.same {
				c.Close()
				c = newCache(t, opts, up)
			}
			before := c.Stats()
			for i := range tc.reads {
				if got := readAll(t, c, url); !bytes.Equal(got, want) {
					t.Fatalf("read %d after the flip: served the flipped byte (%d of %d bytes differ)", i, diffBytes(got, want), len(want))
				}
			}
			st := c.Stats()
			if st.Corrupt-before.Corrupt != 1 || st.Fetches-before.Fetches != 1 {
				t.Errorf("stats %+v: want 1 corrupt entry and 1 fetch after the flip", st)
			}
			if n := up.openCount(url); n != 2 {
				t.Errorf("source opened %d times, want 2 (the fetch, the one after the flip)", n)
			}
			block := fmt.Sprintf("block 2 (bytes %d-%d)", 2*minBlock, 3*minBlock-1)
			if lines.count(url) == 0 || lines.count(block) != 1 {
				t.Errorf("log %q: want one line naming %s and %s", lines.lines, url, block)
			}
			if got, err := os.ReadFile(dataFile(t, dir, url)); err != nil || !bytes.Equal(got, want) {
				t.Errorf("the entry fetched again does not hold the source's bytes (%v)", err)
			}
		})
	}
}

// diffBytes counts the bytes at which a and b differ, and the difference in length.
func diffBytes(a, b []byte) int {
	n := max(len(a), len(b)) - min(len(a), len(b))
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			n++
		}
	}
	return n
}

// Every read of a disk entry checks the blocks it serves, in reads of any size and
// alignment: each block once per pass over the entry. Reads that take whole blocks
// at a block's start are read and checked in the caller's buffer, without the block
// buffer, at most directMax bytes at once.
func TestEveryReadChecksItsBlocks(t *testing.T) {
	const url = "s3://b/every.tar"
	up := newFake()
	want := randBytes(11, 3*minBlock+777)
	const blocks = 4
	up.put(url, want, "v1")
	dir := t.TempDir()
	c := newCache(t, Options{Dir: dir, DiskBytes: 64 << 20}, up)
	readAll(t, c, url)
	for _, size := range []int{1, 512, 7 << 10, minBlock - 1, minBlock, minBlock + 13, 2 * minBlock, 8 << 20} {
		before := c.Stats().BlocksChecked
		r, err := c.Open(t.Context(), url)
		if err != nil {
			t.Fatal(err)
		}
		var got []byte
		buf := make([]byte, size)
		for {
			n, err := r.Read(buf)
			if n > max(minBlock, directMax) {
				t.Fatalf("reads of %d bytes: read %d bytes at once, more than %d", size, n, directMax)
			}
			got = append(got, buf[:n]...)
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
		}
		br, ok := r.(*blockReader)
		if !ok {
			t.Fatalf("a %T, want a *blockReader", r)
		}
		if buffered := br.buf != nil; buffered != (size < minBlock) {
			t.Errorf("reads of %d bytes: through the block buffer %v, want %v", size, buffered, size < minBlock)
		}
		r.Close()
		if !bytes.Equal(got, want) {
			t.Fatalf("reads of %d bytes: the stream differs from the source's bytes", size)
		}
		if n := c.Stats().BlocksChecked - before; n != blocks {
			t.Errorf("reads of %d bytes: %d blocks checked, want %d", size, n, blocks)
		}
	}
	if st := c.Stats(); st.Corrupt != 0 || up.openCount(url) != 1 {
		t.Fatalf("stats %+v, %d source opens: want no corrupt entry and the one fetch", st, up.openCount(url))
	}
}

// A data file cut short under an open reader: the blocks past its end cannot be
// checked, so the entry is dropped and the stream goes on from the source, from the
// byte the reader got to, with the source's bytes; never fewer bytes than the
// object's.
func TestDataFileCutShortContinuesFromTheSource(t *testing.T) {
	const url = "s3://b/short.tar"
	up := newFake()
	want := randBytes(12, 3*minBlock+777)
	up.put(url, want, "v1")
	dir := t.TempDir()
	c := newCache(t, Options{Dir: dir, DiskBytes: 64 << 20}, up)
	readAll(t, c, url)
	r, err := c.Open(t.Context(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	head := make([]byte, minBlock+10)
	if _, err := io.ReadFull(r, head); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(dataFile(t, dir, url), 2*minBlock+5); err != nil {
		t.Fatal(err)
	}
	rest, err := io.ReadAll(r)
	if err != nil {
		t.Fatal(err)
	}
	if got := append(head, rest...); !bytes.Equal(got, want) {
		t.Fatalf("%d bytes, %d of them wrong: want the source's %d bytes", len(got), diffBytes(got, want), len(want))
	}
	if st := c.Stats(); st.Corrupt != 1 || up.openCount(url) != 2 {
		t.Errorf("stats %+v, %d source opens: want 1 corrupt entry and 1 fetch after the cut", st, up.openCount(url))
	}
}

func TestFlippedByteIsDetectedAndRefetched(t *testing.T) {
	for _, memory := range []int64{0, 1 << 20} {
		t.Run(fmt.Sprintf("memory=%d", memory), func(t *testing.T) {
			up := newFake()
			want := randBytes(6, 200_000)
			up.put("s3://b/a.tar", want, "v1")
			dir := t.TempDir()
			c := newCache(t, Options{Dir: dir, DiskBytes: 1 << 20}, up)
			readAll(t, c, "s3://b/a.tar")
			c.Close()

			path := dataFile(t, dir, "s3://b/a.tar")
			b, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			b[123_456] ^= 0x10
			if err := os.WriteFile(path, b, 0o600); err != nil {
				t.Fatal(err)
			}

			c2 := newCache(t, Options{Dir: dir, DiskBytes: 1 << 20, MemoryBytes: memory}, up)
			if got := readAll(t, c2, "s3://b/a.tar"); !bytes.Equal(got, want) {
				t.Fatal("served the corrupted bytes")
			}
			if st := c2.Stats(); st.Corrupt != 1 || st.Fetches != 1 {
				t.Errorf("stats %+v: want 1 corrupt entry and 1 refetch", st)
			}
			if n := up.openCount("s3://b/a.tar"); n != 2 {
				t.Errorf("source opened %d times, want 2", n)
			}
			if got, err := os.ReadFile(dataFile(t, dir, "s3://b/a.tar")); err != nil || !bytes.Equal(got, want) {
				t.Errorf("the new cache file does not hold the source's bytes (%v)", err)
			}
		})
	}
}
