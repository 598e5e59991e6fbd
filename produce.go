package shardload

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/bits"
	"runtime/debug"
	"sync"
	"time"
	"unsafe"

	"golang.org/x/sync/semaphore"

	"github.com/shardload/shardload/decode"
	"github.com/shardload/shardload/internal/redact"
	"github.com/shardload/shardload/numa"
	"github.com/shardload/shardload/shard"
)

// item is one decoded sample owned by the loader: its values' data live in buf.
type item struct {
	key    string
	values []decode.Value
	buf    []byte
	size   int64
	refs   int // batches still to collate it (more than one when it pads an epoch)
}

func (it *item) ref() *item { it.refs++; return it }

// slot is one open span: its producer sends decoded samples on ch, at most q's
// capacity of bytes ahead of the mixer.
type slot struct {
	span shard.Span
	ch   chan slotMsg
	q    *semaphore.Weighted
	cap  int64
}

// slotMsg carries a sample, a skip notice, or a failure.
type slotMsg struct {
	it      *item
	weight  int64 // bytes held on the slot's queue semaphore
	skipped int   // samples left out (Skip policy), with cause
	shard   bool  // the rest of the shard was left out
	cause   error
	err     error // fatal
}

func newSlot(span shard.Span, queueBytes int64) *slot {
	return &slot{span: span, ch: make(chan slotMsg, slotMessages(queueBytes)), q: semaphore.NewWeighted(queueBytes), cap: queueBytes}
}

// slotMessages is the capacity of a slot's channel. The queue is bounded by its bytes;
// the channel must not bound it first when samples are small: one message per KiB of
// queue, from 256 to 16384. (At 256, 8 KB token samples filled half of a 4 MiB queue,
// and a --no-shuffle run read the shards after the current one barely ahead.)
func slotMessages(queueBytes int64) int { return int(min(max(queueBytes>>10, 256), 16384)) }

// produce reads one span: fetch, inflate, split, decode. It holds a worker token while
// it works and gives it up while it waits for room on its queue, so that a full
// queue never stops the other shards.
func (l *Loader) produce(ctx context.Context, s *slot) {
	defer close(s.ch)
	defer l.placeThread()()
	p := producer{l: l, s: s, ctx: ctx}
	if !p.acquire() {
		return
	}
	defer p.release()
	// A panic (in a source, a decoder) fails the loader, not the process.
	defer func() {
		if r := recover(); r != nil {
			p.send(slotMsg{err: panicError("reading "+s.span.URL, r)})
		}
	}()
	p.run()
}

// ErrPanic is wrapped by the error of a loader whose goroutine panicked: in a Source,
// a decoder or the loader itself. The error says where, with the stack.
var ErrPanic = errors.New("shardload: internal error (panic)")

// panicError is the error of a panic with value r, where says where.
func panicError(where string, r any) error {
	return fmt.Errorf("%w %s: %v\n%s", ErrPanic, where, r, debug.Stack())
}

type producer struct {
	l       *Loader
	s       *slot
	ctx     context.Context
	dec     decode.Decoder
	scratch []byte
	worker  bool // holds a worker token
}

// acquire takes a worker token, reporting false when the loader is stopping.
func (p *producer) acquire() bool {
	select {
	case p.l.workers <- struct{}{}:
		p.worker = true
	case <-p.ctx.Done():
	}
	return p.worker
}

// release gives the worker token back, if held.
func (p *producer) release() {
	if p.worker {
		<-p.l.workers
		p.worker = false
	}
}

func (p *producer) run() {
	l, span := p.l, p.s.span
	body, err := l.cfg.Sources.Open(p.ctx, span.URL)
	if err != nil {
		p.fail(span.Take, true, err)
		return
	}
	defer body.Close()
	r := shard.NewReader(body, shard.Options{URL: span.URL, MaxMemberSize: l.cfg.MaxMemberSize, MaxSampleSize: l.cfg.MaxSampleSize, MaxRatio: l.cfg.MaxRatio, Timing: true, Buffers: sampleBuffers{&l.pool}})
	defer func() {
		fetch, inflate := r.Times()
		l.st.add(&l.st.fetch, fetch)
		l.st.add(&l.st.inflate, inflate)
		l.st.bytesIn.Add(r.StoredBytes())
		l.st.bytesInflated.Add(r.Offset())
		r.Close()
	}()
	var nextTime, decodeTime time.Duration
	defer func() {
		fetch, inflate := r.Times()
		l.st.add(&l.st.split, nextTime-fetch-inflate)
		l.st.add(&l.st.decode, decodeTime)
	}()
	for idx, taken := 0, 0; taken < span.Take; idx++ {
		t0 := mono()
		smp, err := r.Next()
		t1 := mono()
		nextTime += t1 - t0
		if err == io.EOF {
			err = fmt.Errorf("%w: %s has %d samples, but its count says at least %d (a stale index, or the shard changed since it was counted)", ErrCountMismatch, span.URL, idx, span.Skip+span.Take)
		}
		var se *shard.Error
		sampleOnly := errors.As(err, &se) && se.Skippable()
		if idx < span.Skip {
			if err != nil && !sampleOnly {
				p.fail(span.Take, true, err)
				return
			}
			if smp != nil {
				l.pool.putBuf(smp.Buf)
			}
			continue // the previous rank's samples
		}
		taken++
		if err != nil {
			if !sampleOnly {
				p.fail(span.Take-taken+1, true, err)
				return
			}
			if !p.fail(1, false, err) {
				return
			}
			continue
		}
		it, err := p.decode(smp)
		decodeTime += mono() - t1
		if err != nil {
			if !p.fail(1, false, err) {
				return
			}
			continue
		}
		if delivered, goOn := p.send(slotMsg{it: it}); !goOn {
			if !delivered {
				l.pool.put(it)
			}
			return
		}
	}
	if end := span.Skip + span.Take; end == l.counts[span.Shard] {
		p.checkEnd(r, end)
	}
}

// checkEnd reads on after the last sample a shard's count says it has: the shard
// must end there, and what lies after its samples (the end-of-archive blocks, a
// compressed stream's trailer and checksum) must be sound. A shard with more samples
// than counted fails the loader under either policy: the counts came from an index
// or a counting pass that every rank planned from, so every rank's part is wrong.
func (p *producer) checkEnd(r *shard.Reader, count int) {
	smp, err := r.Next()
	if err == io.EOF {
		return
	}
	var se *shard.Error
	if err == nil || (errors.As(err, &se) && se.Skippable()) {
		if smp != nil {
			p.l.pool.putBuf(smp.Buf)
		}
		p.send(slotMsg{err: fmt.Errorf("%w: %s has more samples than the %d its count says (a stale index, or the shard changed since it was counted): every rank's plan is wrong; rebuild the index", ErrCountMismatch, p.s.span.URL, count)})
		return
	}
	// The samples are out; the shard's end is bad (cut short, a bad checksum).
	p.fail(0, true, err)
}

// decode decodes the configured fields of smp into an item that owns its bytes: the
// sample's buffer, which the reader filled from the pool, holds the fields that
// decode in place (raw bytes, .npy data), and the others are appended to it.
func (p *producer) decode(smp *shard.Sample) (*item, error) {
	l := p.l
	it := l.pool.item(len(l.fields))
	it.key = smp.Key
	it.buf, smp.Buf = smp.Buf, nil
	type span struct{ off, n int }
	var spans [16]span
	offs := spans[:0]
	var olds [4][]byte
	retired := olds[:0]
	defer func() {
		for _, b := range retired {
			l.pool.putBuf(b)
		}
	}()
	for i := range l.fields {
		f := &l.fields[i]
		data, ok := smp.Get(f.Ext)
		if !ok {
			l.pool.put(it)
			return nil, &SampleError{URL: smp.URL, Key: smp.Key, Err: fmt.Errorf("%w %q (the sample has %s)", ErrMissingField, f.Ext, extList(smp))}
		}
		v, scratch, err := p.dec.Decode(f, data, p.scratch)
		p.scratch = scratch
		if err != nil {
			l.pool.put(it)
			return nil, &SampleError{URL: smp.URL, Key: smp.Key, Err: err}
		}
		if off, ok := within(v.Data, it.buf); ok {
			// A view of the sample's own bytes: kept where it is.
			offs = append(offs, span{off, len(v.Data)})
		} else {
			// Decoded into scratch memory, reused for the next field and sample.
			offs = append(offs, span{len(it.buf), len(v.Data)})
			if cap(it.buf)-len(it.buf) < len(v.Data) {
				// Outgrown: the old buffer stays valid until the end, for the
				// fields still to decode from it.
				nb := append(l.pool.get(len(it.buf)+len(v.Data)), it.buf...)
				retired = append(retired, it.buf)
				it.buf = nb
			}
			it.buf = append(it.buf, v.Data...)
		}
		it.values[i] = v
	}
	for i, o := range offs {
		if o.n > 0 {
			it.values[i].Data = it.buf[o.off : o.off+o.n : o.off+o.n]
		}
	}
	it.size = int64(len(it.buf)) + int64(len(it.key))
	return it, nil
}

// within reports whether b lies inside buf's first len(buf) bytes, and where.
func within(b, buf []byte) (int, bool) {
	if len(b) == 0 || len(buf) == 0 {
		return 0, false
	}
	off := uintptr(unsafe.Pointer(unsafe.SliceData(b))) - uintptr(unsafe.Pointer(unsafe.SliceData(buf)))
	if off > uintptr(len(buf)) || uintptr(len(b)) > uintptr(len(buf))-off {
		return 0, false
	}
	return int(off), true
}

// placeThread wires the calling goroutine to a thread on Config.CPUs, when set, and
// returns what undoes it.
func (l *Loader) placeThread() func() {
	if len(l.cfg.CPUs) == 0 {
		return func() {}
	}
	unlock, err := numa.LockThread(l.cfg.CPUs)
	if err != nil {
		placeWarning.Do(func() {
			l.cfg.Logf("shardload: warning: loader threads not placed on CPUs %s: %v", numa.FormatCPUList(l.cfg.CPUs), err)
		})
		return func() {}
	}
	return unlock
}

// placeWarning says once per process that threads cannot be placed.
var placeWarning sync.Once

// sampleBuffers lets a shard reader read samples straight into the pool's buffers.
type sampleBuffers struct{ p *bufPool }

func (s sampleBuffers) Get(n int) []byte { return s.p.get(n) }
func (s sampleBuffers) Put(b []byte)     { s.p.putBuf(b) }

func extList(s *shard.Sample) string {
	var b []byte
	for i, f := range s.Fields {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, f.Ext...)
	}
	if len(b) == 0 {
		return "no fields"
	}
	return string(b)
}

// fail reports n samples that could not be read. Under the Fail policy, or when the
// shard's failure cannot be skipped, it sends the error and reports false.
func (p *producer) fail(n int, wholeShard bool, err error) bool {
	if p.l.cfg.OnError == Fail || p.ctx.Err() != nil {
		p.send(slotMsg{err: err})
		return false
	}
	_, goOn := p.send(slotMsg{skipped: n, shard: wholeShard, cause: err})
	return goOn && !wholeShard
}

// send queues m for the mixer; it waits, without its worker token, while the queue
// is full. It reports whether m was delivered (the mixer then owns its sample) and
// whether the producer may go on (false when the loader is stopping). A sample that
// was not delivered is still the caller's to recycle; one that was is not, even when
// the producer must stop.
func (p *producer) send(m slotMsg) (delivered, goOn bool) {
	s := p.s
	if m.it != nil {
		m.weight = min(m.it.size, s.cap)
		if !s.q.TryAcquire(m.weight) {
			p.release()
			if s.q.Acquire(p.ctx, m.weight) != nil {
				return false, false
			}
			if !p.acquire() {
				s.q.Release(m.weight)
				return false, false
			}
		}
	}
	select {
	case s.ch <- m:
		return true, true
	default:
	}
	p.release()
	select {
	case s.ch <- m:
	case <-p.ctx.Done():
		s.q.Release(m.weight)
		return false, false
	}
	return true, p.acquire()
}

// SampleError is a sample that could not be decoded: a missing field, a wrong shape, a
// label that is not a number.
type SampleError struct {
	URL, Key string
	Err      error
}

func (e *SampleError) Error() string {
	return fmt.Sprintf("%s: sample %q: %v", redact.URL(e.URL), e.Key, e.Err)
}

// Unwrap returns the cause.
func (e *SampleError) Unwrap() error { return e.Err }

// ErrMissingField means a sample lacks a configured field.
var ErrMissingField = errors.New("shardload: missing field")

// ErrCountMismatch means a shard holds another number of samples than the counts
// the epoch was planned from (Config.Shards, Config.Index or the counting pass).
var ErrCountMismatch = errors.New("shardload: shard and sample count disagree")

// ErrErrorBudget means the Skip policy left out more than Config.ErrorBudget.
var ErrErrorBudget = errors.New("shardload: too many samples skipped")

// bufPool recycles items and their byte buffers, in size classes eight to a doubling
// (see classSize), so that the steady state allocates nothing per sample. Unlike a
// sync.Pool it keeps its buffers across garbage collections (fresh buffers cost page
// faults), up to maxFree bytes.
//
// New buffers of up to maxArenaClass are carved from chunks of memory mapped with huge
// pages advised and faulted in at once (see mapChunk), up to maxArena bytes of chunks;
// beyond that, and for larger buffers, they come from the Go heap. release unmaps the
// chunks; the loader calls it once nothing can use a buffer any more.
type bufPool struct {
	items   sync.Pool
	mu      sync.Mutex
	free    [numClasses][][]byte
	held    int64 // bytes in free
	maxFree int64

	maxArena int64    // bytes of chunks the arena may map; 0: no arena
	chunks   [][]byte // mapped chunks, for free
	mapped   int64    // bytes in chunks
	rest     []byte   // the unused end of the newest chunk
}

const (
	// Bytes per mapped chunk: a few huge pages, so that the arena grows close to
	// what the queues and the shuffle buffer hold (fresh memory is dear to fault in).
	arenaChunk = 8 << 20
	// Size classes: 4 KiB, then eight steps to each doubling (4.5, 5, ... 7.5, 8, 9,
	// 10 KiB...) up to 1 GiB. A buffer is at most an eighth larger than asked,
	// where powers of two waste up to half: 8.3 KB token samples took 16 KiB
	// buffers, 110-120 KB images 128 or 256 KiB.
	classSteps    = 8
	minClassShift = 12
	numClasses    = classSteps*(30-minClassShift) + 1
	maxArenaClass = classSteps * (22 - minClassShift) // 4 MiB: larger buffers come from the heap
)

func (p *bufPool) item(fields int) *item {
	it, _ := p.items.Get().(*item)
	if it == nil {
		it = &item{}
	}
	if cap(it.values) < fields {
		it.values = make([]decode.Value, fields)
	}
	it.values = it.values[:fields]
	it.refs = 1
	return it
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

func (p *bufPool) get(n int) []byte {
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
func (p *bufPool) carve(c int) []byte {
	n := classSize(c)
	if c > maxArenaClass {
		return nil
	}
	if len(p.rest) < n {
		if p.mapped+arenaChunk > p.maxArena {
			return nil
		}
		chunk := mapChunk(arenaChunk)
		if chunk == nil {
			p.maxArena = 0 // no arena here: stop trying
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

// release unmaps the arena. No buffer from it may be used afterwards.
func (p *bufPool) release() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.chunks {
		unmapChunk(c)
	}
	p.chunks, p.rest, p.mapped = nil, nil, 0
	p.free = [numClasses][][]byte{}
	p.held = 0
}

func (p *bufPool) putBuf(b []byte) {
	c := sizeClass(cap(b))
	if cap(b) == 0 || c >= len(p.free) || classSize(c) != cap(b) {
		return // not one of ours
	}
	p.mu.Lock()
	if p.held+int64(cap(b)) <= p.maxFree {
		p.free[c] = append(p.free[c], b)
		p.held += int64(cap(b))
	}
	p.mu.Unlock()
}

// put drops one reference to it and recycles it when none is left.
func (p *bufPool) put(it *item) {
	if it.refs--; it.refs > 0 {
		return
	}
	p.putBuf(it.buf)
	clear(it.values)
	*it = item{values: it.values[:0]}
	p.items.Put(it)
}
