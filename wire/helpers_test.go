package wire

import (
	"bytes"
	stdgzip "compress/gzip"
	"errors"
	"strings"
	"testing"

	"github.com/shardload/shardload/decode"
	"github.com/shardload/shardload/internal/testutil"
)

// lhotseNPYs returns the .npy members of the real Lhotse Shar shard (see
// ../testdata/README.md), by member name.
func lhotseNPYs(tb testing.TB) map[string][]byte {
	tb.Helper()
	all, _ := testutil.ReadTar(tb, "../testdata/lhotse__features.000000.tar")
	out := map[string][]byte{}
	for name, b := range all {
		if strings.HasSuffix(name, ".npy") {
			out[name] = b
		}
	}
	if len(out) != 2 {
		tb.Fatalf("%d .npy members, want 2", len(out))
	}
	return out
}

func npyFile(major byte, descr string, fortran bool, shape []int, data []byte) []byte {
	return testutil.NPY(major, descr, fortran, shape, data)
}

// seq returns n bytes 0, 7, 14, ...
func seq(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i * 7)
	}
	return b
}

// gz compresses b with the standard library's gzip writer.
func gz(tb testing.TB, b []byte, hdr stdgzip.Header) []byte {
	tb.Helper()
	var out bytes.Buffer
	w, err := stdgzip.NewWriterLevel(&out, stdgzip.BestCompression)
	if err != nil {
		tb.Fatal(err)
	}
	w.Header = hdr
	w.Write(b)
	if err := w.Close(); err != nil {
		tb.Fatal(err)
	}
	return out.Bytes()
}

func mustField(tb testing.TB, spec string) decode.Field {
	tb.Helper()
	f, err := decode.ParseField(spec)
	if err != nil {
		tb.Fatal(err)
	}
	return f
}

// wantErr checks that err matches target and that its message contains each of subs.
func wantErr(t *testing.T, err, target error, subs ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("got no error, want %v", target)
	}
	if target != nil && !errors.Is(err, target) {
		t.Fatalf("error %v does not match %v", err, target)
	}
	for _, s := range subs {
		if !strings.Contains(err.Error(), s) {
			t.Fatalf("error %q does not contain %q", err, s)
		}
	}
}
