package pinned

import (
	"context"
	"errors"
	"fmt"
	"github.com/shardload/shardload/mem"
	"io"
	"math"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
)

// Defaults for the zero Options.
const (
	// DefaultSlabs is the number of slabs when Options.Slabs is 0.
	DefaultSlabs = 4
	// DefaultSlabBytes is the slab size when Options.SlabBytes is 0.
	DefaultSlabBytes = 16 << 20
	// DefaultName is the memfd name prefix when Options.Name is empty.
	DefaultName = "shardload-slab"
)

// hugePageSize is the size slabs are rounded to when huge pages are advised: the PMD
// size of x86-64 and of arm64 with 4 KiB pages.
const hugePageSize = mem.HugePage

// Errors returned by Ring methods.
var (
	// ErrClosed is returned by Acquire, and by Release, once the ring is closed.
	ErrClosed = errors.New("pinned: ring closed")
	// ErrNotAcquired is returned by Release for a slab that is not acquired from
	// that ring: released already, never acquired, or from another ring.
	ErrNotAcquired = errors.New("pinned: slab not acquired from this ring")
	// ErrInvalidOptions is wrapped by the error NewRing returns for Options it cannot
	// use (negative counts, sizes that overflow).
	ErrInvalidOptions = errors.New("pinned: invalid options")
)

// stderr is where the default Warn writes; tests replace it.
var stderr io.Writer = os.Stderr

// Options configure NewRing. The zero value works: 4 slabs of 16 MiB, locked when the
// limit allows, huge pages advised.
type Options struct {
	// Slabs is the number of slabs in the ring, which is also how many batches can be
	// in flight at once. 0 means DefaultSlabs (4); negative is an error.
	Slabs int

	// SlabBytes is the size of each slab in bytes. 0 means DefaultSlabBytes (16 MiB);
	// negative is an error. It is rounded up to a multiple of the page size: 2 MiB
	// (the huge page size) unless NoHugePages is set, else os.Getpagesize().
	SlabBytes int64

	// Name is the prefix of the memfd names: slab i is named Name-i (shown as
	// /memfd:Name-i in /proc/PID/fd of every process holding it). Empty means
	// DefaultName ("shardload-slab").
	Name string

	// NoLock, if set, skips mlock: the slabs are not page-locked and no warning is
	// given. The default (false) locks them when RLIMIT_MEMLOCK or CAP_IPC_LOCK allow.
	NoLock bool

	// NoHugePages, if set, does not advise MADV_HUGEPAGE and rounds SlabBytes to the
	// base page size only. The default (false) advises huge pages.
	NoHugePages bool

	// Bind, if set, is called with each slab's memory right after it is mapped,
	// before its pages are faulted in: the place to bind it to a NUMA node (for
	// example func(m []byte) error { return numa.Bind(m, node) }), so that the pages
	// are allocated there. An error is not fatal: it is reported once through Warn,
	// Bind is not called for the remaining slabs, and Ring.Bound says false. nil (the
	// default) leaves placement to the kernel.
	Bind func(mem []byte) error

	// Warn receives the one-line warnings given, at most one per cause and ring, when
	// the slabs cannot be locked or bound. nil means writing "shardload: warning: " +
	// msg and a newline to os.Stderr. It is called from NewRing, before NewRing returns.
	Warn func(msg string)
}

// config is Options with the defaults applied and the sizes validated.
type config struct {
	slabs     int
	slabBytes int64
	name      string
	noLock    bool
	noHuge    bool
	bind      func([]byte) error
	warn      func(string)
}

func (o Options) config() (config, error) {
	c := config{
		slabs:     o.Slabs,
		slabBytes: o.SlabBytes,
		name:      o.Name,
		noLock:    o.NoLock,
		noHuge:    o.NoHugePages,
		bind:      o.Bind,
		warn:      o.Warn,
	}
	if c.slabs < 0 {
		return c, fmt.Errorf("%w: Slabs is %d, want >= 0", ErrInvalidOptions, c.slabs)
	}
	if c.slabs == 0 {
		c.slabs = DefaultSlabs
	}
	if c.slabBytes < 0 {
		return c, fmt.Errorf("%w: SlabBytes is %d, want >= 0", ErrInvalidOptions, c.slabBytes)
	}
	if c.slabBytes == 0 {
		c.slabBytes = DefaultSlabBytes
	}
	align := int64(os.Getpagesize())
	if !c.noHuge {
		align = hugePageSize
	}
	if c.slabBytes > math.MaxInt64-(align-1) {
		return c, fmt.Errorf("%w: SlabBytes %d overflows when rounded to %d", ErrInvalidOptions, c.slabBytes, align)
	}
	c.slabBytes = (c.slabBytes + align - 1) / align * align
	if c.slabBytes > math.MaxInt || c.slabBytes > math.MaxInt64/int64(c.slabs) {
		return c, fmt.Errorf("%w: %d slabs of %d bytes overflow", ErrInvalidOptions, c.slabs, c.slabBytes)
	}
	if c.name == "" {
		c.name = DefaultName
	}
	if c.warn == nil {
		c.warn = func(msg string) { fmt.Fprintf(stderr, "shardload: warning: %s\n", msg) }
	}
	return c, nil
}

// Slab is one mapped memfd of a Ring. Its index, memory and descriptor never change;
// whether it is acquired is the Ring's business.
type Slab struct {
	ring  *Ring
	index int
	fd    int
	data  []byte

	locked   bool         // mlocked; set while the ring is built, and when it grows
	acquired bool         // guarded by ring.mu
	size     atomic.Int64 // len(data), for readers other than the slab's holder
}

// Index returns the slab's position in its ring, 0 to len(Ring.Slabs())-1. It is what
// a loader tells a trainer to say which of the shared slabs holds a batch.
func (s *Slab) Index() int { return s.index }

// Bytes returns the slab's memory: Ring.SlabBytes() long, or Size() once grown
// (Ring.Grow). It is valid until the ring is closed or the slab grows; touching it
// after Close faults.
func (s *Slab) Bytes() []byte { return s.data }

// Size returns the slab's size in bytes: Ring.SlabBytes() unless it grew.
func (s *Slab) Size() int64 { return s.size.Load() }

// FD returns the slab's memfd, valid until the ring is closed. Another process that
// receives it (over a unix socket with SCM_RIGHTS) and mmaps it MAP_SHARED sees the
// same memory. The descriptor is close-on-exec; it may grow (Ring.Grow) but is sealed
// against shrinking, so that a process it is shared with cannot make the mapping of
// another fault.
func (s *Slab) FD() int { return s.fd }

// Ring is a fixed set of slabs handed out one at a time. Its methods are safe for
// concurrent use.
type Ring struct {
	c         config
	slabs     []*Slab
	slabBytes int64
	locked    bool
	huge      bool
	bound     bool

	free chan *Slab    // slabs not acquired; capacity len(slabs), so sends never block
	done chan struct{} // closed by Close

	waiting atomic.Int32 // Acquire calls blocked right now; read by tests

	mu     sync.Mutex
	closed bool
	inUse  int

	closeOnce sync.Once
	closeErr  error
}

// NewRing creates the slabs, maps them, advises huge pages and locks them as opts
// say, and returns the ring with every slab free. Failing to lock is not an error (see
// the package documentation); failing to create or map memory is, and then nothing is
// left behind.
func NewRing(opts Options) (*Ring, error) {
	c, err := opts.config()
	if err != nil {
		return nil, err
	}
	r, err := newRing(c)
	if err != nil {
		return nil, err
	}
	r.free = make(chan *Slab, len(r.slabs))
	r.done = make(chan struct{})
	for _, s := range r.slabs {
		r.free <- s
	}
	return r, nil
}

// Acquire returns a free slab, waiting while all are in use: that wait is the ring's
// back-pressure. It returns ErrClosed once the ring is closed (also to calls waiting
// when Close is called), and ctx.Err() if ctx is done, even when a slab is free.
func (r *Ring) Acquire(ctx context.Context) (*Slab, error) {
	select {
	case <-r.done:
		return nil, ErrClosed
	default:
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	select {
	case s := <-r.free:
		return r.take(s)
	default:
	}
	r.waiting.Add(1)
	defer r.waiting.Add(-1)
	select {
	case s := <-r.free:
		return r.take(s)
	case <-r.done:
		return nil, ErrClosed
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// TryAcquire returns a free slab and true, or nil and false at once if none is free
// or the ring is closed.
func (r *Ring) TryAcquire() (*Slab, bool) {
	select {
	case s := <-r.free:
		s, err := r.take(s)
		return s, err == nil
	default:
		return nil, false
	}
}

// take marks s, just received from r.free, as acquired.
func (r *Ring) take(s *Slab) (*Slab, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil, ErrClosed
	}
	s.acquired = true
	r.inUse++
	return s, nil
}

// Release hands s back to the ring, waking one Acquire waiting for it. Releasing a
// slab that is not acquired from r (a second Release, a nil slab, one from another
// ring) returns ErrNotAcquired and changes nothing. After Close, releasing an
// acquired slab counts it released and returns ErrClosed.
func (r *Ring) Release(s *Slab) error {
	if s == nil || s.ring != r {
		return ErrNotAcquired
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if !s.acquired {
		return ErrNotAcquired
	}
	s.acquired = false
	r.inUse--
	if r.closed {
		return ErrClosed
	}
	r.free <- s // never blocks: s was not in free, which has room for every slab
	return nil
}

// Grow makes s, which the caller acquired and does not use, at least size bytes:
// its memfd grows to size rounded up to the ring's page size, and it is mapped
// afresh (at another address: Bytes changes; the old contents are not kept), bound,
// faulted in and locked as the ring's slabs are. unmapping, when set, is called with
// the old mapping before it goes (to unregister it from a device). A process the
// memfd was passed to sees the new size once it maps it again; its old mapping stays
// valid. A slab already as large is left as it is.
func (r *Ring) Grow(s *Slab, size int64, unmapping func(old []byte)) error {
	if s == nil || s.ring != r {
		return ErrNotAcquired
	}
	r.mu.Lock()
	acquired, closed := s.acquired, r.closed
	r.mu.Unlock()
	switch {
	case closed:
		return ErrClosed
	case !acquired:
		return ErrNotAcquired
	case size <= s.Size():
		return nil
	}
	align := int64(os.Getpagesize())
	if !r.c.noHuge {
		align = hugePageSize
	}
	if size > math.MaxInt-(align-1) {
		return fmt.Errorf("%w: slab of %d bytes", ErrInvalidOptions, size)
	}
	size = (size + align - 1) / align * align
	if unmapping != nil {
		unmapping(s.data)
	}
	return r.grow(s, size)
}

// Bytes returns the memory of all the ring's slabs together, grown ones at their
// size.
func (r *Ring) Bytes() int64 {
	var n int64
	for _, s := range r.slabs {
		n += s.Size()
	}
	return n
}

// Slabs returns all slabs of the ring, indexed by Slab.Index, acquired or not: what a
// loader passes to a trainer when it connects.
func (r *Ring) Slabs() []*Slab {
	return append([]*Slab(nil), r.slabs...)
}

// SlabBytes returns the size of every slab as the ring made it, after rounding (see
// Slab.Size for one that grew).
func (r *Ring) SlabBytes() int64 { return r.slabBytes }

// MaxSlabBytes returns the size of the ring's largest slab, grown ones included.
func (r *Ring) MaxSlabBytes() int64 {
	n := r.slabBytes
	for _, s := range r.Slabs() {
		n = max(n, s.Size())
	}
	return n
}

// Locked reports whether every slab is mlocked. It is false with Options.NoLock and
// when locking was not permitted (a warning was given then).
func (r *Ring) Locked() bool { return r.locked }

// HugePages reports whether the kernel accepted MADV_HUGEPAGE for every slab. That
// is advice accepted, not huge pages granted: shared memory gets them only if
// /sys/kernel/mm/transparent_hugepage/shmem_enabled allows. False with
// Options.NoHugePages.
func (r *Ring) HugePages() bool { return r.huge }

// Bound reports whether Options.Bind was set and succeeded for every slab.
func (r *Ring) Bound() bool { return r.bound }

// InUse returns how many slabs are acquired and not yet released.
func (r *Ring) InUse() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.inUse
}

// Close wakes every waiting Acquire (they return ErrClosed), then unlocks and unmaps
// the slabs and closes their memfds. It may be called while slabs are acquired, but
// their memory is gone afterwards: callers must stop using every slab before Close
// (touching Bytes after it faults). A process the memfds were passed to keeps its own
// mapping. Close is idempotent: later calls return nil.
func (r *Ring) Close() error {
	first := false
	r.closeOnce.Do(func() {
		first = true
		r.mu.Lock()
		r.closed = true
		close(r.done)
		r.mu.Unlock()
		r.closeErr = unmapSlabs(r.slabs)
	})
	if first {
		return r.closeErr
	}
	return nil
}

// formatBytes writes n in the largest binary unit that divides it: "8 MiB".
func formatBytes(n uint64) string {
	for _, u := range []struct {
		name  string
		shift uint
	}{{"GiB", 30}, {"MiB", 20}, {"KiB", 10}} {
		if n >= 1<<u.shift && n%(1<<u.shift) == 0 {
			return strconv.FormatUint(n>>u.shift, 10) + " " + u.name
		}
	}
	return strconv.FormatUint(n, 10) + " bytes"
}

// formatBytesExact is formatBytes with the byte count beside it when the unit is
// not bytes: "8 MiB (8388608 bytes)".
func formatBytesExact(n uint64) string {
	s := formatBytes(n)
	if strings.HasSuffix(s, " bytes") {
		return s
	}
	return s + " (" + strconv.FormatUint(n, 10) + " bytes)"
}
