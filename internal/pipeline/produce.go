package pipeline

import (
	"context"
	"errors"
	"fmt"
	"io"
	"runtime/debug"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sync/semaphore"

	"github.com/shardload/shardload/decode"
	"github.com/shardload/shardload/index"
	"github.com/shardload/shardload/mem"
	"github.com/shardload/shardload/plan"
	"github.com/shardload/shardload/redact"
	"github.com/shardload/shardload/shard"
	"github.com/shardload/shardload/source"
)

// item is one decoded sample owned by the loader: its values' data live in buf.
type item struct {
	key    string
	values []decode.Value
	buf    []byte
	size   int64
	refs   int      // batches still to collate it (more than one when it pads an epoch)
	skip   *slotMsg // a skip notice standing at the first position it left out (see missing)
	stream int32    // its stream, in a mix of streams
	placed uint64   // the fields whose values were read straight into their slab rows, a bit each
}

func (it *item) ref() *item { it.refs++; return it }

// slot is one open span: its producer queues decoded samples on msgs, at most q's
// capacity of bytes ahead of the mixer.
type slot struct {
	span   plan.Span
	msgs   slotQueue
	q      *semaphore.Weighted
	cap    int64
	queued atomic.Int64 // bytes held on q: what the worker gate orders waiters by
	index  int          // the span's index in the plan
}

// slotMsg carries a sample, a skip notice, or a failure.
type slotMsg struct {
	it      *item
	weight  int64 // bytes held on the slot's queue semaphore
	skipped int   // samples left out (Skip policy), with cause
	shard   bool  // the rest of the shard was left out
	stream  int32 // the span's stream, in a mix of streams (set by the mixer)
	cause   error
	err     error // fatal
}

// newSlot returns the slot of span, whose queue holds up to queueBytes and signals
// ready (its own channel when nil). What it allocates does not depend on queueBytes:
// the queue grows with what it holds.
func newSlot(span plan.Span, queueBytes int64, ready chan struct{}) *slot {
	s := &slot{span: span, q: semaphore.NewWeighted(queueBytes), cap: queueBytes}
	s.msgs.init(ready)
	return s
}

// weight is what m holds on its slot's queue, in bytes: the sample's buffer (its whole
// size class: a pool buffer is never under 4 KiB, however small the sample), its key
// and its item, and the message itself (twice: the ring may be twice as long as what
// it holds); at most the queue's capacity, so that any sample fits on its own. The
// queue has no message count bound, and this is what keeps a queue of tiny samples
// within its bytes: a byte budget charged only the samples' lengths would let a queue
// of 40-byte samples hold a hundred thousand 4 KiB buffers. A skip notice or failure
// is charged its message, so that a shard of bad samples cannot queue without bound.
func (s *slot) weight(m slotMsg) int64 {
	w := 2 * int64(unsafe.Sizeof(m))
	if it := m.it; it != nil {
		w += int64(cap(it.buf)) + int64(len(it.key)) + int64(unsafe.Sizeof(*it)) + int64(cap(it.values))*int64(unsafe.Sizeof(decode.Value{}))
	}
	return min(w, s.cap)
}

// produce reads one span: fetch, inflate, split, decode. It opens its shard without a
// worker token (the request's wait for its first byte is the store's, not this
// process's CPU), holds one while it reads and decodes, and gives it up while it
// waits for room on its queue, so that a full queue never stops the other shards.
func (pl *Pipeline) produce(ctx context.Context, s *slot) {
	defer s.msgs.close()
	defer pl.placeThread()()
	p := producer{pl: pl, s: s, ctx: ctx}
	p.dec.Images = pl.p.ImageDecoder
	defer p.dec.Release()
	defer p.release()
	// A panic (in a source, a decoder) fails the loader, not the process.
	defer func() {
		if r := recover(); r != nil {
			p.send(slotMsg{err: PanicError("reading "+s.span.URL, r)})
		}
	}()
	p.run()
}

// ErrPanic is wrapped by the error of a loader whose goroutine panicked: in a Source,
// a decoder or the loader itself. The error says where, with the stack.
var ErrPanic = errors.New("shardload: internal error (panic)")

// PanicError is the error of a panic with value r, where says where.
func PanicError(where string, r any) error {
	return fmt.Errorf("%w %s: %v\n%s", ErrPanic, where, r, debug.Stack())
}

type producer struct {
	pl      *Pipeline
	s       *slot
	ctx     context.Context
	dec     decode.Decoder
	scratch []byte
	n       int      // the number in its span of the sample being read
	placed  [][]byte // the members of that sample read straight into slab rows
	worker  bool     // holds a worker token
	turn    int64    // bytes queued since it took the token
}

// acquire takes a worker token, reporting false when the loader is stopping. Tokens
// go first to the producers whose queues hold the least (gate).
func (p *producer) acquire() bool {
	p.worker = p.pl.workers.acquireFor(p.ctx, p.s.queued.Load)
	p.turn = 0
	return p.worker
}

// yield gives the worker token to a waiting producer once this one has queued a
// quarter of its queue's capacity since it took the token, and takes it back when its
// turn comes again, reporting false when the loader is stopping. Without it a
// producer read on until its queue was full while others waited with empty queues:
// at the start of an epoch the first window, which needs some samples of every lane,
// waited for the lanes before the last to fill their queues (16 MB of 20 decoded
// before the first batch, over 8 lanes of zstd token shards). A quarter, not a
// sample: each switch costs the decoder its warm caches.
func (p *producer) yield() bool {
	if p.turn < p.s.cap/4 || !p.pl.workers.contended() {
		return true
	}
	p.release()
	return p.acquire()
}

// release gives the worker token back, if held.
func (p *producer) release() {
	if p.worker {
		p.pl.workers.release()
		p.worker = false
	}
}

func (p *producer) run() {
	pl, span := p.pl, p.s.span
	opts := pl.p.Reader
	opts.URL, opts.Timing, opts.Buffers = span.URL, true, &pl.pool
	// A span that starts inside a shard whose sample offsets are known starts
	// reading at its first sample (a ranged read, a seek), not at the shard's start.
	first := 0
	info := pl.p.Plan.Loaded().At(pl.p.Shards, span.Shard) // with the offsets read for this plan
	length := int64(-1)
	if offs := info.Offsets; span.Skip > 0 && span.Skip < len(offs) {
		first, opts.StartOffset = span.Skip, offs[span.Skip]
	}
	if offs := info.Offsets; first == span.Skip && span.Skip+span.Take < len(offs) {
		// A span that ends before the shard's end, entered at its first sample: read
		// its bytes only.
		opts.EndOffset = offs[span.Skip+span.Take]
		length = opts.EndOffset - opts.StartOffset
	}
	// A shard whose count came from an index entry is read at the version the entry
	// was taken from: an object overwritten since fails loudly (source.ErrChanged)
	// instead of being read with another object's counts and offsets.
	var body io.ReadCloser
	var err error
	octx := pl.fetchContext(p.ctx)
	// Opening (a stat and a request's first byte, on a remote store) counts as fetch.
	t0 := mono()
	switch {
	case info.Version != "" && !info.Estimated:
		body, err = pl.openShard(octx, span.URL, info, opts.StartOffset, length)
		if errors.Is(err, source.ErrChanged) {
			// Under either policy: every rank planned from the stale count.
			p.send(slotMsg{err: &CountError{URL: span.URL, Err: fmt.Errorf("%w: %s changed since its sample count was taken (version %s): every rank's plan is wrong; rebuild the index (shardload index): %w", ErrCountMismatch, span.URL, info.Version, err)}})
			return
		}
	case opts.StartOffset > 0 || length >= 0:
		body, err = pl.p.Sources.OpenRange(octx, span.URL, opts.StartOffset, length)
	default:
		body, err = pl.p.Sources.Open(octx, span.URL)
	}
	add(&pl.C.Fetch, mono()-t0)
	pl.C.Requests.Add(1)
	if err != nil {
		p.fail(span.Take, true, err)
		return
	}
	defer body.Close()
	// Opened: the reads and the decoding from here on take a worker.
	if !p.acquire() {
		return
	}
	if pl.placing {
		opts.Place = p.place
	}
	r := shard.NewReader(body, opts)
	defer func() {
		fetch, inflate := r.Times()
		add(&pl.C.Fetch, fetch)
		add(&pl.C.Inflate, inflate)
		pl.C.BytesIn.Add(r.StoredBytes())
		pl.C.streamBytes(pl.p.StreamOf, span.Shard, r.StoredBytes())
		pl.C.BytesInflated.Add(r.Offset() - opts.StartOffset)
		r.Close()
	}()
	var nextTime, decodeTime time.Duration
	defer func() {
		fetch, inflate := r.Times()
		add(&pl.C.Split, nextTime-fetch-inflate)
		add(&pl.C.Decode, decodeTime)
	}()
	// A shard whose count is an estimate is read by its last span to its end, however
	// many samples that is; a span that finds the shard ending early ends there. The
	// batcher pads or trims to the planned batches. Read from its start to its end,
	// the shard's true entry is recorded.
	toEnd := info.Estimated && span.Skip+span.Take == info.Samples
	var rec *index.Recorder
	if toEnd && span.Skip == 0 && pl.p.Record != nil {
		rec = index.NewRecorder()
	}
	for idx, taken := first, 0; taken < span.Take || toEnd; idx++ {
		p.n, p.placed = idx-span.Skip, p.placed[:0]
		t0 := mono()
		smp, err := r.Next()
		t1 := mono()
		nextTime += t1 - t0
		if err == io.EOF && info.Estimated {
			if rec != nil {
				pl.p.Record(rec.Info(span.URL, r, info.Version, info.Size))
			}
			return
		}
		if err == io.EOF {
			err = &CountError{URL: span.URL, Err: fmt.Errorf("%w: %s has %d samples, but its count says at least %d (a stale index, or the shard changed since it was counted)", ErrCountMismatch, span.URL, idx, span.Skip+span.Take)}
		}
		if offs := info.Offsets; err == nil && idx < len(offs) && smp.Offset != offs[idx] {
			// An index whose offsets are not this shard's: every rank that planned
			// from it reads the wrong samples.
			pl.pool.Put(smp.Buf)
			p.send(slotMsg{err: &CountError{URL: span.URL, Err: fmt.Errorf("%w: %s: sample %d (key %q) starts at byte %d, where its index entry says byte %d (a stale or broken index): every rank's plan is wrong; rebuild the index (shardload index)", ErrCountMismatch, span.URL, idx, smp.Key, smp.Offset, offs[idx])}})
			return
		}
		sampleOnly := shard.SampleOnly(err)
		if rec != nil && (err == nil || sampleOnly) {
			rec.Add(smp, err)
		}
		if idx < span.Skip {
			if err != nil && !sampleOnly {
				p.fail(span.Take, true, err)
				return
			}
			if smp != nil {
				pl.pool.Put(smp.Buf)
			}
			continue // the previous rank's samples
		}
		taken++
		if err != nil {
			if !sampleOnly {
				p.fail(max(span.Take-taken+1, 1), true, err)
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
				pl.put(it)
			}
			return
		}
	}
	switch end := span.Skip + span.Take; {
	case info.Estimated:
	case end == info.Samples:
		p.checkEnd(r, end)
	case !pl.readsEnd(span.Shard):
		p.checkCount(r, info, end)
	}
}

// checkCount checks, after a span that ends before its shard does, that the shard
// holds the samples its count says, when no span of this rank reads the shard's end:
// every rank that reads a shard fails on a count that is wrong, not only the one that
// reads its last samples. It runs once per shard and loader. An entry pinned to the
// version being read is trusted when it is what "shardload index" writes for such a
// shard (offsets for every sample of an uncompressed shard, a count for a compressed
// one): it was taken by reading that very object. Otherwise, with sample offsets, it
// reads the last sample and the shard's end (one ranged read); without, it reads on
// to the end.
func (p *producer) checkCount(r *shard.Reader, info shard.Info, end int) {
	pl, url := p.pl, p.s.span.URL
	if info.Version != "" && (len(info.Offsets) == info.Samples || r.Compression() != shard.None) {
		return
	}
	if _, done := pl.countChecked.LoadOrStore(p.s.span.Shard, true); done {
		return
	}
	mismatch := func(format string, args ...any) {
		p.send(slotMsg{err: &CountError{URL: url, Err: fmt.Errorf("%w: %s %s (a stale or broken index, or the shard changed since it was counted): every rank's plan is wrong; rebuild the index (shardload index)", ErrCountMismatch, url, fmt.Sprintf(format, args...))}})
	}
	if offs := info.Offsets; len(offs) == info.Samples && info.Samples > 0 {
		last := offs[len(offs)-1]
		var body io.ReadCloser
		var err error
		octx := pl.fetchContext(p.ctx)
		if info.Version != "" {
			body, err = pl.openShard(octx, url, info, last, -1)
		} else {
			body, err = pl.p.Sources.OpenRange(octx, url, last, -1)
		}
		pl.C.Requests.Add(1)
		if err != nil {
			if p.ctx.Err() == nil {
				mismatch("cannot be read at byte %d, where its index puts sample %d, its last: %v", last, info.Samples-1, err)
			}
			return
		}
		defer body.Close()
		opts := pl.p.Reader
		opts.URL, opts.StartOffset, opts.SizesOnly = url, last, true
		tr := shard.NewReader(body, opts)
		defer func() { pl.C.BytesIn.Add(tr.StoredBytes()); tr.Close() }()
		smp, err := tr.Next()
		switch {
		case err != nil && !shard.SampleOnly(err):
			if p.ctx.Err() == nil {
				mismatch("has no sample at byte %d, where its index puts sample %d, its last: %v", last, info.Samples-1, err)
			}
			return
		case err == nil && smp.Offset != last:
			mismatch("has its sample %d at byte %d, where its index says %d", info.Samples-1, smp.Offset, last)
			return
		}
		if _, err := tr.Next(); err == nil || shard.SampleOnly(err) {
			mismatch("has more samples than the %d its count says", info.Samples)
		}
		return
	}
	if r.Compression() != shard.None && info.Version != "" {
		return
	}
	for idx := end; ; idx++ {
		smp, err := r.Next()
		if smp != nil {
			pl.pool.Put(smp.Buf)
		}
		switch {
		case err == io.EOF:
			if idx < info.Samples {
				mismatch("has %d samples, but its count says %d", idx, info.Samples)
			}
			return
		case err != nil && !shard.SampleOnly(err):
			// A failure in the part of the shard other ranks read: theirs to report.
			return
		case idx >= info.Samples:
			mismatch("has more samples than the %d its count says", info.Samples)
			return
		}
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
	if err == nil || shard.SampleOnly(err) {
		if smp != nil {
			p.pl.pool.Put(smp.Buf)
		}
		p.send(slotMsg{err: &CountError{URL: p.s.span.URL, Err: fmt.Errorf("%w: %s has more samples than the %d its count says (a stale index, or the shard changed since it was counted): every rank's plan is wrong; rebuild the index", ErrCountMismatch, p.s.span.URL, count)}})
		return
	}
	// The samples are out; the shard's end is bad (cut short, a bad checksum).
	p.fail(0, true, err)
}

// decode decodes the configured fields of smp into an item that owns its bytes: the
// sample's buffer, which the reader filled from the pool, holds the fields that
// decode in place (raw bytes, .npy data), and the others are appended to it.
func (p *producer) decode(smp *shard.Sample) (*item, error) {
	pl := p.pl
	it := pl.item(len(pl.p.Fields))
	it.key = smp.Key
	if pl.detached {
		// No field's value is a view of the member's bytes (images, labels): the item
		// holds the decoded values only, and the sample's buffer goes back to the pool.
		it.buf = pl.pool.Get(pl.detachedBytes)[:0]
		defer pl.pool.Put(smp.Buf)
	} else {
		it.buf, smp.Buf = smp.Buf, nil
	}
	if pl.images {
		p.dec.Seed = decode.SampleSeed(pl.p.AugmentSeed, pl.p.Epoch, smp.Key)
	}
	type span struct{ off, n int }
	var spans [16]span
	offs := spans[:0]
	var olds [4][]byte
	retired := olds[:0]
	defer func() {
		for _, b := range retired {
			pl.pool.Put(b)
		}
	}()
	for i := range pl.p.Fields {
		f := &pl.p.Fields[i]
		data, ok := smp.Get(f.Ext)
		if !ok {
			pl.put(it)
			return nil, pl.sampleError(smp, f, fmt.Errorf("%w %q (the sample has %s)", ErrMissingField, f.Ext, extList(smp)))
		}
		v, scratch, err := p.dec.Decode(f, data, p.scratch)
		p.scratch = scratch
		if err != nil {
			pl.put(it)
			return nil, pl.sampleError(smp, f, err)
		}
		if off, ok := mem.Within(v.Data, it.buf); ok {
			// A view of the sample's own bytes: kept where it is.
			offs = append(offs, span{off, len(v.Data)})
		} else if p.inPlace(v.Data) {
			// Read straight into its slab row: kept there.
			offs = append(offs, span{-1, 0})
			it.placed |= 1 << i
		} else {
			// Decoded into scratch memory, reused for the next field and sample.
			offs = append(offs, span{len(it.buf), len(v.Data)})
			if cap(it.buf)-len(it.buf) < len(v.Data) {
				// Outgrown: the old buffer stays valid until the end, for the
				// fields still to decode from it.
				nb := append(pl.pool.Get(len(it.buf)+len(v.Data)), it.buf...)
				retired = append(retired, it.buf)
				it.buf = nb
			}
			it.buf = append(it.buf, v.Data...)
		}
		it.values[i] = v
	}
	for i, o := range offs {
		if o.n > 0 && o.off >= 0 {
			it.values[i].Data = it.buf[o.off : o.off+o.n : o.off+o.n]
		}
	}
	it.size = int64(len(it.buf)) + int64(len(it.key))
	return it, nil
}

// place is the Reader's Options.Place: the destination the mixer published for
// member f of the sample being read, if any.
func (p *producer) place(key string, f shard.Field) []byte {
	dst := p.pl.places.take(placeKey{span: p.s.index, n: p.n, ext: f.Ext})
	if int64(len(dst)) == f.Size && f.Size > 0 {
		p.placed = append(p.placed, dst)
		p.pl.C.Placed.Add(f.Size)
	}
	return dst
}

// inPlace reports whether v is one of the members of the sample being read that
// went straight to their slab rows.
func (p *producer) inPlace(v []byte) bool {
	for _, dst := range p.placed {
		if len(v) > 0 && len(v) == len(dst) && unsafe.SliceData(v) == unsafe.SliceData(dst) {
			return true
		}
	}
	return false
}

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
	if !p.pl.p.Skip || p.ctx.Err() != nil {
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
	m.weight = s.weight(m)
	if s.q.TryAcquire(m.weight) {
		s.queued.Add(m.weight)
		p.pl.C.Queued.Add(m.weight)
		s.msgs.push(m)
		p.turn += m.weight
		return true, p.yield()
	}
	p.release()
	if s.q.Acquire(p.ctx, m.weight) != nil {
		return false, false
	}
	// Queued before the token is back: the mixer may take it at once, and a producer
	// stopped while it waits for the token must leave it to the mixer.
	s.queued.Add(m.weight)
	p.pl.C.Queued.Add(m.weight)
	s.msgs.push(m)
	return true, p.acquire()
}

// SampleError is a sample that could not be decoded: a missing field, a wrong shape, a
// label that is not a number. Err is the cause.
type SampleError struct {
	URL    string // the shard's URL, secrets removed (package redact)
	Key    string // the sample's key
	Offset int64  // byte offset of the sample's first member in the shard's (decompressed) tar
	Field  string // the field's column name
	Err    error
}

func (e *SampleError) Error() string {
	return fmt.Sprintf("%s: sample %q at byte %d: field %s: %v", e.URL, e.Key, e.Offset, e.Field, e.Err)
}

// Unwrap returns the cause.
func (e *SampleError) Unwrap() error { return e.Err }

// sampleError returns the error of a sample that could not be decoded.
func (pl *Pipeline) sampleError(smp *shard.Sample, f *decode.Field, err error) error {
	return &SampleError{URL: redact.URL(smp.URL), Key: smp.Key, Offset: smp.Offset, Field: f.ColumnName(), Err: err}
}

// ErrMissingField means a sample lacks a configured field.
var ErrMissingField = errors.New("shardload: missing field")

// ErrCountMismatch means a shard holds another number of samples than the counts
// the epoch was planned from (Config.Shards, Config.Index or the counting pass).
var ErrCountMismatch = errors.New("shardload: shard and sample count disagree")

// CountError is an ErrCountMismatch found in one shard: URL is the shard's, as
// planned (the entry of the plan's shards it was found in).
type CountError struct {
	URL string
	Err error // wraps ErrCountMismatch
}

func (e *CountError) Error() string { return e.Err.Error() }
func (e *CountError) Unwrap() error { return e.Err }

func (pl *Pipeline) item(fields int) *item {
	it, _ := pl.items.Get().(*item)
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

// put drops one reference to it and recycles it when none is left.
func (pl *Pipeline) put(it *item) {
	if it.refs--; it.refs > 0 {
		return
	}
	pl.pool.Put(it.buf)
	clear(it.values)
	*it = item{values: it.values[:0]}
	pl.items.Put(it)
}

// openShard reads [off, off+length) of url at info's version: in one request when
// info knows the object's size too (an index entry, a listing), else a Stat first.
func (pl *Pipeline) openShard(ctx context.Context, url string, info shard.Info, off, length int64) (io.ReadCloser, error) {
	if info.Size > 0 {
		return pl.p.Sources.OpenInfoRange(ctx, source.Info{URL: url, Size: info.Size, Version: info.Version}, off, length)
	}
	return pl.p.Sources.OpenVersion(ctx, url, info.Version, off, length)
}
