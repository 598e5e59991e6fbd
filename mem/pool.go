package mem

import (
	"math/bits"
	"sync"
	"sync/atomic"
	"time"
)

// Pool recycles byte buffers in size classes, eight to a doubling (see classSize), so
// that a steady state allocates nothing per sample. Unlike a sync.Pool it keeps its
// buffers across garbage collections (fresh buffers cost page faults), up to MaxFree
// bytes.
//
// New buffers of up to 4 MiB are carved from chunks mapped with huge pages and
// faulted in at once (MapHuge), up to MaxArena bytes of chunks; beyond that, and for
// larger buffers, they come from the Go heap. Huge pages spare the copies through
// the buffers TLB misses; where they are dear to fault in (a virtual machine whose
// host takes free memory back: 0.2-0.5 GB/s, against 2 GB/s for base pages), the
// chunks mapped after one that faulted in slower than MinHugeRate use base pages
// (MapSmall), for the rest of the process (see HugeDear). Release
// gives the chunks back, once nothing uses a buffer any more: up to MaxIdleBytes of
// them are kept for the next Pool of the process (the next epoch's loader), which
// would otherwise fault in as much fresh memory again; the rest are unmapped.
//
// Set MaxFree and MaxArena before the first Get; the methods are safe for concurrent
// use.
type Pool struct {
	MaxFree  int64 // bytes of free buffers kept for reuse
	MaxArena int64 // bytes of chunks the arena may map; 0: no arena

	mu     sync.Mutex
	free   [numClasses][][]byte
	held   int64    // bytes in free
	chunks [][]byte // mapped chunks, for Release
	mapped int64    // bytes in chunks
	rest   []byte   // the unused end of the newest chunk
}

const (
	// Bytes per mapped chunk: a few huge pages, so that the arena grows close to
	// what its users hold (fresh memory is dear to fault in).
	arenaChunk = 4 * HugePage
	// Size classes: 4 KiB, then eight steps to each doubling (4.5, 5, ... 7.5, 8, 9,
	// 10 KiB...) up to 1 GiB. A buffer is at most an eighth larger than asked,
	// where powers of two waste up to half: 8.3 KB token samples took 16 KiB
	// buffers, 110-120 KB images 128 or 256 KiB.
	classSteps    = 8
	minClassShift = 12
	numClasses    = classSteps*(30-minClassShift) + 1
	maxArenaClass = classSteps * (22 - minClassShift) // 4 MiB: larger buffers come from the heap
)

// MaxIdleBytes bounds the arena chunks that released Pools leave mapped for later
// Pools of the process. Faulting a chunk in again took an eighth of the CPU of a
// three-epoch run reading images from an object store.
const MaxIdleBytes = 128 << 20

// idle holds the chunks released Pools left for later ones.
var idle struct {
	sync.Mutex
	chunks [][]byte
}

// newChunk returns an arena chunk: one a released Pool left, else a fresh one.
func newChunk() []byte {
	idle.Lock()
	if n := len(idle.chunks); n > 0 {
		c := idle.chunks[n-1]
		idle.chunks = idle.chunks[:n-1]
		idle.Unlock()
		return c
	}
	idle.Unlock()
	huge := !hugeDear.Load()
	t := time.Now()
	var c []byte
	if huge {
		c = MapHuge(arenaChunk)
	} else {
		c = MapSmall(arenaChunk)
	}
	d := time.Since(t)
	if c != nil {
		fresh.bytes.Add(int64(len(c)))
		fresh.nanos.Add(int64(d))
		if huge && slowFaults(len(c), d) {
			hugeDear.Store(true)
		}
	}
	return c
}

// MinHugeRate is the rate, in bytes a second, below which a chunk's huge pages
// faulted in count as dear (HugeDear). Huge pages fault in at 7-11 GB/s where the
// memory is the machine's own, 0.2-0.5 GB/s on a virtual machine whose host takes
// freed memory back; base pages at about 2 GB/s on both.
const MinHugeRate = 1 << 30

// slowFaults reports whether n bytes faulted in in d is slower than MinHugeRate.
func slowFaults(n int, d time.Duration) bool { return float64(n) < MinHugeRate*d.Seconds() }

var (
	// hugeDear is set once a chunk's huge pages faulted in slower than MinHugeRate.
	hugeDear atomic.Bool
	// fresh counts the arena chunks this process mapped and faulted in new.
	fresh struct{ bytes, nanos atomic.Int64 }
)

// HugeDear reports whether an arena chunk's huge pages faulted in slower than
// MinHugeRate in this process: the arena's later chunks then use base pages. On the
// virtual machine measured, that made the first epoch of image shards a seventh
// faster and left the later epochs as they were (BENCHMARKS.md, "The first epoch's
// sample memory").
func HugeDear() bool { return hugeDear.Load() }

// Fresh returns the bytes of arena chunks the process has mapped new (not taken
// from an earlier Pool), and the time mapping and faulting them in took. That time
// is the first epoch's price for its sample memory: on a virtual machine whose host
// takes free memory back, it can be a large share of the first epoch
// (BENCHMARKS.md, "The first epoch's sample memory").
func Fresh() (bytes int64, d time.Duration) {
	return fresh.bytes.Load(), time.Duration(fresh.nanos.Load())
}

// sizeClass returns the smallest class whose size is at least n.
func sizeClass(n int) int {
	if n <= 1<<minClassShift {
		return 0
	}
	e := bits.Len(uint(n-1)) - 1 - minClassShift // 4 KiB << e < n <= 4 KiB << (e+1)
	step := (1 << minClassShift << e) / classSteps
	return classSteps*e + (n-(1<<minClassShift<<e)+step-1)/step
}

// classSize returns the size of the buffers of class c.
func classSize(c int) int {
	e, s := c/classSteps, c%classSteps
	return (1 << minClassShift << e) / classSteps * (classSteps + s)
}

// Get returns an empty buffer of capacity at least n.
func (p *Pool) Get(n int) []byte {
	c := sizeClass(n)
	if c >= len(p.free) {
		return make([]byte, 0, n)
	}
	p.mu.Lock()
	// A free buffer of the class, or of one of the next two (at most a quarter
	// larger), before new memory: sizes that vary across classes then share
	// buffers.
	for k := c; k < min(c+3, len(p.free)); k++ {
		if m := len(p.free[k]); m > 0 {
			b := p.free[k][m-1]
			p.free[k] = p.free[k][:m-1]
			p.held -= int64(cap(b))
			p.mu.Unlock()
			return b[:0]
		}
	}
	if b := p.carve(c); b != nil {
		p.mu.Unlock()
		return b
	}
	p.mu.Unlock()
	return make([]byte, 0, classSize(c))
}

// carve returns a new buffer of size class c from the arena, or nil. Called with p.mu
// held.
func (p *Pool) carve(c int) []byte {
	n := classSize(c)
	if c > maxArenaClass {
		return nil
	}
	if len(p.rest) < n {
		if p.mapped+arenaChunk > p.MaxArena {
			return nil
		}
		chunk := newChunk()
		if chunk == nil {
			p.MaxArena = 0 // no arena here: stop trying
			return nil
		}
		p.chunks = append(p.chunks, chunk)
		p.mapped += arenaChunk
		p.rest = chunk
	}
	b := p.rest[:0:n]
	p.rest = p.rest[n:]
	return b
}

// Put recycles b, a buffer from Get; any other buffer is dropped.
func (p *Pool) Put(b []byte) {
	c := sizeClass(cap(b))
	if cap(b) == 0 || c >= len(p.free) || classSize(c) != cap(b) {
		return // not one of ours
	}
	p.mu.Lock()
	if p.held+int64(cap(b)) <= p.MaxFree {
		p.free[c] = append(p.free[c], b)
		p.held += int64(cap(b))
	}
	p.mu.Unlock()
}

// Release gives the arena's chunks back (kept for later Pools up to MaxIdleBytes,
// unmapped beyond) and forgets the free buffers. No buffer from the arena may be
// used afterwards.
func (p *Pool) Release() {
	p.mu.Lock()
	defer p.mu.Unlock()
	idle.Lock()
	for _, c := range p.chunks {
		if int64(len(idle.chunks)+1)*arenaChunk <= MaxIdleBytes {
			idle.chunks = append(idle.chunks, c)
		} else {
			Unmap(c)
		}
	}
	idle.Unlock()
	p.chunks, p.rest, p.mapped = nil, nil, 0
	p.free = [numClasses][][]byte{}
	p.held = 0
}
