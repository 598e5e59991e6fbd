//go:build linux && cgo

package device

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"golang.org/x/sys/unix"
)

var (
	fakeOnce sync.Once
	fakePath string
	fakeErr  error
)

// fakeLibrary builds testdata/fakecuda.c into a shared library once per test run.
// The C compiler is part of a cgo build, so its absence fails the test.
func fakeLibrary(t *testing.T) string {
	t.Helper()
	fakeOnce.Do(func() {
		dir, err := os.MkdirTemp("", "fakecuda")
		if err != nil {
			fakeErr = err
			return
		}
		cc := os.Getenv("CC")
		if cc == "" {
			cc = "gcc"
		}
		fakePath = filepath.Join(dir, "libcuda.so.1")
		out, err := exec.Command(cc, "-shared", "-fPIC", "-Wall", "-Werror", "-o", fakePath, "testdata/fakecuda.c").CombinedOutput()
		if err != nil {
			fakeErr = errors.New(cc + ": " + err.Error() + ": " + string(out))
		}
	})
	if fakeErr != nil {
		t.Fatalf("building the stand-in driver library: %v", fakeErr)
	}
	return fakePath
}

// pinnedLike maps n bytes outside the Go heap, as slabs are.
func pinnedLike(t *testing.T, n int) []byte {
	t.Helper()
	m, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Munmap(m) })
	return m
}

func openFake(t *testing.T, o Options) *Stage {
	t.Helper()
	o.Kind = CUDA
	o.Library = fakeLibrary(t)
	s, err := Open(o)
	if err != nil {
		t.Fatalf("Open(%+v): %v", o, err)
	}
	return s
}

func TestCUDADoubleBuffering(t *testing.T) {
	const size = 1 << 20
	s := openFake(t, Options{BufferBytes: size})
	if s.Kind() != CUDA || s.PCIBusID() != "00000000:3B:00.0" || !strings.Contains(s.String(), "Fake GPU 0") || !strings.Contains(s.String(), "2 device buffers") {
		t.Errorf("kind %q, PCI %q, %q", s.Kind(), s.PCIBusID(), s)
	}
	ctx := context.Background()
	slabs := [][]byte{pinnedLike(t, size), pinnedLike(t, size), pinnedLike(t, size)}
	for i, m := range slabs {
		for j := range m {
			m[j] = byte(i + 1)
		}
		if err := s.Register(m); err != nil {
			t.Fatal(err)
		}
		if err := s.Register(m); err != nil {
			t.Fatalf("registering again: %v", err)
		}
	}
	a, err := s.Copy(ctx, slabs[0])
	if err != nil {
		t.Fatal(err)
	}
	b, err := s.Copy(ctx, slabs[1][:size/2])
	if err != nil {
		t.Fatal(err)
	}
	if a.Ptr() == b.Ptr() || a.Ptr() == 0 {
		t.Errorf("two transfers in flight share device buffer %#x", a.Ptr())
	}
	// Both buffers are held: a third copy must wait. A done context shows it
	// waits rather than taking a buffer in use.
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if tr, err := s.Copy(cancelled, slabs[2]); !errors.Is(err, context.Canceled) {
		t.Fatalf("third Copy with both buffers held = %v, %v; want it to wait", tr, err)
	}
	// Releasing batch N frees its buffer for batch N+2 while N+1 is still held.
	for _, tr := range []*Transfer{a, b} {
		if err := tr.Wait(ctx); err != nil {
			t.Fatal(err)
		}
	}
	aPtr := a.Ptr()
	a.Release()
	c, err := s.Copy(ctx, slabs[2])
	if err != nil {
		t.Fatal(err)
	}
	if c.Ptr() != aPtr {
		t.Errorf("third copy went to %#x, want the released buffer %#x", c.Ptr(), aPtr)
	}
	for i, tr := range []*Transfer{b, c} {
		got := make([]byte, tr.Len())
		if err := tr.ReadBack(ctx, got); err != nil {
			t.Fatal(err)
		}
		want := []*[]byte{&slabs[1], &slabs[2]}[i]
		if !bytes.Equal(got, (*want)[:tr.Len()]) {
			t.Errorf("transfer %d: device bytes differ from the slab's", i)
		}
		if tr.CopyTime() < 0 {
			t.Errorf("negative copy time %v", tr.CopyTime())
		}
		tr.Release()
	}
	st := s.Stats()
	if st.Kind != CUDA || st.Copies != 3 || st.Bytes != size+size/2+size || st.Overlap() < 0 || st.Overlap() > 1 {
		t.Errorf("Stats = %+v", st)
	}
	if _, err := s.Copy(ctx, make([]byte, size+1)); !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), "1048577 bytes") {
		t.Errorf("Copy of a batch larger than a buffer: %v", err)
	}
	// The stand-in driver fails Close if a buffer, stream, event or registration leaked.
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if _, err := s.Copy(ctx, slabs[0]); !errors.Is(err, ErrClosed) {
		t.Errorf("Copy after Close: %v", err)
	}
	if err := s.Register(pinnedLike(t, 4096)); !errors.Is(err, ErrClosed) {
		t.Errorf("Register after Close: %v", err)
	}
}

// TestCUDAPipeline runs a producer and a consumer as a loader and a trainer do, under
// the race detector: every batch reaches the device intact and is counted.
func TestCUDAPipeline(t *testing.T) {
	const size, batches = 64 << 10, 40
	s := openFake(t, Options{BufferBytes: size, Buffers: 3})
	ring := make([][]byte, 4)
	free := make(chan int, len(ring))
	for i := range ring {
		ring[i] = pinnedLike(t, size)
		if err := s.Register(ring[i]); err != nil {
			t.Fatal(err)
		}
		free <- i
	}
	ctx := context.Background()
	type msg struct {
		slab, n int
		tr      *Transfer
	}
	out := make(chan msg, len(ring))
	go func() {
		defer close(out)
		for i := range batches {
			slab := <-free
			n := size - i*100
			for j := range n {
				ring[slab][j] = byte(i ^ j)
			}
			tr, err := s.Copy(ctx, ring[slab][:n])
			if err != nil {
				t.Error(err)
				return
			}
			out <- msg{slab, n, tr}
		}
	}()
	var total int64
	got := make([]byte, size)
	i := 0
	for m := range out {
		if err := m.tr.Wait(ctx); err != nil {
			t.Fatal(err)
		}
		if err := m.tr.ReadBack(ctx, got); err != nil {
			t.Fatal(err)
		}
		for j := range m.n {
			if got[j] != byte(i^j) {
				t.Fatalf("batch %d byte %d on the device is %d, want %d", i, j, got[j], byte(i^j))
			}
		}
		total += int64(m.n)
		m.tr.Release()
		free <- m.slab
		i++
	}
	if i != batches {
		t.Fatalf("%d batches arrived, want %d", i, batches)
	}
	if st := s.Stats(); st.Copies != batches || st.Bytes != total {
		t.Errorf("Stats = %+v, want %d copies of %d bytes", st, batches, total)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestCUDAOpenErrors(t *testing.T) {
	lib := fakeLibrary(t)
	t.Setenv("FAKECUDA_DEVICES", "0")
	_, err := Open(Options{Kind: CUDA, Library: lib})
	if !errors.Is(err, ErrNoDriver) || !strings.Contains(err.Error(), "cuInit: CUDA_ERROR_NO_DEVICE (no CUDA-capable device is detected, code 100)") {
		t.Errorf("no device: %v", err)
	}
	s, err := Open(Options{Kind: Auto, Library: lib, Logf: func(string, ...any) {}})
	if err != nil || s.Kind() != Host {
		t.Errorf("auto with no device: %v, %v", s, err)
	}
	t.Setenv("FAKECUDA_DEVICES", "2")
	if _, err := Open(Options{Kind: CUDA, Library: lib, GPU: 2}); !errors.Is(err, ErrNoDriver) || !strings.Contains(err.Error(), "GPU 2 asked for, the driver") {
		t.Errorf("GPU 2 of 2: %v", err)
	}
	s = openFake(t, Options{GPU: 1, BufferBytes: 4096})
	if s.PCIBusID() != "00000000:3C:00.0" {
		t.Errorf("GPU 1 at %q", s.PCIBusID())
	}
	checkCopies(t, s, 4096)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	// The stand-in refuses allocations over 1 GiB, as a GPU without the memory does.
	_, err = Open(Options{Kind: CUDA, Library: lib, BufferBytes: 2 << 30})
	if !errors.Is(err, ErrCUDA) || !strings.Contains(err.Error(), "CUDA_ERROR_OUT_OF_MEMORY") || !strings.Contains(err.Error(), "2147483648") {
		t.Errorf("allocation too large: %v", err)
	}
	// A library that is not a CUDA driver lacks its functions.
	libc := "libc.so.6"
	if _, err := Open(Options{Kind: CUDA, Library: libc}); !errors.Is(err, ErrNoDriver) || !strings.Contains(err.Error(), "cuInit") {
		t.Errorf("libc as the driver: %v", err)
	}
}
