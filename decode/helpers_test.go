package decode

import (
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/shardload/shardload/internal/testutil"
)

// lhotseShard is a real Lhotse Shar shard (see ../testdata/README.md): two samples,
// each a float32 .npy feature matrix and a .json manifest.
const lhotseShard = "../testdata/lhotse__features.000000.tar"

// readTar returns the regular members of a tar file, in order, as name -> bytes and
// the list of names.
func readTar(tb testing.TB, path string) (map[string][]byte, []string) {
	return testutil.ReadTar(tb, path)
}

// lhotseNPYs returns the .npy members of the Lhotse shard, by member name.
func lhotseNPYs(tb testing.TB) map[string][]byte {
	tb.Helper()
	all, _ := readTar(tb, lhotseShard)
	out := map[string][]byte{}
	for name, b := range all {
		if strings.HasSuffix(name, ".npy") {
			out[name] = b
		}
	}
	if len(out) != 2 {
		tb.Fatalf("%s: %d .npy members, want 2", lhotseShard, len(out))
	}
	return out
}

// wrapHeader frames a header dict as numpy's _wrap_header does for a version.
func wrapHeader(major byte, header string) []byte { return testutil.NPYHeader(major, header) }

// npyFile builds a .npy file as numpy would write it.
func npyFile(major byte, descr string, fortran bool, shape []int, data []byte) []byte {
	return testutil.NPY(major, descr, fortran, shape, data)
}

// rawNPY builds a .npy file around an arbitrary header dict text (version 1.0).
func rawNPY(header string, data []byte) []byte {
	return append(wrapHeader(1, header), data...)
}

// seq returns n bytes 0, 1, 2, ...
func seq(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i * 7)
	}
	return b
}

// wantErr checks that err matches target and that its message contains each of subs.
func wantErr(t *testing.T, err, target error, subs ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("got no error, want %v", target)
	}
	if target != nil && !errors.Is(err, target) {
		t.Fatalf("error %q does not match %v", err, target)
	}
	for _, s := range subs {
		if !strings.Contains(err.Error(), s) {
			t.Fatalf("error %q does not contain %q", err, s)
		}
	}
}

// ciRequiresTurbo reports whether libjpeg-turbo must load: in CI, where
// scripts/deps.sh installs it and the binary is built with cgo.
func ciRequiresTurbo() bool { return os.Getenv("CI") == "true" && cgoEnabled }

// tarprocShard is a real shard of 90 PNG images and labels (see testdata/README.md).
const tarprocShard = "../testdata/tarproc__sample.tar"

// tarprocSamples returns the PNG members of the tarproc shard, in shard order.
func tarprocSamples(tb testing.TB) [][]byte {
	tb.Helper()
	all, names := readTar(tb, tarprocShard)
	var out [][]byte
	for _, n := range names {
		if strings.HasSuffix(n, ".png") {
			out = append(out, all[n])
		}
	}
	if len(out) != 90 {
		tb.Fatalf("%s: %d PNG members, want 90", tarprocShard, len(out))
	}
	return out
}
