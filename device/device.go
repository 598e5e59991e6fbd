package device

import (
	"context"
	"errors"
	"fmt"
	"log"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"
)

// Kind names a backend.
type Kind string

// The backends.
const (
	// Host leaves batches in host memory (the default).
	Host Kind = "host"
	// CUDA copies batches to an NVIDIA GPU.
	CUDA Kind = "cuda"
	// Auto is CUDA when a driver and a GPU are there, Host otherwise.
	Auto Kind = "auto"
)

// ParseKind parses "host", "cuda" or "auto".
func ParseKind(s string) (Kind, error) {
	switch k := Kind(s); k {
	case Host, CUDA, Auto:
		return k, nil
	}
	return "", fmt.Errorf("device: unknown kind %q: want host, cuda or auto", s)
}

// Defaults for the zero Options.
const (
	// DefaultBuffers is the number of device buffers: two, so one batch is copied
	// while the consumer uses the other.
	DefaultBuffers = 2
	// DefaultBufferBytes is the size of each device buffer.
	DefaultBufferBytes = 64 << 20
	// DefaultLibrary is the CUDA driver library loaded at run time.
	DefaultLibrary = "libcuda.so.1"
)

// Errors of this package.
var (
	// ErrNoDriver is wrapped by Open's error for Kind CUDA when the driver library
	// cannot be loaded, has no GPU, or the binary was built without cgo.
	ErrNoDriver = errors.New("device: no CUDA driver or GPU")
	// ErrTooLarge is wrapped by Copy's error for a batch larger than a device buffer.
	ErrTooLarge = errors.New("device: batch larger than the device buffer")
	// ErrClosed is returned by Copy once the stage is closed.
	ErrClosed = errors.New("device: stage closed")
	// ErrCUDA is wrapped by the errors of CUDA calls that failed.
	ErrCUDA = errors.New("device: CUDA call failed")
)

// Options configure Open. The zero value is the host backend.
type Options struct {
	// Kind is Host (the default, also for ""), CUDA or Auto.
	Kind Kind
	// GPU is the CUDA device ordinal, as CUDA numbers devices (CUDA_VISIBLE_DEVICES
	// and CUDA_DEVICE_ORDER apply). Default 0.
	GPU int
	// Buffers is the number of device buffers, at least 2 for copies to overlap the
	// consumer's use of the previous batch. Default DefaultBuffers (2).
	Buffers int
	// BufferBytes is the size of each device buffer: the largest batch. Default
	// DefaultBufferBytes (64 MiB); a loader sets it to its slab size.
	BufferBytes int64
	// Library is the driver library to load. Default DefaultLibrary ("libcuda.so.1").
	Library string
	// Logf receives the line Auto writes when it falls back to Host. Default
	// log.Printf.
	Logf func(format string, args ...any)
}

func (o Options) withDefaults() (Options, error) {
	if o.Kind == "" {
		o.Kind = Host
	}
	if _, err := ParseKind(string(o.Kind)); err != nil {
		return o, err
	}
	if o.GPU < 0 || o.Buffers < 0 || o.BufferBytes < 0 {
		return o, fmt.Errorf("device: negative GPU (%d), Buffers (%d) or BufferBytes (%d)", o.GPU, o.Buffers, o.BufferBytes)
	}
	if o.Buffers == 0 {
		o.Buffers = DefaultBuffers
	}
	if o.BufferBytes == 0 {
		o.BufferBytes = DefaultBufferBytes
	}
	if o.Library == "" {
		o.Library = DefaultLibrary
	}
	if o.Logf == nil {
		o.Logf = log.Printf
	}
	return o, nil
}

// driver is a GPU as the stage uses it; the cgo shim implements it for CUDA.
type driver interface {
	// describe names the GPU: "NVIDIA H200, PCI 0000:19:00.0".
	describe() string
	pciBusID() string
	alloc(n int64) (uint64, error)
	free(ptr uint64) error
	register(mem []byte) error
	unregister(mem []byte) error
	// newLane makes a stream with a start and an end event.
	newLane() (lane, error)
	close() error
}

// lane is one device buffer's stream and events.
type lane interface {
	// copy enqueues: record start, copy src to dst, record end. It returns once
	// enqueued; src must stay untouched until wait returns.
	copy(dst uint64, src []byte) error
	// wait blocks until the end event has happened.
	wait() error
	// elapsed is the time between the events, after wait.
	elapsed() (time.Duration, error)
	// readBack copies n bytes at src on the device to dst, synchronously.
	readBack(dst []byte, src uint64) error
	destroy() error
}

// Stage is an open backend. Copy, Register and Stats are safe for concurrent use.
type Stage struct {
	kind  Kind
	opts  Options
	drv   driver // nil for Host
	desc  string
	free  chan *buffer
	bufs  []*buffer
	done  chan struct{}
	wg    sync.WaitGroup // one per transfer in flight
	mu    sync.Mutex
	regd  map[uintptr][]byte // host memory registered, by base address
	shut  bool
	once  sync.Once
	cErr  error
	stats struct {
		copies, bytes, copyNs, waitNs, stallNs atomic.Int64
	}
}

// buffer is one device buffer and the lane that fills it.
type buffer struct {
	ptr  uint64
	lane lane
}

// Open opens the backend opts.Kind names. For CUDA it loads the driver, retains the
// GPU's primary context and allocates the device buffers; without a driver or GPU
// it returns an error wrapping ErrNoDriver, and Auto falls back to Host instead.
func Open(opts Options) (*Stage, error) {
	o, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	s := &Stage{kind: Host, opts: o, done: make(chan struct{}), regd: map[uintptr][]byte{},
		desc: "host: batches stay in pinned host memory"}
	if o.Kind == Host {
		return s, nil
	}
	drv, err := openDriver(o.Library, o.GPU)
	if err != nil {
		if o.Kind == Auto && errors.Is(err, ErrNoDriver) {
			o.Logf("%v; using host memory (--device host)", err)
			return s, nil
		}
		return nil, err
	}
	s.kind, s.drv = CUDA, drv
	s.desc = fmt.Sprintf("cuda: GPU %d (%s), %d device buffers of %d bytes", o.GPU, drv.describe(), o.Buffers, o.BufferBytes)
	s.free = make(chan *buffer, o.Buffers)
	for range o.Buffers {
		b := &buffer{}
		if b.ptr, err = drv.alloc(o.BufferBytes); err != nil {
			s.Close()
			return nil, fmt.Errorf("device: GPU %d: allocating %d device buffers of %d bytes: %w", o.GPU, o.Buffers, o.BufferBytes, err)
		}
		s.bufs = append(s.bufs, b)
		if b.lane, err = drv.newLane(); err != nil {
			s.Close()
			return nil, fmt.Errorf("device: GPU %d: stream and events: %w", o.GPU, err)
		}
		s.free <- b
	}
	return s, nil
}

// Kind returns the backend in use: Host or CUDA (never Auto).
func (s *Stage) Kind() Kind { return s.kind }

// MaxCopy returns the largest batch the stage copies to the device: its buffers'
// size; 0 for Host (no limit).
func (s *Stage) MaxCopy() int64 {
	if s == nil || s.drv == nil {
		return 0
	}
	return s.opts.BufferBytes
}

// String describes the backend in one line.
func (s *Stage) String() string { return s.desc }

// PCIBusID returns the GPU's PCI address as CUDA writes it ("00000000:19:00.0"),
// "" for Host. numa.Topology.GPUByPCI accepts it.
func (s *Stage) PCIBusID() string {
	if s.drv == nil {
		return ""
	}
	return s.drv.pciBusID()
}

// Register pins host memory for DMA with the GPU (cuMemHostRegister), so copies from
// it run at full speed and asynchronously; registering the same memory again does
// nothing. Host: nothing to do. Close unregisters everything. A failure is not fatal
// for Copy (unregistered memory is copied through a staging buffer, slower).
func (s *Stage) Register(mem []byte) error {
	if s.drv == nil || len(mem) == 0 {
		return nil
	}
	base := uintptr(unsafe.Pointer(unsafe.SliceData(mem)))
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.shut {
		return ErrClosed
	}
	if _, ok := s.regd[base]; ok {
		return nil
	}
	if err := s.drv.register(mem); err != nil {
		return fmt.Errorf("device: registering %d bytes at %#x as pinned: %w", len(mem), base, err)
	}
	s.regd[base] = mem
	return nil
}

// Unregister undoes Register for mem, which is about to be unmapped (a slab that
// grows); memory not registered is left alone.
func (s *Stage) Unregister(mem []byte) error {
	if s.drv == nil || len(mem) == 0 {
		return nil
	}
	base := uintptr(unsafe.Pointer(unsafe.SliceData(mem)))
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.regd[base]; !ok || s.shut {
		return nil
	}
	delete(s.regd, base)
	return s.drv.unregister(mem)
}

// Copy starts copying src to a free device buffer and returns its Transfer at once,
// waiting only while every buffer is held by a transfer not yet released (or
// returning ctx.Err(), or ErrClosed). src must not change until the transfer is
// released. Host: src stays where it is; the transfer is complete at once.
func (s *Stage) Copy(ctx context.Context, src []byte) (*Transfer, error) {
	t := &Transfer{s: s, src: src, done: make(chan struct{})}
	if s.drv == nil {
		select {
		case <-s.done:
			return nil, ErrClosed
		default:
		}
		s.stats.copies.Add(1)
		s.stats.bytes.Add(int64(len(src)))
		close(t.done)
		return t, nil
	}
	if int64(len(src)) > s.opts.BufferBytes {
		return nil, fmt.Errorf("%w: %d bytes, device buffers hold %d (raise the buffer size to the slab size)", ErrTooLarge, len(src), s.opts.BufferBytes)
	}
	t0 := time.Now()
	select {
	case t.buf = <-s.free:
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-s.done:
		return nil, ErrClosed
	}
	s.stats.stallNs.Add(int64(time.Since(t0)))
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.shut {
		return nil, ErrClosed
	}
	if err := t.buf.lane.copy(t.buf.ptr, src); err != nil {
		s.free <- t.buf
		return nil, fmt.Errorf("device: copying %d bytes to GPU %d: %w", len(src), s.opts.GPU, err)
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		err := t.buf.lane.wait()
		d, eerr := t.buf.lane.elapsed()
		if err == nil && eerr == nil {
			s.stats.copyNs.Add(int64(d))
		}
		if err != nil {
			t.err = fmt.Errorf("device: copy of %d bytes to GPU %d: %w", len(src), s.opts.GPU, err)
		}
		t.copyTime = d
		s.stats.copies.Add(1)
		s.stats.bytes.Add(int64(len(src)))
		close(t.done)
	}()
	return t, nil
}

// Stats returns what the stage has done so far.
func (s *Stage) Stats() Stats {
	return Stats{
		Kind: s.kind, Copies: s.stats.copies.Load(), Bytes: s.stats.bytes.Load(),
		CopyTime:  time.Duration(s.stats.copyNs.Load()),
		WaitTime:  time.Duration(s.stats.waitNs.Load()),
		StallTime: time.Duration(s.stats.stallNs.Load()),
	}
}

// Close waits for copies in flight, unregisters the host memory, frees the device
// buffers and releases the GPU. Copy calls waiting for a buffer return ErrClosed.
// Transfers must not be used afterwards. Close is idempotent.
func (s *Stage) Close() error {
	s.once.Do(func() {
		s.mu.Lock()
		s.shut = true
		close(s.done)
		s.mu.Unlock()
		s.wg.Wait()
		if s.drv == nil {
			return
		}
		var errs []error
		for _, b := range s.bufs {
			if b.lane != nil {
				errs = append(errs, b.lane.destroy())
			}
			errs = append(errs, s.drv.free(b.ptr))
		}
		for _, mem := range s.regd {
			errs = append(errs, s.drv.unregister(mem))
		}
		errs = append(errs, s.drv.close())
		if err := errors.Join(errs...); err != nil {
			s.cErr = fmt.Errorf("device: closing GPU %d: %w", s.opts.GPU, err)
		}
	})
	return s.cErr
}

// Transfer is one batch on its way to the device.
type Transfer struct {
	s        *Stage
	src      []byte
	buf      *buffer // nil for Host
	done     chan struct{}
	err      error         // set before done is closed
	copyTime time.Duration // set before done is closed
	released atomic.Bool
}

// Wait blocks until the batch is on the device (the copy's end event), returning
// the copy's error, or ctx.Err() if ctx is done first. The time spent waiting counts
// in Stats.WaitTime.
func (t *Transfer) Wait(ctx context.Context) error {
	select {
	case <-t.done:
		return t.err
	default:
	}
	t0 := time.Now()
	defer func() { t.s.stats.waitNs.Add(int64(time.Since(t0))) }()
	select {
	case <-t.done:
		return t.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Done is closed when the copy has finished.
func (t *Transfer) Done() <-chan struct{} { return t.done }

// Len returns the bytes transferred.
func (t *Transfer) Len() int { return len(t.src) }

// Ptr returns where the batch is for the consumer: the device address (CUdeviceptr)
// of its buffer, or for Host the address of the host memory.
func (t *Transfer) Ptr() uintptr {
	if t.buf == nil {
		return uintptr(unsafe.Pointer(unsafe.SliceData(t.src)))
	}
	return uintptr(t.buf.ptr)
}

// CopyTime returns the copy's duration as the device measured it (0 for Host, and
// before the copy is done).
func (t *Transfer) CopyTime() time.Duration {
	select {
	case <-t.done:
		return t.copyTime
	default:
		return 0
	}
}

// ReadBack copies the transferred bytes from the device into dst (len(dst) >=
// Len()), after waiting for the copy: what a check that the device holds the slab's
// bytes uses. Host: a copy of the source. It must be called before Release.
func (t *Transfer) ReadBack(ctx context.Context, dst []byte) error {
	if len(dst) < len(t.src) {
		return fmt.Errorf("device: read back %d bytes into %d", len(t.src), len(dst))
	}
	if t.released.Load() {
		return errors.New("device: read back of a released transfer")
	}
	if err := t.Wait(ctx); err != nil {
		return err
	}
	if t.buf == nil {
		copy(dst, t.src)
		return nil
	}
	if err := t.buf.lane.readBack(dst[:len(t.src)], t.buf.ptr); err != nil {
		return fmt.Errorf("device: reading %d bytes back from GPU %d: %w", len(t.src), t.s.opts.GPU, err)
	}
	return nil
}

// Release hands the device buffer back for a later batch, first waiting for the copy
// to end if it has not (a copy always ends), so that the source memory is free to
// reuse when Release returns. Release is idempotent.
func (t *Transfer) Release() {
	if !t.released.CompareAndSwap(false, true) {
		return
	}
	<-t.done
	if t.buf != nil {
		t.s.free <- t.buf // never blocks: the buffer was not in free
	}
}

// Stats are a stage's counters.
type Stats struct {
	Kind Kind `json:"kind"`
	// Copies and Bytes count the batches handed over and their bytes.
	Copies int64 `json:"copies"`
	Bytes  int64 `json:"bytes"`
	// CopyTime is the device's time copying (between each copy's events); 0 for Host.
	CopyTime time.Duration `json:"copy_ns"`
	// WaitTime is the time consumers spent in Transfer.Wait.
	WaitTime time.Duration `json:"wait_ns"`
	// StallTime is the time Copy waited for a free device buffer: the consumer
	// holding every buffer.
	StallTime time.Duration `json:"stall_ns"`
}

// GBPerSec is the copy rate in GB/s (1e9 bytes): Bytes over CopyTime, 0 without copy
// time (Host).
func (s Stats) GBPerSec() float64 {
	if s.CopyTime <= 0 {
		return 0
	}
	return float64(s.Bytes) / 1e9 / s.CopyTime.Seconds()
}

// Overlap is the share of copy time consumers did not wait for, in [0, 1]: 1 when the
// copies ran entirely while the consumer computed on earlier batches, 0 when it
// waited for each copy from start to end. 1 without copy time.
func (s Stats) Overlap() float64 {
	if s.CopyTime <= 0 {
		return 1
	}
	return min(1, max(0, 1-s.WaitTime.Seconds()/s.CopyTime.Seconds()))
}
