package shardload_test

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"

	"github.com/shardload/shardload"
	"github.com/shardload/shardload/decode"
	"github.com/shardload/shardload/shard"
)

// sweepSamples are the samples of the damaged-shard sweep: key -> ext -> data.
func sweepSamples() ([]string, map[string]map[string][]byte) {
	keys := []string{}
	want := map[string]map[string][]byte{}
	for i, sizes := range [][2]int{{700, 1}, {0, 2}, {512, 3}, {1500, 1}, {40, 2}, {1025, 1}} {
		key := fmt.Sprintf("s%02d", i)
		keys = append(keys, key)
		want[key] = map[string][]byte{
			"jpg": bytes.Repeat([]byte{byte('a' + i)}, sizes[0]),
			"bin": bytes.Repeat([]byte{byte('A' + i)}, sizes[1]),
		}
	}
	return keys, want
}

func sweepShardBytes(t *testing.T, comp string) []byte {
	keys, want := sweepSamples()
	var plain bytes.Buffer
	tw := tar.NewWriter(&plain)
	for _, k := range keys {
		for _, ext := range []string{"jpg", "bin"} {
			data := want[k][ext]
			if err := tw.WriteHeader(&tar.Header{Name: k + "." + ext, Mode: 0o644, Size: int64(len(data)), Typeflag: tar.TypeReg}); err != nil {
				t.Fatal(err)
			}
			tw.Write(data)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	var w io.WriteCloser
	switch comp {
	case "gzip":
		w = gzip.NewWriter(&buf)
	case "zstd":
		var err error
		if w, err = zstd.NewWriter(&buf); err != nil {
			t.Fatal(err)
		}
	default:
		return plain.Bytes()
	}
	w.Write(plain.Bytes())
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// sweepEpoch runs one epoch with the Fail policy and returns the keys delivered, each
// batch's rows checked against the samples' bytes, and the error the epoch ended with
// (nil at a clean end, also for a failed Open).
func sweepEpoch(t *testing.T, cfg shardload.Config) ([]string, error) {
	ctx := context.Background()
	_, want := sweepSamples()
	l, err := shardload.Open(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer l.Close()
	var keys []string
	for b, err := range l.All(ctx) {
		if err != nil {
			return keys, err
		}
		for _, f := range cfg.Fields {
			col, ok := b.Column(f.ColumnName())
			if !ok {
				t.Fatalf("no column %q", f.ColumnName())
			}
			for row, key := range b.Keys() {
				if got := col.Row(b.Data(), row); want[key] == nil || !bytes.Equal(got, want[key][f.Ext]) {
					t.Fatalf("sample %q field %s: %d bytes that are not the sample's", key, f.Ext, len(got))
				}
			}
		}
		keys = append(keys, b.Keys()...)
		b.Release()
	}
	return keys, nil
}

// TestLoaderOnDamagedShards opens a plain, a gzip and a zstd shard cut short at a few
// points and (compressed) with a byte flipped, with the Fail policy: counting the
// shard (Config.URLs) or reading it with its count given (Config.Shards). A cut shard
// fails the epoch (a cut gzip trailer used to pass); a flipped one fails it or, where
// the flip changes nothing inflated, delivers every sample with its own bytes. No
// epoch ends cleanly short of samples or with other bytes.
func TestLoaderOnDamagedShards(t *testing.T) {
	keys, _ := sweepSamples()
	fields := []decode.Field{}
	for _, spec := range []string{"jpg", "bin"} {
		f, err := decode.ParseField(spec)
		if err != nil {
			t.Fatal(err)
		}
		fields = append(fields, f)
	}
	dir := t.TempDir()
	for _, comp := range []string{"none", "gzip", "zstd"} {
		whole := sweepShardBytes(t, comp)
		n := len(whole)
		damaged := map[string][]byte{"whole": whole}
		for _, cut := range []int{0, n / 3, n / 2, n - 1030, n - 9, n - 4, n - 1} {
			if cut >= 0 && (comp != "none" || cut < n-512) { // a plain tar reads whole after its first zero block
				damaged[fmt.Sprintf("cut at %d of %d", cut, n)] = whole[:cut]
			}
		}
		if comp != "none" {
			for _, pos := range []int{n / 2, n - 6} {
				bad := bytes.Clone(whole)
				bad[pos] ^= 0x5a
				damaged[fmt.Sprintf("byte %d of %d flipped", pos, n)] = bad
			}
		}
		i := 0
		for name, data := range damaged {
			i++
			path := filepath.Join(dir, fmt.Sprintf("%s-%d.tar", comp, i))
			if err := os.WriteFile(path, data, 0o644); err != nil {
				t.Fatal(err)
			}
			for _, counted := range []bool{true, false} {
				cfg := shardload.Config{URLs: []string{path}, Fields: fields, BatchSize: 2, NoShuffle: true, OnError: shardload.Fail, Slabs: 2, SlabBytes: 1 << 20}
				if !counted {
					cfg.URLs, cfg.Shards = nil, []shard.Info{{URL: path, Samples: len(keys)}}
				}
				got, err := sweepEpoch(t, cfg)
				switch {
				case name == "whole" && (err != nil || strings.Join(got, " ") != strings.Join(keys, " ")):
					t.Errorf("%s whole shard (counted %v): %q, %v", comp, counted, got, err)
				case err == nil && strings.HasPrefix(name, "cut"):
					t.Errorf("%s %s (counted %v): epoch ended cleanly with samples %q", comp, name, counted, got)
				case err == nil && strings.Join(got, " ") != strings.Join(keys, " "):
					t.Errorf("%s %s (counted %v): epoch ended cleanly with samples %q", comp, name, counted, got)
				case err != nil && !strings.Contains(err.Error(), path):
					t.Errorf("%s %s (counted %v): error %q does not name the shard", comp, name, counted, err)
				}
			}
		}
	}
}
