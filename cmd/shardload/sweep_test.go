package main

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"
)

// sweepTar is a small shard: six samples of two or three fields of several sizes. With
// flush set it is gzip-compressed, the compressor flushed after each member, and ends
// lists the compressed length at each flush: cut there, the shard inflates to a tar
// that stops exactly at a member boundary.
func sweepTar(t *testing.T, flush bool) (shard []byte, ends []int) {
	var buf bytes.Buffer
	var zw *gzip.Writer
	var tw *tar.Writer
	if flush {
		zw = gzip.NewWriter(&buf)
		tw = tar.NewWriter(zw)
	} else {
		tw = tar.NewWriter(&buf)
	}
	for i, sizes := range [][]int{{700, 1}, {0, 2}, {512, 3}, {1500, 1}, {40, 2}, {1025, 1}} {
		exts := []string{"jpg", "cls"}
		if i%2 == 0 {
			exts = append(exts, "txt")
			sizes = append(sizes, 30)
		}
		for j, ext := range exts {
			data := bytes.Repeat([]byte{byte('a' + i*3 + j)}, sizes[j])
			if err := tw.WriteHeader(&tar.Header{Name: fmt.Sprintf("s%02d.%s", i, ext), Mode: 0o644, Size: int64(len(data)), Typeflag: tar.TypeReg}); err != nil {
				t.Fatal(err)
			}
			tw.Write(data)
			if flush {
				tw.Flush()
				zw.Flush()
				ends = append(ends, buf.Len())
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if flush {
		zw.Close()
	}
	return buf.Bytes(), ends
}

func sweepCompress(t *testing.T, ext string, data []byte) []byte {
	var buf bytes.Buffer
	var w io.WriteCloser
	switch ext {
	case ".tar":
		return data
	case ".tar.gz":
		w = gzip.NewWriter(&buf)
	default:
		var err error
		if w, err = zstd.NewWriter(&buf); err != nil {
			t.Fatal(err)
		}
	}
	w.Write(data)
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// catMembers lists the members of cat's output (name and data) as far as it parses.
func catMembers(out string) []string {
	var got []string
	tr := tar.NewReader(strings.NewReader(out))
	for {
		h, err := tr.Next()
		if err != nil {
			return got
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			return got
		}
		got = append(got, h.Name+"="+string(data))
	}
}

func isPrefix(a, b []string) bool {
	return len(a) <= len(b) && strings.Join(a, "\n") == strings.Join(b[:len(a)], "\n")
}

// TestCatAndLsOnDamagedShards runs cat and ls over a plain, a gzip and a zstd shard cut
// short at a few points and (compressed) with a byte flipped. A cut shard exits 1 with
// one line naming the shard, having written only complete samples that begin the whole
// shard's output; only a plain tar cut after the first block of its end-of-archive
// marker still reads whole (one zero block is accepted as the marker). A flipped shard
// does the same, or exits 0 with exactly the whole shard's output (a flip in a byte
// that changes nothing inflated). Cut gzip shards
// used to pass cat with exit 0: cut in the trailer with every sample, cut where the
// inflated tar stops at a member boundary with a sample holding only its first field.
func TestCatAndLsOnDamagedShards(t *testing.T) {
	plain, _ := sweepTar(t, false)
	flushed, ends := sweepTar(t, true)
	dir := t.TempDir()
	for _, kind := range []string{".tar", ".tar.gz", ".tar.zst", "flushed.tar.gz"} {
		ext := filepath.Ext(strings.TrimSuffix(kind, filepath.Ext(kind))) + filepath.Ext(kind)
		whole := sweepCompress(t, ext, plain)
		if kind == "flushed.tar.gz" {
			whole = flushed
		}
		path := filepath.Join(dir, "whole"+ext)
		if err := os.WriteFile(path, whole, 0o644); err != nil {
			t.Fatal(err)
		}
		code, catWant, stderr := runCLI(t, "cat", path)
		if code != 0 || len(catMembers(catWant)) != 15 {
			t.Fatalf("cat %s: exit %d, %d members: %s", kind, code, len(catMembers(catWant)), stderr)
		}
		code, lsWant, stderr := runCLI(t, "ls", path)
		lsWant = strings.ReplaceAll(lsWant, path, "SHARD")
		if code != 0 || strings.Count(lsWant, "\n") != 7 {
			t.Fatalf("ls %s: exit %d: %q %s", kind, code, lsWant, stderr)
		}
		n := len(whole)
		type damage struct {
			name string
			data []byte
			flip bool
		}
		var cases []damage
		cuts := []int{0, 100, n / 4, n / 2, 3 * n / 4, n - 1024, n - 513, n - 9, n - 8, n - 4, n - 1}
		if kind == "flushed.tar.gz" {
			cuts = ends
		}
		for _, cut := range cuts {
			if cut >= 0 && cut < n {
				cases = append(cases, damage{fmt.Sprintf("cut at %d of %d", cut, n), whole[:cut], false})
			}
		}
		if ext != ".tar" { // a flip in a plain tar's member data is invisible
			for _, pos := range []int{n / 3, n / 2, n - 12, n - 6, n - 2} {
				bad := bytes.Clone(whole)
				bad[pos] ^= 0x5a
				cases = append(cases, damage{fmt.Sprintf("byte %d of %d flipped", pos, n), bad, true})
			}
		}
		for i, c := range cases {
			p := filepath.Join(dir, fmt.Sprintf("d%d-%d%s", len(kind), i, ext))
			if err := os.WriteFile(p, c.data, 0o644); err != nil {
				t.Fatal(err)
			}
			// A plain tar cut after its first zero block is whole; a flip may hit a
			// byte that changes nothing inflated (checked: the output is the same).
			mayPass := c.flip || ext == ".tar" && len(c.data) >= n-blockSize
			code, out, stderr := runCLI(t, "cat", p)
			switch {
			case code == 0 && !mayPass:
				t.Errorf("cat %s, %s: exit 0 (%d of 15 members)", kind, c.name, len(catMembers(out)))
			case code == 0 && out != catWant:
				t.Errorf("cat %s, %s: exit 0 with other output", kind, c.name)
			case code != 0 && (code != 1 || strings.Count(stderr, "\n") != 1 || !strings.Contains(stderr, "shardload cat: "+p)):
				t.Errorf("cat %s, %s: exit %d, stderr %q", kind, c.name, code, stderr)
			case code != 0 && !isPrefix(catMembers(out), catMembers(catWant)):
				t.Errorf("cat %s, %s: wrote members that do not begin the shard's", kind, c.name)
			}
			code, out, stderr = runCLI(t, "ls", p)
			out = strings.ReplaceAll(out, p, "SHARD")
			lines, wantLines := strings.SplitAfter(out, "\n"), strings.SplitAfter(lsWant, "\n")
			switch {
			case code == 0 && !mayPass:
				t.Errorf("ls %s, %s: exit 0: %q", kind, c.name, out)
			case code == 0 && out != lsWant:
				t.Errorf("ls %s, %s: exit 0 with other output %q", kind, c.name, out)
			case code != 0 && (code != 1 || strings.Count(stderr, "\n") != 1 || !strings.Contains(stderr, "shardload ls: "+p)):
				t.Errorf("ls %s, %s: exit %d, stderr %q", kind, c.name, code, stderr)
			case code != 0 && !isPrefix(lines[:len(lines)-1], wantLines):
				t.Errorf("ls %s, %s: listed %q, which does not begin the shard's listing", kind, c.name, out)
			}
		}
	}
}

// blockSize is tar's block size.
const blockSize = 512
