package shard

import (
	"bytes"
	"errors"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"
)

// TestZstdWindow reads the window that getZstd readies a ring for from frames the
// zstd library writes (streams with windows from 1 MiB to 64 MiB, a single-segment
// frame that declares its content size instead) and from a header as the reference
// tool writes it at its default level (a 2 MiB window), and finds none in what is not
// a frame header.
func TestZstdWindow(t *testing.T) {
	data := bytes.Repeat([]byte("shardload "), 1<<16)
	for _, w := range []int{1 << 20, 2 << 20, 8 << 20, 64 << 20} {
		var buf bytes.Buffer
		zw, err := zstd.NewWriter(&buf, zstd.WithWindowSize(w), zstd.WithEncoderConcurrency(1))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := zw.Write(data); err != nil {
			t.Fatal(err)
		}
		if err := zw.Close(); err != nil {
			t.Fatal(err)
		}
		got, ok := zstdWindow(buf.Bytes()[:zstd.HeaderMaxSize])
		if !ok || got != int64(w) {
			t.Errorf("stream written with a window of %d: zstdWindow = %d, %v", w, got, ok)
		}
	}

	enc, err := zstd.NewWriter(nil, zstd.WithSingleSegment(true))
	if err != nil {
		t.Fatal(err)
	}
	frame := enc.EncodeAll(data[:5000], nil)
	if got, ok := zstdWindow(frame); !ok || got != 5000 {
		t.Errorf("single-segment frame of 5000 bytes: zstdWindow = %d, %v", got, ok)
	}

	// Magic, a descriptor with a checksum and no content size, window descriptor
	// 0x58 (window log 21), then a block header.
	ref := []byte{0x28, 0xb5, 0x2f, 0xfd, 0x04, 0x58, 0x04, 0x00, 0x00}
	if got, ok := zstdWindow(ref); !ok || got != 2<<20 {
		t.Errorf("reference tool's level-3 header: zstdWindow = %d, %v", got, ok)
	}

	for _, b := range [][]byte{nil, {0x28, 0xb5}, []byte("ustar\x00 not a frame"), {0x50, 0x2a, 0x4d, 0x18, 4, 0, 0, 0, 1, 2, 3, 4}} {
		if got, ok := zstdWindow(b); ok {
			t.Errorf("zstdWindow(%q) = %d, true; want false", b, got)
		}
	}
}

// TestRingRoomReadiesAhead checks the accounting of the heap readied for rings: one
// readying serves ringsAhead rings, the next ring readies again, and rings too small
// to matter ready nothing.
func TestRingRoomReadiesAhead(t *testing.T) {
	var r ringRoom
	const ring = 3 << 20
	r.ready(ring)
	if r.left == 0 {
		t.Skip("the heap cannot be advised to use huge pages here (not Linux, or transparent huge pages off)")
	}
	if want := int64((ring + ringExtra) * (ringsAhead - 1)); r.left != want {
		t.Fatalf("after the first ring: %d bytes left, want %d", r.left, want)
	}
	for range ringsAhead - 1 {
		r.ready(ring)
	}
	if r.left != 0 {
		t.Fatalf("after %d rings: %d bytes left, want 0", ringsAhead, r.left)
	}
	r.ready(ring)
	if want := int64((ring + ringExtra) * (ringsAhead - 1)); r.left != want {
		t.Fatalf("after the next ring: %d bytes left, want %d (readied again)", r.left, want)
	}
	r.ready(minReadyRing - 1)
	if want := int64((ring + ringExtra) * (ringsAhead - 1)); r.left != want {
		t.Fatalf("a small ring took room: %d bytes left, want %d", r.left, want)
	}
}

// A zstd decoder a closed Reader leaves idle is the one the next Reader takes,
// garbage collections between them or not (a sync.Pool would have dropped it), and
// idle decoders are kept up to maxIdleZstd bytes of rings, no more.
func TestIdleZstdDecoders(t *testing.T) {
	idleZstd.Lock()
	saved, savedBytes := idleZstd.decs, idleZstd.bytes
	idleZstd.decs, idleZstd.bytes = nil, 0
	idleZstd.Unlock()
	t.Cleanup(func() {
		idleZstd.Lock()
		for _, p := range idleZstd.decs {
			p.Decoder.Close()
		}
		idleZstd.decs, idleZstd.bytes = saved, savedBytes
		idleZstd.Unlock()
	})
	idle := func() []pooledZstd {
		idleZstd.Lock()
		defer idleZstd.Unlock()
		return slices.Clone(idleZstd.decs)
	}

	data := compress(t, Zstd, buildTar(t, member{name: "a.x", data: strings.Repeat("x", 5000)}, member{name: "b.x", data: "2"}))
	read := func() {
		r := NewReader(bytes.NewReader(data), Options{})
		if got := len(readAll(t, r)); got != 2 {
			t.Fatalf("%d samples, want 2", got)
		}
		r.Close()
	}
	read()
	first := idle()
	if len(first) != 1 {
		t.Fatalf("%d decoders idle after one Reader, want 1", len(first))
	}
	runtime.GC()
	runtime.GC()
	read()
	if again := idle(); len(again) != 1 || again[0].Decoder != first[0].Decoder {
		t.Fatalf("after two collections the next Reader used another decoder (idle: %d)", len(again))
	}

	ring := zstdRing(8 << 20)
	for range maxIdleZstd/ring + 3 {
		zr, err := zstd.NewReader(nil, zstd.WithDecoderConcurrency(1))
		if err != nil {
			t.Fatal(err)
		}
		pooledZstd{Decoder: zr, ring: ring}.Close()
	}
	idleZstd.Lock()
	n, held := len(idleZstd.decs), idleZstd.bytes
	idleZstd.Unlock()
	if held > maxIdleZstd || n != 1+int((maxIdleZstd-first[0].ring)/ring) {
		t.Errorf("%d decoders idle holding %d bytes of rings; want at most %d bytes (%d decoders)", n, held, maxIdleZstd, 1+int((maxIdleZstd-first[0].ring)/ring))
	}
}

// An idle zstd decoder is closed once idle for idleZstdFor, its ring no longer
// counted; the younger ones stay, and the sweep says when the next one is due.
func TestIdleZstdSweep(t *testing.T) {
	idleZstd.Lock()
	defer idleZstd.Unlock()
	saved, savedBytes := idleZstd.decs, idleZstd.bytes
	defer func() { idleZstd.decs, idleZstd.bytes = saved, savedBytes }()

	t0 := time.Unix(1_000_000, 0)
	idleZstd.decs, idleZstd.bytes = nil, 0
	for _, since := range []time.Duration{0, 10 * time.Second, 70 * time.Second} {
		zr, err := zstd.NewReader(nil, zstd.WithDecoderConcurrency(1))
		if err != nil {
			t.Fatal(err)
		}
		idleZstd.decs = append(idleZstd.decs, pooledZstd{Decoder: zr, ring: 1 << 20, since: t0.Add(since)})
		idleZstd.bytes += 1 << 20
	}
	all := slices.Clone(idleZstd.decs)
	if next := sweepIdleZstd(t0.Add(59 * time.Second)); next != time.Second || len(idleZstd.decs) != 3 {
		t.Fatalf("59 s on: %d idle, next sweep in %v; want 3, 1s", len(idleZstd.decs), next)
	}
	next := sweepIdleZstd(t0.Add(75 * time.Second))
	if len(idleZstd.decs) != 1 || idleZstd.decs[0].Decoder != all[2].Decoder || idleZstd.bytes != 1<<20 || next != 55*time.Second {
		t.Fatalf("75 s on: %d idle holding %d bytes, next sweep in %v; want the youngest alone, 1 MiB, 55s", len(idleZstd.decs), idleZstd.bytes, next)
	}
	for i, p := range all[:2] {
		if err := p.Reset(bytes.NewReader(nil)); !errors.Is(err, zstd.ErrDecoderClosed) {
			t.Errorf("decoder %d idle past its time: Reset gives %v, want it closed", i, err)
		}
	}
	if next := sweepIdleZstd(t0.Add(130 * time.Second)); next != 0 || len(idleZstd.decs) != 0 || idleZstd.bytes != 0 {
		t.Fatalf("130 s on: %d idle holding %d bytes, next %v; want none", len(idleZstd.decs), idleZstd.bytes, next)
	}
}
