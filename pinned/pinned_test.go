//go:build linux

package pinned

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// None of these tests is parallel: several replace the package's system-call seams,
// and the fd and VmLck accounting looks at the whole process.

var page = int64(os.Getpagesize())

const mib = 1 << 20

// newTestRing makes a ring closed at the end of the test. Warnings fail the test
// unless opts.Warn is set.
func newTestRing(t testing.TB, opts Options) *Ring {
	t.Helper()
	if opts.Warn == nil {
		opts.Warn = func(msg string) { t.Errorf("unexpected warning: %s", msg) }
	}
	r, err := NewRing(opts)
	if err != nil {
		t.Fatalf("NewRing(%+v): %v", opts, err)
	}
	t.Cleanup(func() {
		if err := r.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return r
}

// small is a ring of n slabs of pages base pages each, without huge pages.
func small(n int, pages int64) Options {
	return Options{Slabs: n, SlabBytes: pages * page, NoHugePages: true}
}

// fdCount is the number of open descriptors of this process.
func fdCount(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// vmLockedKiB is the VmLck line of /proc/self/status: memory this process has locked.
func vmLockedKiB(t testing.TB) uint64 {
	t.Helper()
	n, err := lockedKiB()
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// checkUsable writes through Bytes and reads the memfd back with pread.
func checkUsable(t *testing.T, s *Slab) {
	t.Helper()
	b := s.Bytes()
	want := []byte(fmt.Sprintf("slab %d", s.Index()))
	for _, off := range []int{0, len(b) - len(want)} {
		copy(b[off:], want)
		got := make([]byte, len(want))
		if _, err := unix.Pread(s.FD(), got, int64(off)); err != nil {
			t.Fatalf("pread slab %d: %v", s.Index(), err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("slab %d at %d: pread %q after writing %q", s.Index(), off, got, want)
		}
	}
}

// mincore reports in vec which pages of b are resident (x/sys/unix has no wrapper on
// Linux).
func mincore(b, vec []byte) error {
	_, _, e := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(unsafe.SliceData(b))),
		uintptr(len(b)), uintptr(unsafe.Pointer(unsafe.SliceData(vec))))
	if e != 0 {
		return e
	}
	return nil
}

// checkRing checks what every ring promises: n slabs indexed 0..n-1 of size bytes,
// each its own page-aligned, resident, writable memfd mapping named after prefix.
func checkRing(t *testing.T, r *Ring, n int, size int64, prefix string) {
	t.Helper()
	if got := r.SlabBytes(); got != size {
		t.Errorf("SlabBytes() = %d, want %d", got, size)
	}
	slabs := r.Slabs()
	if len(slabs) != n {
		t.Fatalf("len(Slabs()) = %d, want %d", len(slabs), n)
	}
	slabs[0] = nil
	if r.Slabs()[0] == nil {
		t.Errorf("Slabs() returns the ring's own slice")
	}
	slabs = r.Slabs()
	inodes := map[uint64]int{}
	type span struct{ lo, hi uintptr }
	var spans []span
	for i, s := range slabs {
		if s.Index() != i {
			t.Errorf("Slabs()[%d].Index() = %d", i, s.Index())
		}
		b := s.Bytes()
		if int64(len(b)) != size {
			t.Fatalf("slab %d: len(Bytes()) = %d, want %d", i, len(b), size)
		}
		lo := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
		if lo%uintptr(page) != 0 {
			t.Errorf("slab %d at %#x, not page aligned", i, lo)
		}
		for _, o := range spans {
			if lo < o.hi && o.lo < lo+uintptr(len(b)) {
				t.Errorf("slab %d [%#x, %#x) overlaps [%#x, %#x)", i, lo, lo+uintptr(len(b)), o.lo, o.hi)
			}
		}
		spans = append(spans, span{lo, lo + uintptr(len(b))})

		var st unix.Stat_t
		if err := unix.Fstat(s.FD(), &st); err != nil {
			t.Fatalf("slab %d: fstat fd %d: %v", i, s.FD(), err)
		}
		if st.Size != size {
			t.Errorf("slab %d: fstat size %d, want %d", i, st.Size, size)
		}
		if j, dup := inodes[st.Ino]; dup {
			t.Errorf("slabs %d and %d share inode %d", j, i, st.Ino)
		}
		inodes[st.Ino] = i
		link, err := os.Readlink(fmt.Sprintf("/proc/self/fd/%d", s.FD()))
		if want := fmt.Sprintf("/memfd:%s-%d (deleted)", prefix, i); err != nil || link != want {
			t.Errorf("slab %d: fd links to %q (%v), want %q", i, link, err, want)
		}
		flags, err := unix.FcntlInt(uintptr(s.FD()), unix.F_GETFD, 0)
		if err != nil || flags&unix.FD_CLOEXEC == 0 {
			t.Errorf("slab %d: fd flags %#x (%v), want FD_CLOEXEC", i, flags, err)
		}

		vec := make([]byte, (len(b)+int(page)-1)/int(page))
		if err := mincore(b, vec); err != nil {
			t.Fatalf("slab %d: mincore: %v", i, err)
		}
		for p, v := range vec {
			if v&1 == 0 {
				t.Errorf("slab %d: page %d of %d not resident after NewRing", i, p, len(vec))
				break
			}
		}
		checkUsable(t, s)
	}
}

func TestOptionsConfig(t *testing.T) {
	tests := []struct {
		name      string
		opts      Options
		slabs     int
		slabBytes int64
		nameWant  string
		err       bool
	}{
		{name: "zero", opts: Options{}, slabs: 4, slabBytes: DefaultSlabBytes, nameWant: "shardload-slab"},
		{name: "one byte huge", opts: Options{SlabBytes: 1}, slabs: 4, slabBytes: 2 * mib, nameWant: DefaultName},
		{name: "one byte", opts: Options{SlabBytes: 1, NoHugePages: true}, slabs: 4, slabBytes: page, nameWant: DefaultName},
		{name: "huge multiple kept", opts: Options{Slabs: 1, SlabBytes: 6 * mib}, slabs: 1, slabBytes: 6 * mib, nameWant: DefaultName},
		{name: "huge plus one", opts: Options{Slabs: 2, SlabBytes: 2*mib + 1}, slabs: 2, slabBytes: 4 * mib, nameWant: DefaultName},
		{name: "page multiple kept", opts: Options{SlabBytes: 3 * page, NoHugePages: true}, slabs: 4, slabBytes: 3 * page, nameWant: DefaultName},
		{name: "page plus one", opts: Options{SlabBytes: page + 1, NoHugePages: true, Name: "x"}, slabs: 4, slabBytes: 2 * page, nameWant: "x"},
		{name: "negative slabs", opts: Options{Slabs: -1}, err: true},
		{name: "negative bytes", opts: Options{SlabBytes: -1}, err: true},
		{name: "rounding overflows", opts: Options{SlabBytes: 1<<63 - 1}, err: true},
		{name: "total overflows", opts: Options{Slabs: 3, SlabBytes: 1 << 62}, err: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := tt.opts.config()
			if tt.err {
				if !errors.Is(err, ErrInvalidOptions) {
					t.Fatalf("config() error = %v, want ErrInvalidOptions", err)
				}
				if _, err := NewRing(tt.opts); !errors.Is(err, ErrInvalidOptions) {
					t.Fatalf("NewRing error = %v, want ErrInvalidOptions", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if c.slabs != tt.slabs || c.slabBytes != tt.slabBytes || c.name != tt.nameWant || c.warn == nil {
				t.Errorf("config() = %d slabs of %d bytes named %q (warn set: %v), want %d of %d named %q",
					c.slabs, c.slabBytes, c.name, c.warn != nil, tt.slabs, tt.slabBytes, tt.nameWant)
			}
		})
	}
}

func TestNewRingSizes(t *testing.T) {
	tests := []struct {
		name   string
		opts   Options
		slabs  int
		bytes  int64
		prefix string
	}{
		{"defaults", Options{}, 4, DefaultSlabBytes, "shardload-slab"},
		{"huge rounding", Options{Slabs: 2, SlabBytes: 2*mib + 1}, 2, 4 * mib, DefaultName},
		{"page rounding", Options{Slabs: 3, SlabBytes: 2*page - 1, NoHugePages: true, Name: "t"}, 3, 2 * page, "t"},
		{"one slab unlocked", Options{Slabs: 1, SlabBytes: 5 * page, NoHugePages: true, NoLock: true}, 1, 5 * page, DefaultName},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newTestRing(t, tt.opts)
			checkRing(t, r, tt.slabs, tt.bytes, tt.prefix)
		})
	}
}

// TestSharedMemory does what a trainer does with a slab's fd: map it again and see
// the bytes the loader wrote, and the loader sees the trainer's writes.
func TestSharedMemory(t *testing.T) {
	r := newTestRing(t, small(2, 3))
	for _, s := range r.Slabs() {
		b := s.Bytes()
		for i := range b {
			b[i] = byte(i*7 + s.Index())
		}
		m, err := unix.Mmap(s.FD(), 0, len(b), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
		if err != nil {
			t.Fatalf("mmap slab %d again: %v", s.Index(), err)
		}
		if !bytes.Equal(m, b) {
			t.Errorf("slab %d: second mapping differs from Bytes()", s.Index())
		}
		m[len(m)-1] = 0xAB
		m[0] = 0xCD
		if b[len(b)-1] != 0xAB || b[0] != 0xCD {
			t.Errorf("slab %d: write through second mapping not seen in Bytes(): %#x %#x", s.Index(), b[0], b[len(b)-1])
		}
		if err := unix.Munmap(m); err != nil {
			t.Fatal(err)
		}

		// Opening /proc/self/fd/N makes a new open file of the same memfd, as a
		// process given the descriptor would have.
		f, err := os.Open(fmt.Sprintf("/proc/self/fd/%d", s.FD()))
		if err != nil {
			t.Fatal(err)
		}
		got := make([]byte, len(b))
		_, err = f.ReadAt(got, 0)
		f.Close()
		if err != nil || !bytes.Equal(got, b) {
			t.Errorf("slab %d: reading the reopened memfd: %v, equal %v", s.Index(), err, bytes.Equal(got, b))
		}

		seals, err := unix.FcntlInt(uintptr(s.FD()), unix.F_GET_SEALS, 0)
		want := unix.F_SEAL_SHRINK
		if err != nil || seals&want != want {
			t.Errorf("slab %d: seals %#x (%v), want %#x set", s.Index(), seals, err, want)
		}
		if err := unix.Ftruncate(s.FD(), 0); !errors.Is(err, unix.EPERM) {
			t.Errorf("slab %d: truncating the shared memfd: %v, want EPERM (sealed)", s.Index(), err)
		}
	}
	a, b := r.Slabs()[0].Bytes(), r.Slabs()[1].Bytes()
	a[1] = 1
	b[1] = 2
	if a[1] != 1 {
		t.Errorf("writing slab 1 changed slab 0")
	}
}

// Grow remaps an acquired slab larger: its memory is the new size, locked as the
// ring's, the memfd grew (a second mapping of the new size sees the same bytes), the
// old mapping is handed to unmapping first, and a smaller size or a slab not
// acquired changes nothing.
func TestGrow(t *testing.T) {
	r := newTestRing(t, Options{Slabs: 2, SlabBytes: 2 * mib})
	s, err := r.Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	other := r.Slabs()[1-s.Index()]
	if err := r.Grow(other, 8*mib, nil); !errors.Is(err, ErrNotAcquired) {
		t.Errorf("growing a free slab: %v, want ErrNotAcquired", err)
	}
	var gone []byte
	if err := r.Grow(s, 5*mib, func(old []byte) { gone = old }); err != nil {
		t.Fatal(err)
	}
	if len(gone) != 2*mib || s.Size() != 6*mib || len(s.Bytes()) != 6*mib || r.Bytes() != 8*mib {
		t.Fatalf("old mapping %d bytes, slab now %d (%d), ring %d; want 2 MiB, 6 MiB (rounded to huge pages), 8 MiB", len(gone), s.Size(), len(s.Bytes()), r.Bytes())
	}
	var st unix.Stat_t
	if err := unix.Fstat(s.FD(), &st); err != nil || st.Size != 6*mib {
		t.Fatalf("memfd size %d (%v), want 6 MiB", st.Size, err)
	}
	b := s.Bytes()
	b[len(b)-1] = 0x5A
	m, err := unix.Mmap(s.FD(), 0, len(b), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	if m[len(m)-1] != 0x5A {
		t.Error("a second mapping of the grown memfd does not see its bytes")
	}
	unix.Munmap(m)
	if err := r.Grow(s, 1*mib, nil); err != nil || s.Size() != 6*mib {
		t.Errorf("growing to less: %v, size %d", err, s.Size())
	}
	if r.Locked() != s.locked {
		t.Errorf("ring locked %v, grown slab locked %v", r.Locked(), s.locked)
	}
	if err := r.Release(s); err != nil {
		t.Fatal(err)
	}
}

// TestPrefaultFallback: without MADV_POPULATE_WRITE and without mlock, the pages are
// still faulted in when NewRing returns (checkRing asks mincore).
func TestPrefaultFallback(t *testing.T) {
	old := populate
	defer func() { populate = old }()
	calls := 0
	populate = func([]byte) error { calls++; return unix.EINVAL }
	r := newTestRing(t, Options{Slabs: 2, SlabBytes: 8 * page, NoHugePages: true, NoLock: true})
	if calls != 2 {
		t.Errorf("populate called %d times, want 2", calls)
	}
	checkRing(t, r, 2, 8*page, DefaultName)
}

func TestHugePages(t *testing.T) {
	probe := func() error {
		fd, err := unix.MemfdCreate("probe", unix.MFD_CLOEXEC)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		if err := unix.Ftruncate(fd, 2*mib); err != nil {
			return err
		}
		b, err := unix.Mmap(fd, 0, 2*mib, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
		if err != nil {
			return err
		}
		defer unix.Munmap(b)
		return unix.Madvise(b, unix.MADV_HUGEPAGE)
	}
	perr := probe()
	shmem, _ := os.ReadFile("/sys/kernel/mm/transparent_hugepage/shmem_enabled")
	t.Logf("MADV_HUGEPAGE on a memfd: %v; shmem_enabled: %s", perr, bytes.TrimSpace(shmem))

	r := newTestRing(t, Options{Slabs: 2, SlabBytes: 1})
	if r.HugePages() != (perr == nil) {
		t.Errorf("HugePages() = %v, but MADV_HUGEPAGE on a memfd says %v", r.HugePages(), perr)
	}
	if r.SlabBytes()%(2*mib) != 0 {
		t.Errorf("SlabBytes() = %d, not a multiple of 2 MiB with huge pages advised", r.SlabBytes())
	}
	if n := newTestRing(t, Options{Slabs: 1, SlabBytes: 1, NoHugePages: true}); n.HugePages() {
		t.Error("HugePages() = true with NoHugePages")
	}
}

func TestNoLeaks(t *testing.T) {
	fdCount(t) // the first ReadDir may start the runtime poller, which holds fds
	before := fdCount(t)
	base := vmLockedKiB(t)
	r, err := NewRing(small(5, 2))
	if err != nil {
		t.Fatal(err)
	}
	if got := fdCount(t); got != before+5 {
		t.Errorf("%d fds open with a 5-slab ring, %d before", got, before)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if got := fdCount(t); got != before {
		t.Errorf("%d fds open after Close, %d before NewRing", got, before)
	}

	// A NewRing that fails half way leaves nothing behind either.
	old := mmap
	defer func() { mmap = old }()
	calls := 0
	mmap = func(fd int, off int64, n, prot, flags int) ([]byte, error) {
		if calls++; calls == 3 {
			return nil, unix.ENOMEM
		}
		return unix.Mmap(fd, off, n, prot, flags)
	}
	r, err = NewRing(small(5, 2))
	if r != nil || !errors.Is(err, unix.ENOMEM) || !strings.HasPrefix(err.Error(), "pinned: mmap slab 2") {
		t.Fatalf("NewRing with a failing mmap = %v, %v", r, err)
	}
	if got := fdCount(t); got != before {
		t.Errorf("%d fds open after a failed NewRing, %d before", got, before)
	}
	if got := vmLockedKiB(t); got != base {
		t.Errorf("VmLck %d kB after a failed NewRing, %d before", got, base)
	}
}
