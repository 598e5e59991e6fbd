//go:build linux

package pinned

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// None of these tests is parallel: several replace the package's system-call seams,
// and the fd and VmLck accounting looks at the whole process.

var page = int64(os.Getpagesize())

const mib = 1 << 20

// childEnv makes the test binary, re-executed by TestRealMemlockLimit, run
// memlockChild instead of the tests.
const childEnv = "PINNED_TEST_MEMLOCK_CHILD"

func TestMain(m *testing.M) {
	if mode := os.Getenv(childEnv); mode != "" {
		os.Exit(memlockChild(mode))
	}
	os.Exit(m.Run())
}

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

// waitWaiting spins (yielding, not sleeping) until n Acquire calls are blocked in r.
func waitWaiting(t *testing.T, r *Ring, n int32) {
	t.Helper()
	waitFor(t, fmt.Sprintf("%d Acquire calls waiting", n), func() bool { return r.waiting.Load() == n })
}

// receive returns the next result; the timeout only stops a broken test from hanging.
func receive(t *testing.T, results <-chan acquired) acquired {
	t.Helper()
	select {
	case res := <-results:
		return res
	case <-time.After(10 * time.Second):
		t.Fatal("Acquire did not return")
		return acquired{}
	}
}

// waitFor spins, yielding, until cond holds; the deadline only stops a broken test.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s", what)
		}
		runtime.Gosched()
	}
}

type acquired struct {
	s   *Slab
	err error
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

func TestBackPressure(t *testing.T) {
	for _, waiters := range []int{1, 3} {
		t.Run(fmt.Sprintf("%d waiting", waiters), func(t *testing.T) {
			const n = 3
			r := newTestRing(t, small(n, 1))
			ctx := context.Background()
			var held []*Slab
			for i := range n {
				s, err := r.Acquire(ctx)
				if err != nil {
					t.Fatalf("Acquire %d: %v", i, err)
				}
				held = append(held, s)
			}
			if s, ok := r.TryAcquire(); ok || s != nil {
				t.Fatalf("TryAcquire on a full ring = %v, %v", s, ok)
			}
			if got := r.InUse(); got != n {
				t.Fatalf("InUse() = %d, want %d", got, n)
			}
			results := make(chan acquired, waiters)
			for range waiters {
				acquireAsync(r, ctx, results)
			}
			waitWaiting(t, r, int32(waiters))
			select {
			case res := <-results:
				t.Fatalf("a waiter got %v, %v before any Release", res.s, res.err)
			default:
			}
			// Each Release lets exactly one waiter through, with the slab released;
			// the others stay blocked.
			for i := range waiters {
				if err := r.Release(held[i]); err != nil {
					t.Fatalf("Release slab %d: %v", held[i].Index(), err)
				}
				res := receive(t, results)
				if res.err != nil || res.s != held[i] {
					t.Fatalf("after releasing slab %d a waiter got %v, %v", held[i].Index(), res.s, res.err)
				}
				select {
				case res := <-results:
					t.Fatalf("second waiter got %v, %v from one Release", res.s, res.err)
				default:
				}
				if got, want := r.waiting.Load(), int32(waiters-i-1); got != want {
					t.Fatalf("%d waiting after %d releases, want %d", got, i+1, want)
				}
				if got := r.InUse(); got != n {
					t.Fatalf("InUse() = %d, want %d", got, n)
				}
			}
			if s, ok := r.TryAcquire(); ok {
				t.Fatalf("TryAcquire got slab %d, but every slab is held", s.Index())
			}
		})
	}
}

func TestAcquireContext(t *testing.T) {
	tests := []struct {
		name    string
		full    bool // acquire every slab first
		ctx     func() (context.Context, context.CancelFunc)
		blocked bool // cancel only once Acquire waits
		want    error
	}{
		{"canceled while waiting", true, func() (context.Context, context.CancelFunc) {
			return context.WithCancel(context.Background())
		}, true, context.Canceled},
		{"canceled before, ring full", true, func() (context.Context, context.CancelFunc) {
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			return ctx, cancel
		}, false, context.Canceled},
		{"deadline passed, slab free", false, func() (context.Context, context.CancelFunc) {
			return context.WithDeadline(context.Background(), time.Unix(1, 0))
		}, false, context.DeadlineExceeded},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			const n = 2
			r := newTestRing(t, small(n, 1))
			var held []*Slab
			if tt.full {
				for range n {
					s, ok := r.TryAcquire()
					if !ok {
						t.Fatal("TryAcquire on a ring with free slabs failed")
					}
					held = append(held, s)
				}
			}
			ctx, cancel := tt.ctx()
			defer cancel()
			results := make(chan acquired, 1)
			acquireAsync(r, ctx, results)
			if tt.blocked {
				waitWaiting(t, r, 1)
				cancel()
			}
			res := receive(t, results)
			if res.s != nil || !errors.Is(res.err, tt.want) {
				t.Fatalf("Acquire = %v, %v; want %v", res.s, res.err, tt.want)
			}
			if got := r.InUse(); got != len(held) {
				t.Errorf("InUse() = %d after failed Acquire, want %d", got, len(held))
			}
			// The failed Acquire took nothing: every slab can still be had.
			for _, s := range held {
				if err := r.Release(s); err != nil {
					t.Fatal(err)
				}
			}
			for i := range n {
				if _, ok := r.TryAcquire(); !ok {
					t.Fatalf("slab %d of %d lost after a failed Acquire", i, n)
				}
			}
		})
	}
}

func TestClose(t *testing.T) {
	const n = 2
	before := fdCount(t)
	r, err := NewRing(small(n, 1))
	if err != nil {
		t.Fatal(err)
	}
	var held []*Slab
	for range n {
		s, err := r.Acquire(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, s)
	}
	results := make(chan acquired, 2)
	acquireAsync(r, context.Background(), results)
	acquireAsync(r, context.Background(), results)
	waitWaiting(t, r, 2)
	if err := r.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	for range 2 {
		if res := receive(t, results); res.s != nil || !errors.Is(res.err, ErrClosed) {
			t.Errorf("blocked Acquire after Close = %v, %v; want ErrClosed", res.s, res.err)
		}
	}
	if got := fdCount(t); got != before {
		t.Errorf("%d fds open after Close, %d before NewRing", got, before)
	}
	if s, err := r.Acquire(context.Background()); s != nil || !errors.Is(err, ErrClosed) {
		t.Errorf("Acquire after Close = %v, %v; want ErrClosed", s, err)
	}
	if s, ok := r.TryAcquire(); ok || s != nil {
		t.Errorf("TryAcquire after Close = %v, %v", s, ok)
	}
	if err := r.Release(held[0]); !errors.Is(err, ErrClosed) {
		t.Errorf("Release after Close = %v, want ErrClosed", err)
	}
	if err := r.Release(held[0]); !errors.Is(err, ErrNotAcquired) {
		t.Errorf("second Release after Close = %v, want ErrNotAcquired", err)
	}
	if got := r.InUse(); got != n-1 {
		t.Errorf("InUse() = %d, want %d", got, n-1)
	}
	if err := r.Close(); err != nil {
		t.Errorf("second Close = %v, want nil", err)
	}
	if got := fdCount(t); got != before {
		t.Errorf("%d fds open after second Close, %d before NewRing", got, before)
	}
}

func TestReleaseNotAcquired(t *testing.T) {
	tests := []struct {
		name  string
		slab  func(t *testing.T, r, other *Ring) *Slab
		other bool // the slab is acquired from other and must stay so
	}{
		{"double release", func(t *testing.T, r, _ *Ring) *Slab {
			s, _ := r.TryAcquire()
			if err := r.Release(s); err != nil {
				t.Fatal(err)
			}
			return s
		}, false},
		{"never acquired", func(_ *testing.T, r, _ *Ring) *Slab { return r.Slabs()[2] }, false},
		{"other ring", func(t *testing.T, _, other *Ring) *Slab {
			s, ok := other.TryAcquire()
			if !ok {
				t.Fatal("TryAcquire on other ring failed")
			}
			return s
		}, true},
		{"nil", func(*testing.T, *Ring, *Ring) *Slab { return nil }, false},
		{"zero Slab", func(*testing.T, *Ring, *Ring) *Slab { return &Slab{} }, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newTestRing(t, small(3, 1))
			other := newTestRing(t, small(3, 1))
			held, ok := r.TryAcquire() // one slab stays acquired throughout
			if !ok {
				t.Fatal("TryAcquire failed")
			}
			s := tt.slab(t, r, other)
			inUse, free := r.InUse(), len(r.free)
			otherInUse, otherFree := other.InUse(), len(other.free)
			if err := r.Release(s); !errors.Is(err, ErrNotAcquired) {
				t.Fatalf("Release = %v, want ErrNotAcquired", err)
			}
			if r.InUse() != inUse || len(r.free) != free {
				t.Errorf("ring changed: InUse %d -> %d, free %d -> %d", inUse, r.InUse(), free, len(r.free))
			}
			if other.InUse() != otherInUse || len(other.free) != otherFree {
				t.Errorf("other ring changed: InUse %d -> %d, free %d -> %d",
					otherInUse, other.InUse(), otherFree, len(other.free))
			}
			if tt.other {
				if err := other.Release(s); err != nil {
					t.Errorf("slab no longer acquired from its own ring: %v", err)
				}
			}
			if err := r.Release(held); err != nil {
				t.Errorf("releasing the held slab: %v", err)
			}
			for i := range 3 {
				if _, ok := r.TryAcquire(); !ok {
					t.Fatalf("only %d of 3 slabs acquirable after the bad Release", i)
				}
			}
		})
	}
}

// hooks replaces the package's seams for one test.
func hooks(t *testing.T, limit func() (uint64, error), exceed func() bool, lock func([]byte) error) {
	t.Helper()
	oldLimit, oldExceed, oldLock := memlockLimit, canExceedMemlock, mlock
	t.Cleanup(func() { memlockLimit, canExceedMemlock, mlock = oldLimit, oldExceed, oldLock })
	if limit != nil {
		memlockLimit = limit
	}
	if exceed != nil {
		canExceedMemlock = exceed
	}
	if lock != nil {
		mlock = lock
	}
}

func TestLocked(t *testing.T) {
	limit, err := softMemlockLimit()
	if err != nil {
		t.Fatal(err)
	}
	hasCap := hasCapIPCLock()
	t.Logf("RLIMIT_MEMLOCK soft limit %d bytes, CAP_IPC_LOCK %v", limit, hasCap)
	tests := []struct {
		name  string
		slabs int
	}{
		{"within limit", 1},
		{"beyond limit", int(limit/(2*mib)) + 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			total := uint64(tt.slabs) * 2 * mib
			if total > 512*mib {
				t.Skipf("RLIMIT_MEMLOCK %d is too high to exceed cheaply", limit)
			}
			want := hasCap || total <= limit
			base := vmLockedKiB(t)
			var warnings []string
			r, err := NewRing(Options{Slabs: tt.slabs, SlabBytes: 2 * mib, Warn: func(m string) { warnings = append(warnings, m) }})
			if err != nil {
				t.Fatal(err)
			}
			if r.Locked() != want {
				t.Errorf("Locked() = %v, want %v (%d bytes, limit %d, CAP_IPC_LOCK %v)", r.Locked(), want, total, limit, hasCap)
			}
			if want && len(warnings) != 0 || !want && len(warnings) != 1 {
				t.Errorf("warnings %q with Locked() %v", warnings, r.Locked())
			}
			wantKiB := base
			if want {
				wantKiB += total / 1024
			}
			if got := vmLockedKiB(t); got != wantKiB {
				t.Errorf("VmLck %d kB, want %d", got, wantKiB)
			}
			if err := r.Close(); err != nil {
				t.Fatal(err)
			}
			if got := vmLockedKiB(t); got != base {
				t.Errorf("VmLck %d kB after Close, want %d", got, base)
			}
		})
	}
}

// TestMemlockFallback drives the locking decision through the seams, so the paths a
// non-root process takes are tested even as root.
func TestMemlockFallback(t *testing.T) {
	const n, size = 2, 1 * mib
	fixed := func(v uint64) func() (uint64, error) { return func() (uint64, error) { return v, nil } }
	unreadable := func() (uint64, error) { return 0, unix.EPERM }
	common := []string{"cannot lock 2 MiB (2097152 bytes) in memory (2 slabs of 1 MiB)", "RLIMIT_MEMLOCK",
		"LimitMEMLOCK=", "--ulimit memlock=-1", "CAP_IPC_LOCK", "unpinned"}
	tests := []struct {
		name      string
		limit     func() (uint64, error)
		canExceed bool
		failAt    int // mlock call that fails, -1 for none
		failErr   error
		locked    bool
		mlocks    int      // mlock calls expected
		warn      []string // substrings of the one warning; nil for none
	}{
		{"below limit, no CAP_IPC_LOCK", fixed(1 * mib), false, -1, nil, false, 0,
			append([]string{"1 MiB (1048576 bytes)", "lacks CAP_IPC_LOCK"}, common...)},
		{"below limit, CAP_IPC_LOCK", fixed(1 * mib), true, -1, nil, true, n, nil},
		{"exactly the limit", fixed(2 * mib), false, -1, nil, true, n, nil},
		{"unlimited", fixed(unix.RLIM_INFINITY), false, -1, nil, true, n, nil},
		{"limit unreadable", unreadable, false, -1, nil, true, n, nil},
		{"second mlock EPERM", fixed(unix.RLIM_INFINITY), false, 1, unix.EPERM, false, 2,
			append([]string{"mlock: operation not permitted", "RLIMIT_MEMLOCK is unlimited"}, common...)},
		{"first mlock ENOMEM", fixed(64 * mib), false, 0, unix.ENOMEM, false, 1,
			append([]string{"mlock: cannot allocate memory", "64 MiB (67108864 bytes)"}, common...)},
		{"mlock EAGAIN, limit unreadable", unreadable, false, 1, unix.EAGAIN, false, 2,
			append([]string{"mlock: resource temporarily unavailable", "could not be read: operation not permitted"}, common...)},
		{"mlock other error", fixed(unix.RLIM_INFINITY), true, 1, unix.EIO, false, 2,
			append([]string{"mlock failed unexpectedly: input/output error"}, common...)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			calls := 0
			hooks(t, tt.limit, func() bool { return tt.canExceed }, func(b []byte) error {
				calls++
				if calls-1 == tt.failAt {
					return tt.failErr
				}
				return unix.Mlock(b)
			})
			base := vmLockedKiB(t)
			var warnings []string
			r := newTestRing(t, Options{Slabs: n, SlabBytes: size, NoHugePages: true,
				Warn: func(m string) { warnings = append(warnings, m) }})
			if r.Locked() != tt.locked {
				t.Errorf("Locked() = %v, want %v", r.Locked(), tt.locked)
			}
			if calls != tt.mlocks {
				t.Errorf("mlock called %d times, want %d", calls, tt.mlocks)
			}
			wantKiB := base
			if tt.locked {
				wantKiB += n * size / 1024
			}
			if got := vmLockedKiB(t); got != wantKiB {
				t.Errorf("VmLck %d kB, want %d (partial locks must be undone)", got, wantKiB)
			}
			switch {
			case tt.warn == nil && len(warnings) != 0:
				t.Errorf("unexpected warnings %q", warnings)
			case tt.warn != nil && len(warnings) != 1:
				t.Errorf("%d warnings %q, want exactly 1", len(warnings), warnings)
			case tt.warn != nil:
				w := warnings[0]
				// What the limit must allow: these slabs and whatever else is locked.
				need := uint64(2048)
				if tt.failAt >= 0 {
					need += base
				}
				if want := fmt.Sprintf("ulimit -l %d ", need); !strings.Contains(w, want) {
					t.Errorf("warning %q lacks %q", w, want)
				}
				if strings.Contains(w, "\n") {
					t.Errorf("warning is not one line: %q", w)
				}
				for _, sub := range tt.warn {
					if !strings.Contains(w, sub) {
						t.Errorf("warning %q lacks %q", w, sub)
					}
				}
			}
			// Locked or not, the slabs work.
			checkRing(t, r, n, size, DefaultName)
			s, err := r.Acquire(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if err := r.Release(s); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestDefaultWarn(t *testing.T) {
	hooks(t, func() (uint64, error) { return 64 << 10, nil }, func() bool { return false }, nil)
	var buf bytes.Buffer
	old := stderr
	stderr = &buf
	defer func() { stderr = old }()
	r, err := NewRing(Options{Slabs: 1, SlabBytes: 1, Warn: nil})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if r.Locked() {
		t.Errorf("Locked() = true beyond the limit without CAP_IPC_LOCK")
	}
	out := buf.String()
	if !strings.HasPrefix(out, "shardload: warning: pinned: cannot lock 2 MiB (2097152 bytes) in memory (1 slab of 2 MiB)") ||
		strings.Count(out, "\n") != 1 || !strings.HasSuffix(out, "\n") ||
		!strings.Contains(out, "RLIMIT_MEMLOCK is 64 KiB (65536 bytes)") {
		t.Errorf("default warning output %q", out)
	}
	t.Log(strings.TrimSpace(out))
}

func TestNoLock(t *testing.T) {
	hooks(t, func() (uint64, error) { return 0, nil }, func() bool { return false }, func([]byte) error {
		t.Error("mlock called with NoLock")
		return nil
	})
	base := vmLockedKiB(t)
	r := newTestRing(t, Options{Slabs: 2, SlabBytes: 4 * page, NoHugePages: true, NoLock: true})
	if r.Locked() {
		t.Error("Locked() = true with NoLock")
	}
	if got := vmLockedKiB(t); got != base {
		t.Errorf("VmLck %d kB with NoLock, want %d", got, base)
	}
	checkRing(t, r, 2, 4*page, DefaultName)
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

// TestConcurrentUse has goroutines take and give back slabs as fast as they can and
// checks that no slab is ever held twice.
func TestConcurrentUse(t *testing.T) {
	const slabs, workers, rounds = 3, 8, 400
	r := newTestRing(t, small(slabs, 1))
	holders := make([]atomic.Int32, slabs)
	var taken atomic.Int64
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			ctx := context.Background()
			for i := range rounds {
				s, ok := r.TryAcquire()
				if !ok {
					var err error
					if s, err = r.Acquire(ctx); err != nil {
						t.Errorf("worker %d: Acquire: %v", w, err)
						return
					}
				}
				taken.Add(1)
				if h := holders[s.Index()].Add(1); h != 1 {
					t.Errorf("worker %d: slab %d held by %d at once", w, s.Index(), h)
				}
				b := s.Bytes()
				mark := uint64(w)<<32 | uint64(i)
				binary.LittleEndian.PutUint64(b, mark)
				binary.LittleEndian.PutUint64(b[len(b)-8:], mark)
				runtime.Gosched()
				if a, z := binary.LittleEndian.Uint64(b), binary.LittleEndian.Uint64(b[len(b)-8:]); a != mark || z != mark {
					t.Errorf("worker %d: slab %d overwritten while held: %#x %#x, want %#x", w, s.Index(), a, z, mark)
				}
				holders[s.Index()].Add(-1)
				if err := r.Release(s); err != nil {
					t.Errorf("worker %d: Release: %v", w, err)
					return
				}
			}
		})
	}
	wg.Wait()
	if got := taken.Load(); got != workers*rounds {
		t.Errorf("%d acquisitions, want %d", got, workers*rounds)
	}
	if got := r.InUse(); got != 0 {
		t.Errorf("InUse() = %d after every worker released", got)
	}
	if got := len(r.free); got != slabs {
		t.Errorf("%d slabs free at the end, want %d", got, slabs)
	}
}

// TestConcurrentClose closes the ring while goroutines use it: every call returns
// either a slab or ErrClosed, and every blocked Acquire returns.
func TestConcurrentClose(t *testing.T) {
	r, err := NewRing(small(2, 1))
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	start := make(chan struct{})
	for w := range 6 {
		wg.Go(func() {
			<-start
			for {
				s, err := r.Acquire(context.Background())
				if errors.Is(err, ErrClosed) {
					return
				}
				if err != nil {
					t.Errorf("worker %d: Acquire: %v", w, err)
					return
				}
				// Do not touch the memory: Close may have unmapped it.
				if err := r.Release(s); err != nil && !errors.Is(err, ErrClosed) {
					t.Errorf("worker %d: Release: %v", w, err)
					return
				}
			}
		})
	}
	close(start)
	waitFor(t, "a blocked Acquire", func() bool { return r.waiting.Load() > 0 })
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
}

// childResult is what memlockChild reports on stdout.
type childResult struct {
	Err      string
	HasCap   bool
	Limit    uint64
	Base     uint64 // VmLck, kB, before any ring
	Locked   bool
	Warnings []string
	AfterKiB uint64 // VmLck after the ring beyond the limit
	// Only with the capability dropped: ring A fits the limit, ring B's second slab
	// does not once A is locked.
	LockedA, LockedB bool
	WarningsA        []string
	WarningsB        []string
	AKiB, BKiB       uint64 // VmLck after A, after B
}

// memlockChild runs in a re-executed test binary under a real RLIMIT_MEMLOCK of
// 1 MiB. With mode "drop-cap" it first drops CAP_IPC_LOCK from its thread, the one
// that makes the rings (capabilities are per thread; the goroutine is locked to it).
func memlockChild(mode string) int {
	runtime.LockOSThread()
	res := childResult{}
	out := func() int {
		json.NewEncoder(os.Stdout).Encode(res)
		return 0
	}
	var old unix.Rlimit
	if err := unix.Prlimit(0, unix.RLIMIT_MEMLOCK, nil, &old); err != nil {
		res.Err = "prlimit: " + err.Error()
		return out()
	}
	if old.Max < mib {
		res.Err = fmt.Sprintf("hard RLIMIT_MEMLOCK %d below 1 MiB", old.Max)
		return out()
	}
	if err := unix.Prlimit(0, unix.RLIMIT_MEMLOCK, &unix.Rlimit{Cur: mib, Max: old.Max}, nil); err != nil {
		res.Err = "prlimit: " + err.Error()
		return out()
	}
	if mode == "drop-cap" {
		hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
		var data [2]unix.CapUserData
		if err := unix.Capget(&hdr, &data[0]); err != nil {
			res.Err = "capget: " + err.Error()
			return out()
		}
		data[unix.CAP_IPC_LOCK/32].Effective &^= 1 << (unix.CAP_IPC_LOCK % 32)
		if err := unix.Capset(&hdr, &data[0]); err != nil {
			res.Err = "capset: " + err.Error()
			return out()
		}
	}
	res.HasCap = hasCapIPCLock()
	res.Limit, _ = softMemlockLimit()
	var err error
	if res.Base, err = lockedKiB(); err != nil {
		res.Err = err.Error()
		return out()
	}
	usable := func(r *Ring) error {
		for _, s := range r.Slabs() {
			b := s.Bytes()
			b[0], b[len(b)-1] = 0x5A, 0xA5
			got := make([]byte, 1)
			if _, err := unix.Pread(s.FD(), got, int64(len(b)-1)); err != nil || got[0] != 0xA5 {
				return fmt.Errorf("slab %d unusable: %v %#x", s.Index(), err, got)
			}
		}
		return nil
	}
	mk := func(slabs int, size int64, warnings *[]string, kib *uint64) (*Ring, bool) {
		r, err := NewRing(Options{Slabs: slabs, SlabBytes: size, NoHugePages: true,
			Warn: func(m string) { *warnings = append(*warnings, m) }})
		if err == nil {
			err = usable(r)
		}
		if err == nil {
			*kib, err = lockedKiB()
		}
		if err != nil {
			res.Err = err.Error()
			return nil, false
		}
		return r, true
	}
	r, ok := mk(2, mib, &res.Warnings, &res.AfterKiB)
	if !ok {
		return out()
	}
	res.Locked = r.Locked()
	r.Close()
	if mode == "drop-cap" {
		a, ok := mk(1, 512<<10, &res.WarningsA, &res.AKiB)
		if !ok {
			return out()
		}
		b, ok := mk(2, 384<<10, &res.WarningsB, &res.BKiB)
		if !ok {
			return out()
		}
		res.LockedA, res.LockedB = a.Locked(), b.Locked()
		a.Close()
		b.Close()
	}
	return out()
}

// TestRealMemlockLimit runs rings in a subprocess under a real RLIMIT_MEMLOCK of
// 1 MiB. Root has CAP_IPC_LOCK, which lets mlock exceed the limit, so with the
// capability kept the 2 MiB ring is locked as root (and not otherwise); with it
// dropped the kernel refuses and the fallback runs for real, including undoing a
// partial lock when memory locked by an earlier ring pushes a later one over.
func TestRealMemlockLimit(t *testing.T) {
	for _, mode := range []string{"keep-cap", "drop-cap"} {
		t.Run(mode, func(t *testing.T) {
			cmd := exec.Command(os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(), childEnv+"="+mode)
			cmd.Stderr = os.Stderr
			out, err := cmd.Output()
			if err != nil {
				t.Fatalf("child: %v\n%s", err, out)
			}
			var res childResult
			if err := json.Unmarshal(out, &res); err != nil {
				t.Fatalf("child output %q: %v", out, err)
			}
			t.Logf("child: %+v", res)
			if strings.HasPrefix(res.Err, "capset") || strings.HasPrefix(res.Err, "hard RLIMIT_MEMLOCK") {
				t.Skip(res.Err)
			}
			if res.Err != "" {
				t.Fatal(res.Err)
			}
			if res.Limit != mib {
				t.Fatalf("child limit %d, want %d", res.Limit, mib)
			}
			wantCap := mode == "keep-cap" && hasCapIPCLock()
			if res.HasCap != wantCap {
				t.Fatalf("child CAP_IPC_LOCK %v, want %v", res.HasCap, wantCap)
			}
			if res.Locked != res.HasCap {
				t.Errorf("2 MiB ring under a 1 MiB limit: Locked %v with CAP_IPC_LOCK %v", res.Locked, res.HasCap)
			}
			wantKiB := res.Base
			if res.Locked {
				wantKiB += 2048
				if len(res.Warnings) != 0 {
					t.Errorf("warnings %q though locked", res.Warnings)
				}
			} else if len(res.Warnings) != 1 || !strings.Contains(res.Warnings[0], "RLIMIT_MEMLOCK is 1 MiB (1048576 bytes)") ||
				!strings.Contains(res.Warnings[0], "2 MiB (2097152 bytes)") || !strings.Contains(res.Warnings[0], "ulimit -l 2048 ") {
				t.Errorf("warnings %q, want one naming the 1 MiB limit and 2 MiB needed", res.Warnings)
			}
			if res.AfterKiB != wantKiB {
				t.Errorf("VmLck %d kB with the ring, want %d", res.AfterKiB, wantKiB)
			}
			if mode != "drop-cap" {
				return
			}
			if !res.LockedA || len(res.WarningsA) != 0 || res.AKiB != res.Base+512 {
				t.Errorf("ring A (512 KiB, fits): Locked %v, warnings %q, VmLck %d kB, want true, none, %d",
					res.LockedA, res.WarningsA, res.AKiB, res.Base+512)
			}
			if res.LockedB || len(res.WarningsB) != 1 || !strings.Contains(res.WarningsB[0], "mlock: cannot allocate memory") ||
				!strings.Contains(res.WarningsB[0], "has 512 KiB locked already") || !strings.Contains(res.WarningsB[0], "ulimit -l 1280 ") {
				t.Errorf("ring B (768 KiB, over with A): Locked %v, warnings %q; want false and one mlock warning asking for 1280 KiB",
					res.LockedB, res.WarningsB)
			}
			if res.BKiB != res.AKiB {
				t.Errorf("VmLck %d kB after ring B, want %d: its first slab's lock must be undone", res.BKiB, res.AKiB)
			}
		})
	}
}

func acquireAsync(r *Ring, ctx context.Context, results chan<- acquired) {
	go func() {
		s, err := r.Acquire(ctx)
		results <- acquired{s, err}
	}()
}

func BenchmarkAcquireRelease(b *testing.B) {
	r := newTestRing(b, small(4, 1))
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		s, err := r.Acquire(ctx)
		if err != nil {
			b.Fatal(err)
		}
		if err := r.Release(s); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkAcquireReleaseParallel(b *testing.B) {
	r := newTestRing(b, small(4, 1))
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		ctx := context.Background()
		for pb.Next() {
			s, err := r.Acquire(ctx)
			if err != nil {
				b.Error(err)
				return
			}
			if err := r.Release(s); err != nil {
				b.Error(err)
				return
			}
		}
	})
}
