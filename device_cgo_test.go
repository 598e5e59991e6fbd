//go:build linux && cgo

package shardload_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/shardload/shardload"
	"github.com/shardload/shardload/device"
	"github.com/shardload/shardload/shard"
)

// TestLoaderDeviceCUDA runs the loader's device stage against the stand-in driver
// library of the device package's tests: every batch reaches "device" memory intact
// through the double-buffered copies, and closing leaks nothing (the stand-in fails
// its context release otherwise).
func TestLoaderDeviceCUDA(t *testing.T) {
	lib := filepath.Join(t.TempDir(), "libcuda.so.1")
	cc := os.Getenv("CC")
	if cc == "" {
		cc = "gcc"
	}
	if out, err := exec.Command(cc, "-shared", "-fPIC", "-o", lib, "device/testdata/fakecuda.c").CombinedOutput(); err != nil {
		t.Fatalf("building the stand-in driver library: %v: %s", err, out)
	}
	paths, _ := dataset(t, 3, nil, shard.None)
	l, n := readBackEpoch(t, shardload.Config{URLs: paths, BatchSize: 5, Slabs: 4,
		Device: device.Options{Kind: device.CUDA, Library: lib}})
	if l.Device().Kind() != device.CUDA {
		t.Errorf("device %q", l.Device())
	}
	if st := l.DeviceStats(); st.Copies != int64(n) || st.Bytes != l.Stats().BytesOut || n != l.Plan().Batches {
		t.Errorf("device stats %+v after %d batches (plan %d)", st, n, l.Plan().Batches)
	}
	if err := l.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
}
