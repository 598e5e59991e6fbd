package source

// Parallel parts: the probe that times an object's first part, and the parallel-part stream.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"
)

// probeStream reads an object as one ranged request, timing the reads of its first
// part; at the end of that part it goes on with the same request when the part
// arrived fast enough, or ends it and reads the rest as parallel parts (see
// FetchOptions.SingleRate). Going on with the same request leaves no gap between
// the first part and the rest.
type probeStream struct {
	ctx    context.Context
	p      partReader
	cur    io.ReadCloser // the whole range; after a switch, the rest's parts
	pos    int64         // offset of the next byte
	rest   int64         // where the first part ends
	end    int64
	waited time.Duration // time spent in the first part's reads
	probe  bool          // still reading the first part
	closed bool
}

func newProbeStream(ctx context.Context, p partReader, off, n int64) *probeStream {
	p.f.streams.Add(1)
	return &probeStream{ctx: ctx, p: p, cur: newResumeStream(ctx, p, off, n), pos: off, rest: off + p.partSize, end: off + n, probe: true}
}

func (s *probeStream) Read(b []byte) (int, error) {
	if !s.probe {
		return s.cur.Read(b)
	}
	if left := s.rest - s.pos; int64(len(b)) > left {
		b = b[:left]
	}
	t0 := time.Now()
	n, err := s.cur.Read(b)
	s.waited += time.Since(t0)
	s.pos += int64(n)
	if s.pos == s.rest && err == nil {
		s.decide()
	}
	return n, err
}

// decide keeps the request for the rest when the first part arrived at SingleRate
// or faster, and otherwise replaces it with parallel parts.
func (s *probeStream) decide() {
	s.probe = false
	n := s.end - s.rest
	rate := float64(s.p.partSize) / max(s.waited.Seconds(), 1e-9) * float64(max(s.p.f.streams.Load(), 1))
	if rate >= s.p.f.opts.SingleRate || n <= s.p.partSize {
		return
	}
	s.cur.Close()
	s.cur = newParallelStream(s.ctx, s.p, s.rest, n)
}

// WriteTo copies the stream to w: through a buffer for the first part, then with the
// rest's own WriteTo when it has one (parallel parts are written from their buffers).
func (s *probeStream) WriteTo(w io.Writer) (int64, error) {
	var total int64
	if s.probe {
		buf := make([]byte, 256<<10)
		for s.probe {
			n, err := s.Read(buf)
			if n > 0 {
				k, werr := w.Write(buf[:n])
				total += int64(k)
				if werr != nil {
					return total, werr
				}
			}
			if err == io.EOF {
				return total, nil
			}
			if err != nil {
				return total, err
			}
		}
	}
	var n int64
	var err error
	if wt, ok := s.cur.(io.WriterTo); ok {
		n, err = wt.WriteTo(w)
	} else {
		n, err = io.Copy(w, struct{ io.Reader }{s.cur})
	}
	return total + n, err
}

// Close ends the stream and the requests it has in flight.
func (s *probeStream) Close() error {
	if !s.closed {
		s.closed = true
		s.p.f.streams.Add(-1)
	}
	return s.cur.Close()
}

// parallelStream reads [off, off+n) as parts fetched by up to Parallel goroutines
// into Parallel buffers, and delivers them in order.
type parallelStream struct {
	ctx    context.Context
	cancel context.CancelFunc
	f      *Fetcher
	url    string
	order  chan *part     // parts in object order, as they are started
	free   chan []byte    // buffers not in use; its capacity bounds memory
	wg     sync.WaitGroup // the dispatcher and part goroutines
	cur    *part
	pos    int // read position in cur.buf
	err    error
	once   sync.Once
}

type part struct {
	buf  []byte
	done chan struct{} // closed when buf is full or err is set
	err  error
}

func newParallelStream(ctx context.Context, p partReader, off, n int64) *parallelStream {
	ctx, cancel := context.WithCancel(ctx)
	par, size := p.parallel, p.partSize
	s := &parallelStream{
		ctx:    ctx,
		cancel: cancel,
		f:      p.f,
		url:    p.url,
		order:  make(chan *part, par),
		free:   make(chan []byte, par),
	}
	for range par {
		s.free <- nil // allocated on first use
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer close(s.order)
		for start := off; start < off+n; start += size {
			var buf []byte
			select {
			case buf = <-s.free:
			case <-ctx.Done():
				return
			}
			plen := min(size, off+n-start)
			if buf == nil {
				buf = p.f.getBuf(size)
			}
			pt := &part{buf: buf[:plen], done: make(chan struct{})}
			select {
			case s.order <- pt:
			case <-ctx.Done():
				return
			}
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				defer close(pt.done)
				pt.err = fillPart(ctx, p, start, pt.buf)
			}()
		}
	}()
	return s
}

// fillPart reads exactly len(buf) bytes at off into buf.
func fillPart(ctx context.Context, p partReader, off int64, buf []byte) error {
	rs := newResumeStream(ctx, p, off, int64(len(buf)))
	defer rs.Close()
	_, err := io.ReadFull(rs, buf)
	if errors.Is(err, io.ErrUnexpectedEOF) || err == io.EOF {
		err = &Error{Op: "read", URL: p.url, Err: fmt.Errorf("%w: part at byte %d", ErrShortRead, off)}
	}
	return err
}

// Read delivers the parts' bytes in order.
func (s *parallelStream) Read(b []byte) (int, error) {
	if err := s.next(); err != nil {
		return 0, err
	}
	n := copy(b, s.cur.buf[s.pos:])
	s.pos += n
	return n, nil
}

// WriteTo writes the parts' bytes to w in order, straight from the part buffers
// (io.Copy uses it and needs no buffer of its own).
func (s *parallelStream) WriteTo(w io.Writer) (int64, error) {
	var total int64
	for {
		if err := s.next(); err == io.EOF {
			return total, nil
		} else if err != nil {
			return total, err
		}
		n, err := w.Write(s.cur.buf[s.pos:])
		s.pos += n
		total += int64(n)
		if err != nil {
			return total, s.setErr(err)
		}
	}
}

// next makes s.cur a part with bytes left to deliver, waiting for it, or returns the
// stream's error (io.EOF at its end).
func (s *parallelStream) next() error {
	if s.err != nil {
		return s.err
	}
	for s.cur == nil || s.pos == len(s.cur.buf) {
		if s.cur != nil {
			s.free <- s.cur.buf[:cap(s.cur.buf)] // never blocks: it came from free
			s.cur = nil
		}
		var pt *part
		var ok bool
		select {
		case pt, ok = <-s.order:
		case <-s.ctx.Done():
			return s.setErr(&Error{Op: "read", URL: s.url, Err: context.Cause(s.ctx)})
		}
		if !ok {
			if err := s.ctx.Err(); err != nil {
				return s.setErr(&Error{Op: "read", URL: s.url, Err: err})
			}
			return s.setErr(io.EOF)
		}
		select {
		case <-pt.done:
		case <-s.ctx.Done():
			return s.setErr(&Error{Op: "read", URL: s.url, Err: context.Cause(s.ctx)})
		}
		if pt.err != nil {
			return s.setErr(pt.err)
		}
		s.cur, s.pos = pt, 0
	}
	return nil
}

func (s *parallelStream) setErr(err error) error {
	s.err = err
	if err != io.EOF {
		s.cancel()
	}
	return err
}

// Close cancels the parts in flight and waits for their goroutines. It is idempotent.
func (s *parallelStream) Close() error {
	s.once.Do(func() {
		s.cancel()
		s.wg.Wait()
		// Every part goroutine is done: their buffers can go to later streams. (The
		// part being read, if any, is left to the garbage collector: a Read may
		// still be returning from it.)
		for pt := range s.order {
			s.f.putBuf(pt.buf)
		}
		for drained := false; !drained; {
			select {
			case b := <-s.free:
				if b != nil {
					s.f.putBuf(b)
				}
			default:
				drained = true
			}
		}
		if s.err == nil {
			s.err = &Error{Op: "read", URL: s.url, Err: errors.New("source: read after close")}
		}
	})
	return nil
}
