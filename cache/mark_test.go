package cache

import (
	"bytes"
	"errors"
	"io"
	"os"
	"slices"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// A process of the boot named boot: a cache on dir whose marks record that boot
// ("": the boot identifier could not be read, no marks).
func bootCache(t *testing.T, dir, boot string, opts Options, up *fakeSource) *Cache {
	t.Helper()
	opts.Dir = dir
	if opts.DiskBytes == 0 {
		opts.DiskBytes = 64 << 20
	}
	c := newCache(t, opts, up)
	c.disk.boot = bootDigest(boot)
	return c
}

// readThrough reads url whole in reads of odd sizes and reports whether a disk
// entry was read without its block buffer (straight into the caller's buffer).
func readThrough(t *testing.T, c *Cache, url string) (data []byte, direct bool) {
	t.Helper()
	r, err := c.Open(t.Context(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	buf := make([]byte, 100_003)
	for {
		n, err := r.Read(buf)
		data = append(data, buf[:n]...)
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	br, ok := r.(*blockReader)
	return data, ok && br.buf == nil
}

// mark returns the mark the file at path carries, nil if none.
func mark(t *testing.T, path string) []byte {
	t.Helper()
	b := make([]byte, 256)
	n, err := unix.Getxattr(path, markAttr, b)
	if errors.Is(err, unix.ENODATA) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return b[:n]
}

// flip flips the byte at off of the file at path in place (the file keeps its
// inode, so its mark); keepTime sets its modification time back to what it was, as
// a change of the bytes on the medium under the file system would leave it.
func flip(t *testing.T, path string, off int64, keepTime bool) {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	var b [1]byte
	if _, err := f.ReadAt(b[:], off); err != nil {
		t.Fatal(err)
	}
	b[0] ^= 0x01
	if _, err := f.WriteAt(b[:], off); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if keepTime {
		if err := os.Chtimes(path, fi.ModTime(), fi.ModTime()); err != nil {
			t.Fatal(err)
		}
	} else if fi2, err := os.Stat(path); err != nil || fi2.ModTime().Equal(fi.ModTime()) {
		// A file system of coarse timestamps: make the write show as one.
		os.Chtimes(path, fi.ModTime().Add(time.Second), fi.ModTime().Add(time.Second))
	}
}

// An entry every block of which was checked in this boot (by the fetch that wrote
// it, by a whole read in another process, by a load into the memory tier) is read
// by the later processes of the boot without a checksum, straight into their
// buffers; a process of another boot, or with no boot identifier, checks every
// block again.
func TestBootMarkSkipsChecks(t *testing.T) {
	const url = "s3://b/a.tar"
	want := randBytes(21, 5*minBlock+321)
	const blocks = 6
	// unmarked writes the entry in a process that sets no mark.
	unmarked := func(t *testing.T, dir string, up *fakeSource) {
		c := bootCache(t, dir, "", Options{}, up)
		readAll(t, c, url)
		c.Close()
		if m := mark(t, dataFile(t, dir, url)); m != nil {
			t.Fatalf("a process without a boot identifier marked the entry: %x", m)
		}
	}
	for _, tc := range []struct {
		name string
		// verify writes the entry and checks it whole in a process of boot "b1".
		verify func(t *testing.T, dir string, up *fakeSource)
	}{
		{"fetch", func(t *testing.T, dir string, up *fakeSource) {
			c := bootCache(t, dir, "b1", Options{}, up)
			readAll(t, c, url)
			if st := c.Stats(); st.Fetches != 1 || st.BlocksChecked != blocks {
				t.Errorf("fetch: stats %+v: want 1 fetch and its %d blocks read back", st, blocks)
			}
			c.Close()
		}},
		{"whole read", func(t *testing.T, dir string, up *fakeSource) {
			unmarked(t, dir, up)
			c := bootCache(t, dir, "b1", Options{}, up)
			if got, direct := readThrough(t, c, url); !bytes.Equal(got, want) || direct {
				t.Errorf("first read in the boot: right bytes %v, read direct %v; want the source's bytes, checked", bytes.Equal(got, want), direct)
			}
			c.Close()
		}},
		{"memory load", func(t *testing.T, dir string, up *fakeSource) {
			unmarked(t, dir, up)
			c := bootCache(t, dir, "b1", Options{MemoryBytes: 8 << 20}, up)
			// The memory tier admits an entry on its second open: the first reads
			// nothing, the second loads the whole file and checks it.
			r, err := c.Open(t.Context(), url)
			if err != nil {
				t.Fatal(err)
			}
			r.Close()
			readAll(t, c, url)
			if st := c.Stats(); st.MemoryEntries != 1 || st.BlocksChecked != blocks {
				t.Errorf("memory load: stats %+v: want the entry in memory, %d blocks checked", st, blocks)
			}
			c.Close()
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			up := newFake()
			up.put(url, want, "v1")
			dir := t.TempDir()
			tc.verify(t, dir, up)
			if m := mark(t, dataFile(t, dir, url)); len(m) != markLen {
				t.Fatalf("after the entry was checked whole: mark %x, want %d bytes", m, markLen)
			}

			for _, p := range []struct {
				boot    string
				checked int64
			}{{"b1", 0}, {"b1", 0}, {"b2", blocks}, {"", blocks}} {
				c := bootCache(t, dir, p.boot, Options{}, up)
				got, direct := readThrough(t, c, url)
				st := c.Stats()
				c.Close()
				if !bytes.Equal(got, want) {
					t.Fatalf("boot %q: the stream differs from the source's bytes", p.boot)
				}
				if st.BlocksChecked != p.checked || st.DiskHits != 1 || st.Fetches != 0 {
					t.Errorf("boot %q: stats %+v: want a disk hit with %d blocks checked", p.boot, st, p.checked)
				}
				if direct != (p.checked == 0) {
					t.Errorf("boot %q: read straight into the caller's buffer %v, want %v", p.boot, direct, p.checked == 0)
				}
			}
			if n := up.openCount(url); n != 1 {
				t.Errorf("source opened %d times, want 1", n)
			}
		})
	}
}

// A block corrupted after the entry's mark was set: the boot's later processes do
// not check it, so they serve it as a local file would be served, unless the file
// was written since (its modification time moved); a process of another boot
// checks it, drops the entry and serves the source's bytes.
func TestBootMarkAndCorruption(t *testing.T) {
	const url = "s3://b/a.tar"
	want := randBytes(22, 3*minBlock+50)
	const off = 2*minBlock + 7
	for _, tc := range []struct {
		name     string
		boot     string
		keepTime bool // the corruption left the modification time as it was
		caught   bool
	}{
		{"same boot, file written after the mark", "b1", false, true},
		{"same boot, bytes changed under the file system", "b1", true, false},
		{"next boot", "b2", true, true},
		{"no boot identifier", "", true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			up := newFake()
			up.put(url, want, "v1")
			dir := t.TempDir()
			c := bootCache(t, dir, "b1", Options{}, up)
			readAll(t, c, url)
			c.Close()
			path := dataFile(t, dir, url)
			flip(t, path, off, tc.keepTime)

			c = bootCache(t, dir, tc.boot, Options{}, up)
			got := readAll(t, c, url)
			st := c.Stats()
			if !tc.caught {
				if bytes.Equal(got, want) || !bytes.Equal(got[:off], want[:off]) || st.BlocksChecked != 0 || st.Corrupt != 0 {
					t.Fatalf("stats %+v: want the marked file served as it is, unchecked", st)
				}
				return
			}
			if !bytes.Equal(got, want) {
				t.Fatal("served the corrupted bytes")
			}
			if st.Corrupt != 1 || st.Fetches != 1 || up.openCount(url) != 2 {
				t.Errorf("stats %+v, %d source opens: want 1 corrupt entry and 1 refetch", st, up.openCount(url))
			}
			// The corrupt file kept the mark it had (none set by the process that
			// found it corrupt); the new file carries this boot's, if it has one.
			if fi, err := os.Stat(path); err == nil {
				t.Errorf("the corrupt file is still there (%v)", fi.Name())
			}
			if m := mark(t, dataFile(t, dir, url)); (len(m) == markLen) != (tc.boot != "") {
				t.Errorf("the refetched entry's mark %x; want one when the boot is known", m)
			}
		})
	}
}

// A mismatch never sets the mark, nor does a read of part of an entry: the blocks
// checked must be all of them, and each must have matched.
func TestBootMarkNeedsEveryBlockToMatch(t *testing.T) {
	const url = "s3://b/a.tar"
	want := randBytes(23, 4*minBlock)
	up := newFake()
	up.put(url, want, "v1")
	dir := t.TempDir()
	c := bootCache(t, dir, "", Options{}, up) // no mark
	readAll(t, c, url)
	c.Close()
	path := dataFile(t, dir, url)

	// Part of the entry: three blocks of four, checked; no mark.
	c = bootCache(t, dir, "b1", Options{}, up)
	r, err := c.Open(t.Context(), url)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(r, make([]byte, 3*minBlock)); err != nil {
		t.Fatal(err)
	}
	r.Close()
	if m := mark(t, path); m != nil || c.Stats().BlocksChecked != 3 {
		t.Fatalf("after 3 of 4 blocks: mark %x, %d blocks checked; want no mark, 3 checked", m, c.Stats().BlocksChecked)
	}
	// The fourth block, in another open of the same process: now every block has
	// matched, and the file is marked.
	r, err = c.Open(t.Context(), url)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(io.Discard, r); err != nil {
		t.Fatal(err)
	}
	r.Close()
	c.Close()
	if m := mark(t, path); len(m) != markLen || c.Stats().BlocksChecked != 4 {
		t.Fatalf("after every block: mark %x, %d blocks checked; want a mark, 4 checked", m, c.Stats().BlocksChecked)
	}

	// The last block corrupt, found in another boot: the reader holds the corrupt
	// file open, and it keeps the old boot's mark (the process that found it set
	// none).
	flip(t, path, 4*minBlock-1, true)
	old := mark(t, path)
	held, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	for _, memory := range []int64{0, 8 << 20} {
		c = bootCache(t, dir, "b2", Options{MemoryBytes: memory}, up)
		for range 2 { // the second open loads the memory tier, when there is one
			if got := readAll(t, c, url); !bytes.Equal(got, want) {
				t.Fatal("served the corrupted bytes")
			}
		}
		c.Close()
	}
	b := make([]byte, 256)
	n, err := unix.Fgetxattr(int(held.Fd()), markAttr, b)
	if err != nil || !bytes.Equal(b[:n], old) {
		t.Errorf("the corrupt file's mark is %x (%v); want the old boot's %x", b[:n], err, old)
	}
	if !bytes.Equal(old[:16], []byte(bootDigest("b1"))) {
		t.Errorf("the mark %x does not begin with boot b1's digest", old)
	}
}

// A file system that keeps no extended attributes (the fault hook answers as tmpfs
// before Linux 6.6 does): no mark, each process checks the blocks it reads, as
// without marks, and nothing is logged. Another error setting a mark is logged once
// for the process, whatever the number of entries.
func TestBootMarkUnsupported(t *testing.T) {
	for _, tc := range []struct {
		name string
		ops  []string // the operations that fail
		err  syscall.Errno
		logs int
	}{
		{"no extended attributes", []string{"getxattr", "setxattr"}, unix.ENOTSUP, 0},
		{"quota", []string{"setxattr"}, unix.EDQUOT, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			up := newFake()
			urls := []string{"s3://b/0.tar", "s3://b/1.tar", "s3://b/2.tar"}
			for i, u := range urls {
				up.put(u, randBytes(uint64(30+i), 2*minBlock+1), "v1")
			}
			dir := t.TempDir()
			fault := func(op, path string) error {
				if slices.Contains(tc.ops, op) {
					return &os.PathError{Op: op, Path: path, Err: tc.err}
				}
				return nil
			}
			for range 2 {
				lines := &logLines{t: t}
				c := bootCache(t, dir, "b1", Options{Logf: lines.logf}, up)
				c.disk.fault = fault
				for _, u := range urls {
					if got, direct := readThrough(t, c, u); direct {
						t.Errorf("%s: read straight from the file without a check", u)
					} else if !bytes.Equal(got, up.objs[u].data) {
						t.Fatalf("%s: wrong bytes", u)
					}
				}
				st := c.Stats()
				c.Close()
				if st.BlocksChecked != 9 {
					t.Errorf("stats %+v: want every block of the 3 entries checked (9)", st)
				}
				if n := lines.count("mark"); n != tc.logs {
					t.Errorf("%d log lines about marks, want %d", n, tc.logs)
				}
				for _, u := range urls {
					if m := mark(t, dataFile(t, dir, u)); m != nil {
						t.Errorf("%s carries a mark %x", u, m)
					}
				}
			}
		})
	}
}
