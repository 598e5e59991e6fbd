package main

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shardload/shardload"
	"github.com/shardload/shardload/index"
	"github.com/shardload/shardload/internal/shardgen"
	"github.com/shardload/shardload/internal/testutil"
	"github.com/shardload/shardload/shard"
	"github.com/shardload/shardload/source"
	"github.com/shardload/shardload/source/s3"
)

// indexDataset writes shards of uneven sizes into dir: uncompressed ones named
// "plain-*.tar" and gzip ones "gz-*.tar.gz". It returns their paths.
func indexDataset(t *testing.T, dir string) []string {
	t.Helper()
	small := []shardgen.Field{{Ext: "jpg", Kind: shardgen.Random, MinBytes: 100, MaxBytes: 3000}, {Ext: "cls", Kind: shardgen.Class}}
	plain, err := shardgen.Generate(dir, shardgen.Spec{Shards: 3, Samples: []int{7, 20, 1}, Fields: small, Prefix: "plain"})
	if err != nil {
		t.Fatal(err)
	}
	gz, err := shardgen.Generate(dir, shardgen.Spec{Shards: 2, SamplesPerShard: 5, Fields: small, Prefix: "gz", Compression: shard.Gzip, Seed: 2})
	if err != nil {
		t.Fatal(err)
	}
	return append(plain, gz...)
}

// readerOffsets returns the samples' offsets as shard.Reader reports them.
func readerOffsets(t *testing.T, path string) []int64 {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	r := shard.NewReader(f, shard.Options{URL: path, SizesOnly: true})
	defer r.Close()
	var offs []int64
	for {
		s, err := r.Next()
		if err == io.EOF {
			return offs
		}
		if err != nil {
			t.Fatal(err)
		}
		offs = append(offs, s.Offset)
	}
}

// checkIndex checks that infos are the entries of paths, in order.
func checkIndex(t *testing.T, infos []shard.Info, paths []string) {
	t.Helper()
	if len(infos) != len(paths) {
		t.Fatalf("index has %d shards; want %d", len(infos), len(paths))
	}
	for i, p := range paths {
		info := infos[i]
		st, err := (&source.File{}).Stat(t.Context(), p)
		if err != nil {
			t.Fatal(err)
		}
		offs := readerOffsets(t, p)
		if source.Scheme(p) == "file" {
			p = source.Canonical(p) // local shards are written under one spelling
		}
		if info.URL != p || info.Samples != len(offs) || info.Version != st.Version || info.Size != st.Size {
			t.Errorf("entry %d = {%s %d samples, version %q, size %d}; want {%s %d samples, version %q, size %d}",
				i, info.URL, info.Samples, info.Version, info.Size, p, len(offs), st.Version, st.Size)
		}
		if strings.HasSuffix(p, ".gz") {
			if info.Offsets != nil {
				t.Errorf("%s: offsets %v for a compressed shard; want none", p, info.Offsets)
			}
			continue
		}
		if !slices.Equal(info.Offsets, offs) {
			t.Errorf("%s: offsets %v; shard.Reader reports %v", p, info.Offsets, offs)
		}
	}
	for i, p := range paths {
		checkMembers(t, infos[i], p)
	}
}

// checkMembers checks that info has the members shard.Reader gives of the shard at
// path: every member of every sample, of its size.
func checkMembers(t *testing.T, info shard.Info, path string) {
	t.Helper()
	m := info.Members
	if m == nil {
		t.Errorf("%s: no members", path)
		return
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	r := shard.NewReader(f, shard.Options{URL: path, SizesOnly: true})
	defer r.Close()
	n := 0
	for ; ; n++ {
		s, err := r.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		members := 0
		for _, ext := range m.Exts() {
			if _, ok := m.Size(n, ext); ok {
				members++
			}
		}
		if members != len(s.Fields) {
			t.Errorf("%s sample %d: %d members in the index; shard.Reader gives %d", path, n, members, len(s.Fields))
		}
		for _, f := range s.Fields {
			if size, ok := m.Size(n, f.Ext); !ok || size != f.Size {
				t.Errorf("%s sample %d: %s of %d bytes (%v) in the index; shard.Reader gives %d", path, n, f.Ext, size, ok, f.Size)
			}
		}
	}
	if m.Samples() != n {
		t.Errorf("%s: members of %d samples; shard.Reader gives %d", path, m.Samples(), n)
	}
}

// npyArray is a 1-D .npy of n elements of descr, size bytes each, as numpy.save
// writes it.
func npyArray(descr string, n, size int) []byte {
	dict := fmt.Sprintf("{'descr': '%s', 'fortran_order': False, 'shape': (%d,), }", descr, n)
	hlen := len(dict) + 1
	hlen += (64 - (10+hlen)%64) % 64
	b := append([]byte("\x93NUMPY"), 1, 0, byte(hlen), byte(hlen>>8))
	b = append(b, dict...)
	b = append(b, bytes.Repeat([]byte(" "), hlen-len(dict)-1)...)
	b = append(b, '\n')
	return append(b, make([]byte, n*size)...)
}

// The index of the real shards of other projects (../../testdata/README.md) holds
// every member of every sample at the size shard.Reader gives, compressed shards
// included; that of a shard of token arrays their element types and counts, and
// Lhotse's 2-D feature arrays none. --no-sizes writes a version-1 index without.
func TestIndexMembers(t *testing.T) {
	t.Setenv(index.StoreDirEnv, t.TempDir())
	var paths []string
	for _, name := range []string{"aistore__small-mnist-3.tar", "lhotse__features.000000.tar", "pytorch-data__wds.tar", "tarproc__sample.tar", "webdataset__sample.tgz", "webdataset__testgz.tar"} {
		paths = append(paths, filepath.Join("..", "..", "testdata", name))
	}
	tokens := filepath.Join(t.TempDir(), "tokens.tar")
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for i, m := range []struct {
		name string
		data []byte
	}{
		{"doc/0.tokens.npy", npyArray("<u2", 1000, 2)}, {"doc/0.mask.npy", npyArray("<i4", 3, 4)},
		{"doc/1.tokens.npy", npyArray("<u2", 17, 2)}, {"doc/1.mask.npy", npyArray("<i4", 0, 4)},
		{"doc/2.tokens.npy", npyArray("<u2", 70_000, 2)}, {"doc/2.json", []byte("{}")},
	} {
		if err := tw.WriteHeader(&tar.Header{Name: m.name, Mode: 0o644, Size: int64(len(m.data)), ModTime: time.Unix(int64(i), 0)}); err != nil {
			t.Fatal(err)
		}
		tw.Write(m.data)
	}
	tw.Close()
	if err := os.WriteFile(tokens, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	paths = append(paths, tokens)
	for _, args := range [][]string{{"index"}, {"index", "--no-compress", "--no-index-store"}} {
		code, stdout, stderr := runCLI(t, append(args, paths...)...)
		if code != 0 {
			t.Fatalf("%q: exit %d: %s", args, code, stderr)
		}
		infos, err := index.Read(strings.NewReader(stdout), "stdout")
		if err != nil || len(infos) != len(paths) {
			t.Fatalf("%q: %d shards, %v", args, len(infos), err)
		}
		for i, p := range paths {
			checkMembers(t, infos[i], p)
		}
		if m := infos[1].Members; m == nil || m.DType("npy") != "" || m.DTypes() != nil {
			t.Errorf("%q: Lhotse's 2-D features: type %q", args, m.DTypes())
		}
		m := infos[len(infos)-1].Members
		if m == nil || m.DType("tokens.npy") != "<u2" || m.DType("mask.npy") != "<i4" || m.DType("json") != "" {
			t.Fatalf("%q: the token arrays' types: %v", args, m.DTypes())
		}
		for _, c := range []struct {
			sample int
			ext    string
			n      int64
			ok     bool
		}{{0, "tokens.npy", 1000, true}, {0, "mask.npy", 3, true}, {1, "tokens.npy", 17, true}, {1, "mask.npy", 0, true}, {2, "tokens.npy", 70_000, true}, {2, "mask.npy", 0, false}} {
			if n, ok := m.Items(c.sample, c.ext); n != c.n || ok != c.ok {
				t.Errorf("%q: sample %d %s: %d elements %v; want %d", args, c.sample, c.ext, n, ok, c.n)
			}
		}
	}
	code, stdout, stderr := runCLI(t, append([]string{"index", "--no-compress", "--no-sizes"}, paths...)...)
	if code != 0 || !strings.HasPrefix(stdout, `{"format":"shardload-index","version":1,`) || strings.Contains(stdout, `"exts"`) {
		t.Fatalf("--no-sizes: exit %d, %.100q: %s", code, stdout, stderr)
	}
}

func TestIndexLocal(t *testing.T) {
	t.Setenv(index.StoreDirEnv, t.TempDir())
	dir := t.TempDir()
	paths := indexDataset(t, dir)

	t.Run("stdout", func(t *testing.T) {
		args := append([]string{"index"}, paths...)
		code, stdout, stderr := runCLI(t, args...)
		if code != 0 {
			t.Fatalf("exit %d: %s", code, stderr)
		}
		if !strings.HasPrefix(stdout, "\x28\xb5\x2f\xfd") {
			t.Errorf("stdout starts %q; want a zstd frame", stdout[:min(len(stdout), 8)])
		}
		infos, err := index.Read(strings.NewReader(stdout), "stdout")
		if err != nil {
			t.Fatal(err)
		}
		checkIndex(t, infos, paths)
		want := "5 shards (3 with sample offsets), 38 samples: " + strconv.Itoa(len(stdout)) + " bytes of index (zstd) written to stdout"
		if !strings.Contains(stderr, want) {
			t.Errorf("stderr %q; want the summary %q", stderr, want)
		}
		// Not a terminal: a line per tenth of the way, the last at 5/5.
		if !strings.Contains(stderr, "indexed 5/5 shards\n") || strings.Contains(stderr, "\r") {
			t.Errorf("stderr %q; want progress lines ending with 5/5", stderr)
		}
	})

	t.Run("plain", func(t *testing.T) {
		args := append([]string{"index", "--no-compress", "--workers", "1", "--no-index-store"}, paths...)
		code, stdout, stderr := runCLI(t, args...)
		if code != 0 || !strings.HasPrefix(stdout, `{"format":"shardload-index"`) {
			t.Fatalf("exit %d, stdout %.60q: %s", code, stdout, stderr)
		}
		infos, err := index.Read(strings.NewReader(stdout), "stdout")
		if err != nil {
			t.Fatal(err)
		}
		checkIndex(t, infos, paths)
	})

	t.Run("output DIR/", func(t *testing.T) {
		// The listing of dir finds the shards, in name order ("gz-" before "plain-").
		listed := append(append([]string(nil), paths[3:]...), paths[:3]...)
		for run := range 2 {
			// The second run lists the index written by the first, and leaves it out.
			code, _, stderr := runCLI(t, "index", dir+"/", "--output", dir+"/")
			if code != 0 {
				t.Fatalf("run %d: exit %d: %s", run, code, stderr)
			}
			f, err := os.Open(filepath.Join(dir, index.FileName))
			if err != nil {
				t.Fatal(err)
			}
			infos, err := index.Read(f, f.Name())
			f.Close()
			if err != nil {
				t.Fatal(err)
			}
			checkIndex(t, infos, listed)
			if !strings.Contains(stderr, "written to "+dir+"/"+index.FileName) {
				t.Errorf("stderr %q; want the summary naming the index", stderr)
			}
		}
		if fi, err := os.Stat(filepath.Join(dir, index.FileName)); err != nil || fi.Mode().Perm() != 0o644 {
			t.Errorf("index file: %v, %v; want mode 0644", fi, err)
		}
		// A loader finds it beside the shards and reads no shard.
		opened := loaderOpens(t, listed, &source.File{}, "file")
		if len(opened) != 1 || opened[0] != filepath.Join(dir, index.FileName) {
			t.Errorf("the loader opened %q; want the index alone", opened)
		}
	})

	t.Run("failed write keeps the index", func(t *testing.T) {
		before, err := os.ReadFile(filepath.Join(dir, index.FileName))
		if err != nil {
			t.Fatal(err)
		}
		bad := filepath.Join(t.TempDir(), "bad.tar")
		if err := os.WriteFile(bad, bytes.Repeat([]byte("x"), 1000), 0o644); err != nil {
			t.Fatal(err)
		}
		code, _, stderr := runCLI(t, "index", "--output", dir+"/", paths[0], bad)
		if code != 1 || !strings.Contains(stderr, "bad.tar") {
			t.Errorf("exit %d: %s; want a failure naming the bad shard", code, stderr)
		}
		after, err := os.ReadFile(filepath.Join(dir, index.FileName))
		if err != nil || !bytes.Equal(after, before) {
			t.Errorf("index changed by a failed run (%v)", err)
		}
		entries, _ := os.ReadDir(dir)
		for _, e := range entries {
			if strings.HasPrefix(e.Name(), ".") {
				t.Errorf("left behind: %s", e.Name())
			}
		}
	})
}

// countingSource records the URLs opened through it.
type countingSource struct {
	source.Source
	mu     sync.Mutex
	opened []string
}

func (c *countingSource) Open(ctx context.Context, url string) (io.ReadCloser, error) {
	c.mu.Lock()
	c.opened = append(c.opened, url)
	c.mu.Unlock()
	return c.Source.Open(ctx, url)
}

// loaderOpens counts urls as a loader does, through src registered for scheme with
// every open recorded, and without the node's index store; it returns the URLs
// opened. The counts must be those of the index.
func loaderOpens(t *testing.T, urls []string, src source.Source, scheme string) []string {
	t.Helper()
	cs := &countingSource{Source: src}
	reg := &source.Registry{}
	reg.Register(scheme, cs)
	var mu sync.Mutex
	var logs []string
	infos, err := shardload.Count(t.Context(), shardload.Config{URLs: urls, Sources: reg, NoIndexStore: true,
		Logf: func(format string, args ...any) {
			mu.Lock()
			logs = append(logs, format)
			mu.Unlock()
		}})
	if err != nil {
		t.Fatal(err)
	}
	if len(infos) != len(urls) || len(logs) != 0 {
		t.Errorf("Count: %d shards, logged %q; want %d shards and no log line", len(infos), logs, len(urls))
	}
	return cs.opened
}

// TestIndexToMinIO writes the index of shards in MinIO beside them; a loader then
// counts the shards from it without reading one.
func TestIndexToMinIO(t *testing.T) {
	t.Setenv(index.StoreDirEnv, t.TempDir())
	srv := testutil.MinIO(t)
	isolateAWSConfig(t)
	srv.SetEnv(t)
	srv.CreateBucket(t, "data")
	paths := indexDataset(t, t.TempDir())
	var urls []string
	for _, p := range paths {
		data, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		srv.Put(t, "data", "train/"+filepath.Base(p), data)
		urls = append(urls, "s3://data/train/"+filepath.Base(p))
	}
	// The brace pattern of the plain shards, and the gzip ones by name.
	args := append([]string{"index", "s3://data/train/plain-{000000..000002}.tar"}, urls[3:]...)
	code, stdout, stderr := runCLI(t, append(args, "--output", "s3://data/train/")...)
	if code != 0 || stdout != "" {
		t.Fatalf("exit %d, stdout %q: %s", code, stdout, stderr)
	}
	if !strings.Contains(stderr, "5 shards (3 with sample offsets), 38 samples") || !strings.Contains(stderr, "written to s3://data/train/"+index.FileName) {
		t.Errorf("stderr %q; want the summary", stderr)
	}
	src := &s3.Source{}
	rc, err := src.Open(t.Context(), "s3://data/train/"+index.FileName)
	if err != nil {
		t.Fatal(err)
	}
	infos, err := index.Read(rc, "index")
	rc.Close()
	if err != nil || len(infos) != 5 {
		t.Fatalf("index: %d shards, %v", len(infos), err)
	}
	for i, info := range infos {
		obj, err := src.Stat(t.Context(), urls[i])
		if err != nil {
			t.Fatal(err)
		}
		offs := readerOffsets(t, paths[i])
		if strings.HasSuffix(urls[i], ".gz") {
			offs = nil
		}
		if info.URL != urls[i] || info.Version != obj.Version || info.Size != obj.Size || info.Samples != len(readerOffsets(t, paths[i])) || !slices.Equal(info.Offsets, offs) {
			t.Errorf("entry %d = %+v; want %s at version %s with the offsets %v", i, info, urls[i], obj.Version, offs)
		}
	}
	opened := loaderOpens(t, urls, src, "s3")
	if len(opened) != 1 || opened[0] != "s3://data/train/"+index.FileName {
		t.Errorf("the loader opened %q; want the index alone", opened)
	}
}

// isolateAWSConfig points the AWS configuration at empty files, so that the
// developer's own profiles do not leak into a test against MinIO.
func isolateAWSConfig(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("AWS_CONFIG_FILE", filepath.Join(dir, "config"))
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", filepath.Join(dir, "credentials"))
	for _, k := range []string{"AWS_PROFILE", "AWS_REQUEST_CHECKSUM_CALCULATION", "AWS_RESPONSE_CHECKSUM_VALIDATION", s3.PathStyleEnv} {
		t.Setenv(k, "")
		os.Unsetenv(k)
	}
}

func TestIndexUsageErrors(t *testing.T) {
	t.Setenv(index.StoreDirEnv, t.TempDir())
	missing := filepath.Join(t.TempDir(), "missing.tar") // never read: the output fails first
	for _, tt := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"index"}, 2, "no shard URLs given"},
		{[]string{"index", "--output", t.TempDir() + "/"}, 2, "no shard URLs given"},
		{[]string{"index", "--output", "http://example.com/data/", missing}, 2, "http:// URLs cannot be written"},
		{[]string{"index", "--output", "https://example.com/x.index", missing}, 2, "https:// URLs cannot be written"},
		{[]string{"index", "--output", "nope://b/x.index", missing}, 2, "unknown URL scheme"},
		{[]string{"index", "--workers", "0", missing}, 2, "--workers 0"},
		{[]string{"index", "--output", filepath.Join(t.TempDir(), "no", "dir", "x"), missing}, 1, "does not exist"},
	} {
		code, stdout, stderr := runCLI(t, tt.args...)
		if code != tt.code || !strings.Contains(stderr, tt.want) || stdout != "" {
			t.Errorf("%q: exit %d, stdout %q, stderr %q; want exit %d naming %q", tt.args, code, stdout, stderr, tt.code, tt.want)
		}
		if strings.Contains(stderr, "missing.tar") {
			t.Errorf("%q: %q; the shard was read before the output was checked", tt.args, stderr)
		}
	}
}
