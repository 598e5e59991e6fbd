package shardload_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"unsafe"

	"github.com/shardload/shardload"
	"github.com/shardload/shardload/device"
	"github.com/shardload/shardload/shard"
)

// readBackEpoch runs an epoch with cfg and checks that every batch's transfer holds
// exactly the slab's used bytes, returning the batch count.
func readBackEpoch(t *testing.T, cfg shardload.Config) (*shardload.Loader, int) {
	t.Helper()
	ctx := context.Background()
	l, err := shardload.Open(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for b, err := range l.All(ctx) {
		if err != nil {
			t.Fatal(err)
		}
		tr := b.Transfer()
		if tr == nil {
			t.Fatal("batch without a transfer")
		}
		if err := tr.Wait(ctx); err != nil {
			t.Fatal(err)
		}
		if int64(tr.Len()) != b.Used {
			t.Fatalf("batch %d: transfer of %d bytes, batch uses %d", b.Seq, tr.Len(), b.Used)
		}
		got := make([]byte, tr.Len())
		if err := tr.ReadBack(ctx, got); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, b.Data()[:b.Used]) {
			t.Fatalf("batch %d: device bytes differ from the slab's", b.Seq)
		}
		n++
	}
	return l, n
}

func TestLoaderDeviceHost(t *testing.T) {
	paths, _ := dataset(t, 3, nil, shard.None)
	ctx := context.Background()
	l, err := shardload.Open(ctx, shardload.Config{URLs: paths, BatchSize: 8})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if l.Device().Kind() != device.Host {
		t.Errorf("default device %q, want host", l.Device().Kind())
	}
	n := 0
	for b, err := range l.All(ctx) {
		if err != nil {
			t.Fatal(err)
		}
		// The host backend leaves the batch in its slab.
		if p := b.Transfer().Ptr(); p != uintptr(unsafe.Pointer(&b.Data()[0])) {
			t.Fatalf("batch %d: host transfer at %#x, slab at %p", b.Seq, p, &b.Data()[0])
		}
		n++
	}
	st, dst := l.Stats(), l.DeviceStats()
	if dst.Kind != device.Host || dst.Copies != int64(n) || dst.Bytes != st.BytesOut || n == 0 {
		t.Errorf("device stats %+v after %d batches of %d bytes", dst, n, st.BytesOut)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	l2, n2 := readBackEpoch(t, shardload.Config{URLs: paths, BatchSize: 8})
	if n2 != n {
		t.Errorf("%d batches, then %d", n, n2)
	}
	l2.Close()
}

func TestLoaderDeviceNoDriver(t *testing.T) {
	paths, _ := dataset(t, 1, nil, shard.None)
	_, err := shardload.Open(context.Background(), shardload.Config{URLs: paths,
		Device: device.Options{Kind: device.CUDA, Library: "/nonexistent/libcuda.so.1"}})
	if !errors.Is(err, device.ErrNoDriver) {
		t.Fatalf("Open with --device cuda and no driver: %v, want ErrNoDriver", err)
	}
	var said []string
	l, n := readBackEpoch(t, shardload.Config{URLs: paths, BatchSize: 4,
		Device: device.Options{Kind: device.Auto, Library: "/nonexistent/libcuda.so.1"},
		Logf: func(f string, a ...any) {
			if strings.Contains(f, "host memory") {
				said = append(said, f)
			}
		}})
	defer l.Close()
	if l.Device().Kind() != device.Host || n == 0 || len(said) != 1 {
		t.Errorf("auto without a driver: kind %q, %d batches, said %q", l.Device().Kind(), n, said)
	}
}
