package device

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
	"unsafe"
)

func TestParseKind(t *testing.T) {
	for _, s := range []string{"host", "cuda", "auto"} {
		if k, err := ParseKind(s); err != nil || string(k) != s {
			t.Errorf("ParseKind(%q) = %q, %v", s, k, err)
		}
	}
	for _, s := range []string{"", "gpu", "CUDA"} {
		if _, err := ParseKind(s); err == nil || !strings.Contains(err.Error(), "host, cuda or auto") {
			t.Errorf("ParseKind(%q): %v", s, err)
		}
	}
}

func TestOptionsInvalid(t *testing.T) {
	for _, o := range []Options{{Kind: "tpu"}, {GPU: -1}, {Buffers: -1}, {BufferBytes: -1}} {
		if s, err := Open(o); err == nil {
			s.Close()
			t.Errorf("Open(%+v) succeeded", o)
		}
	}
}

func TestHost(t *testing.T) {
	s, err := Open(Options{})
	if err != nil {
		t.Fatal(err)
	}
	if s.Kind() != Host || s.PCIBusID() != "" || !strings.HasPrefix(s.String(), "host") {
		t.Errorf("zero Options: kind %q, PCI %q, %q", s.Kind(), s.PCIBusID(), s)
	}
	ctx := context.Background()
	var held []*Transfer
	var total int64
	// Host holds no device buffers: any number of transfers may be outstanding.
	for i := range 5 {
		src := bytes.Repeat([]byte{byte(i)}, 100+i)
		if err := s.Register(src); err != nil {
			t.Fatal(err)
		}
		tr, err := s.Copy(ctx, src)
		if err != nil {
			t.Fatal(err)
		}
		select {
		case <-tr.Done():
		default:
			t.Fatal("host transfer not done at once")
		}
		if tr.Ptr() != uintptr(unsafe.Pointer(&src[0])) || tr.Len() != len(src) || tr.CopyTime() != 0 {
			t.Errorf("transfer %d: Ptr %#x (src at %p), Len %d, CopyTime %v", i, tr.Ptr(), &src[0], tr.Len(), tr.CopyTime())
		}
		got := make([]byte, len(src))
		if err := tr.ReadBack(ctx, got); err != nil || !bytes.Equal(got, src) {
			t.Errorf("ReadBack: %v, equal %v", err, bytes.Equal(got, src))
		}
		total += int64(len(src))
		held = append(held, tr)
	}
	for _, tr := range held {
		tr.Release()
		tr.Release()
		if err := tr.ReadBack(ctx, make([]byte, tr.Len())); err == nil {
			t.Error("ReadBack after Release succeeded")
		}
	}
	st := s.Stats()
	if st.Kind != Host || st.Copies != 5 || st.Bytes != total || st.CopyTime != 0 || st.GBPerSec() != 0 || st.Overlap() != 1 {
		t.Errorf("Stats = %+v (%.2f GB/s, overlap %.2f)", st, st.GBPerSec(), st.Overlap())
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if _, err := s.Copy(ctx, []byte("x")); !errors.Is(err, ErrClosed) {
		t.Errorf("Copy after Close: %v", err)
	}
}

func TestStatsRates(t *testing.T) {
	tests := []struct {
		st      Stats
		gbps    float64
		overlap float64
	}{
		{Stats{Bytes: 2e9, CopyTime: time.Second}, 2, 1},
		{Stats{Bytes: 1e9, CopyTime: 4 * time.Second, WaitTime: time.Second}, 0.25, 0.75},
		{Stats{Bytes: 1e9, CopyTime: time.Second, WaitTime: 3 * time.Second}, 1, 0},
		{Stats{Bytes: 1e9}, 0, 1},
	}
	for _, tt := range tests {
		if g, o := tt.st.GBPerSec(), tt.st.Overlap(); g != tt.gbps || o != tt.overlap {
			t.Errorf("%+v: %g GB/s, overlap %g; want %g, %g", tt.st, g, o, tt.gbps, tt.overlap)
		}
	}
}

// TestNoDriver is the path of every machine without a GPU: cuda fails naming the
// library and the way out, auto falls back to host and says so once.
func TestNoDriver(t *testing.T) {
	lib := "/nonexistent/libcuda.so.1"
	_, err := Open(Options{Kind: CUDA, Library: lib})
	if !errors.Is(err, ErrNoDriver) || !strings.Contains(err.Error(), lib) || !strings.Contains(err.Error(), "--device host") {
		t.Errorf("Open(cuda, %s): %v; want ErrNoDriver naming the library and what to do", lib, err)
	}
	var lines []string
	s, err := Open(Options{Kind: Auto, Library: lib, Logf: func(f string, a ...any) { lines = append(lines, fmt.Sprintf(f, a...)) }})
	if err != nil {
		t.Fatalf("Open(auto) without a driver: %v", err)
	}
	defer s.Close()
	if s.Kind() != Host {
		t.Errorf("auto without a driver is %q, want host", s.Kind())
	}
	if len(lines) != 1 || !strings.Contains(lines[0], "using host memory") {
		t.Errorf("auto's fallback said %q, want one line", lines)
	}
}

// TestDefaultLibrary opens the real driver by its default name: on a machine without
// one that is ErrNoDriver; with one, a working stage.
func TestDefaultLibrary(t *testing.T) {
	s, err := Open(Options{Kind: CUDA, BufferBytes: 1 << 20})
	if err != nil {
		if !errors.Is(err, ErrNoDriver) {
			t.Fatalf("Open(cuda) = %v, want success or ErrNoDriver", err)
		}
		return
	}
	defer s.Close()
	checkCopies(t, s, 1<<20)
}

// checkCopies copies patterned batches through s, reading each back.
func checkCopies(t *testing.T, s *Stage, size int) {
	t.Helper()
	ctx := context.Background()
	src := make([]byte, size)
	for i := range 4 {
		for j := range src {
			src[j] = byte(i*31 + j)
		}
		tr, err := s.Copy(ctx, src)
		if err != nil {
			t.Fatal(err)
		}
		got := make([]byte, len(src))
		if err := tr.ReadBack(ctx, got); err != nil || !bytes.Equal(got, src) {
			t.Fatalf("batch %d: ReadBack %v, equal %v", i, err, bytes.Equal(got, src))
		}
		tr.Release()
	}
}
