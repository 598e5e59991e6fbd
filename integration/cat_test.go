package integration

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"

	"github.com/shardload/shardload/internal/shardgen"
	"github.com/shardload/shardload/internal/testutil"
	"github.com/shardload/shardload/shard"
)

// refSample is a sample as this test regroups it, independently of package shard.
type refSample struct {
	key    string
	fields map[string][]byte
}

// regroup reads a tar stream with archive/tar and groups its regular members by
// WebDataset's rules: key up to the first dot of the base name, adjacent members.
func regroup(t *testing.T, r io.Reader) []refSample {
	t.Helper()
	var out []refSample
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatalf("archive/tar: %v", err)
		}
		if h.Typeflag != tar.TypeReg {
			continue
		}
		dir, base := "", h.Name
		if i := strings.LastIndex(h.Name, "/"); i >= 0 {
			dir, base = h.Name[:i+1], h.Name[i+1:]
		}
		if dir == "" && strings.HasPrefix(base, "__") && strings.HasSuffix(base, "__") {
			continue
		}
		dot := strings.Index(base, ".")
		if dot <= 0 {
			continue
		}
		key, ext := dir+base[:dot], strings.ToLower(base[dot+1:])
		data, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		if len(out) == 0 || out[len(out)-1].key != key {
			out = append(out, refSample{key: key, fields: map[string][]byte{}})
		}
		out[len(out)-1].fields[ext] = data
	}
}

// decompressed opens a shard file and undoes its whole-file compression.
func decompressed(t *testing.T, path string) io.Reader {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	switch {
	case bytes.HasPrefix(data, []byte{0x1f, 0x8b}):
		zr, err := gzip.NewReader(bytes.NewReader(data))
		if err != nil {
			t.Fatal(err)
		}
		return zr
	case bytes.HasPrefix(data, []byte{0x28, 0xb5, 0x2f, 0xfd}):
		zr, err := zstd.NewReader(bytes.NewReader(data))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(zr.Close)
		return zr
	}
	return bytes.NewReader(data)
}

func sameSamples(t *testing.T, got, want []refSample) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("cat gave %d samples, input has %d", len(got), len(want))
	}
	for i := range want {
		g, w := got[i], want[i]
		if g.key != w.key || len(g.fields) != len(w.fields) {
			t.Fatalf("sample %d: key %q with %d fields, want %q with %d", i, g.key, len(g.fields), w.key, len(w.fields))
		}
		for ext, data := range w.fields {
			if !bytes.Equal(g.fields[ext], data) {
				t.Fatalf("sample %q field %q: %d bytes differ from the input's %d", w.key, ext, len(g.fields[ext]), len(data))
			}
		}
	}
}

// catInputs returns shard files to stream: generated plain, gzip and zstd shards and
// every real shard in testdata/.
func catInputs(t *testing.T) []string {
	t.Helper()
	dir := t.TempDir()
	var paths []string
	for i, c := range []shard.Compression{shard.None, shard.Gzip, shard.Zstd} {
		spec := shardgen.Spec{Shards: 2, SamplesPerShard: 50, Compression: c, Seed: uint64(i), Prefix: "gen-" + c.String()}
		p, err := shardgen.Generate(dir, spec)
		if err != nil {
			t.Fatal(err)
		}
		paths = append(paths, p...)
	}
	for _, row := range readProvenance(t) {
		paths = append(paths, filepath.Join("..", "testdata", row.file))
	}
	return paths
}

func TestCatRoundTripFile(t *testing.T) {
	paths := catInputs(t)
	var want []refSample
	for _, p := range paths {
		want = append(want, regroup(t, decompressed(t, p))...)
	}
	out := ok(t, nil, append([]string{"cat"}, paths...)...)
	sameSamples(t, regroup(t, bytes.NewReader(out)), want)

	// One shard at a time, and through a brace pattern, gives the same bytes.
	dir := filepath.Dir(paths[0])
	one := ok(t, nil, "cat", filepath.Join(dir, "gen-zstd-{000000..000001}.tar.zst"))
	sameSamples(t, regroup(t, bytes.NewReader(one)), append(regroup(t, decompressed(t, paths[4])), regroup(t, decompressed(t, paths[5]))...))
}

func TestCatRoundTripS3(t *testing.T) {
	paths := catInputs(t)
	m := testutil.MinIO(t)
	m.CreateBucket(t, "shards")
	var urls []string
	var want []refSample
	for _, p := range paths {
		data, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		key := "train/" + filepath.Base(p)
		m.Put(t, "shards", key, data)
		urls = append(urls, "s3://shards/"+key)
		want = append(want, regroup(t, decompressed(t, p))...)
	}
	out := ok(t, m.Env(), append([]string{"cat", "--stats"}, urls...)...)
	sameSamples(t, regroup(t, bytes.NewReader(out)), want)
}

// TestCatRefusesMergingKeys: two shards whose boundary samples share a key would
// become one sample in a single stream.
func TestCatRefusesMergingKeys(t *testing.T) {
	dir := t.TempDir()
	a := writeTar(t, dir, "a.tar", tarMember{"k1.x", "1"}, tarMember{"k2.x", "2"})
	b := writeTar(t, dir, "b.tar", tarMember{"k2.y", "3"})
	r := shardload(t, "", nil, "cat", a, b)
	if r.code != 1 || !strings.Contains(r.stderr, `sample key "k2"`) {
		t.Errorf("exit %d: %s", r.code, r.stderr)
	}
}

type tarMember struct{ name, data string }

func buildTar(t *testing.T, members ...tarMember) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, m := range members {
		if err := tw.WriteHeader(&tar.Header{Name: m.name, Mode: 0o644, Size: int64(len(m.data)), Typeflag: tar.TypeReg}); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write([]byte(m.data)); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func writeTar(t *testing.T, dir, name string, members ...tarMember) string {
	t.Helper()
	return writeFile(t, dir, name, buildTar(t, members...))
}

func writeFile(t *testing.T, dir, name string, data []byte) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// member1K is a 1000-byte member; in a tar each takes 512 + 1024 bytes, so member i's
// header is at byte 1536*i.
func member1K(name string) tarMember { return tarMember{name, strings.Repeat("d", 1000)} }

func compressBytes(t *testing.T, c shard.Compression, data []byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	var w io.WriteCloser = gzip.NewWriter(&buf)
	if c == shard.Zstd {
		w, _ = zstd.NewWriter(&buf)
	}
	w.Write(data)
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// TestBadInput: every kind of bad input ends in one clear line on stderr naming the
// shard and, where known, the sample key and byte offset, and a non-zero exit.
func TestBadInput(t *testing.T) {
	dir := t.TempDir()
	good := buildTar(t, member1K("a.x"), member1K("a.y"), member1K("b.x"), member1K("b.y"), member1K("c.x"))
	flip := func(data []byte, at int) []byte {
		bad := bytes.Clone(data)
		for i := at; i < at+16 && i < len(bad); i++ {
			bad[i] ^= 0xa5
		}
		return bad
	}
	gz := compressBytes(t, shard.Gzip, good)
	zs := compressBytes(t, shard.Zstd, good)
	cases := []struct {
		name string
		data []byte
		args []string // extra flags
		url  string   // instead of the file, when set
		want []string // substrings of the one error line
	}{
		{name: "truncated mid-member", data: good[:1536*2+700],
			want: []string{`sample "b"`, "at byte 3772", "truncated tar"}},
		{name: "truncated at member boundary", data: good[:1536*4],
			want: []string{"at byte 6144", "truncated tar", "no end-of-archive marker"}},
		{name: "bad header checksum", data: flip(good, 1536*3+20),
			want: []string{"at byte 4608", "bad tar header"}},
		{name: "corrupt gzip", data: flip(gz, len(gz)/2),
			want: []string{"corrupt compressed stream", "gzip"}},
		{name: "corrupt zstd", data: flip(zs, len(zs)/2),
			want: []string{"corrupt compressed stream", "zstd"}},
		{name: "truncated gzip", data: gz[:len(gz)/2],
			want: []string{"truncated", "gzip stream ended early"}},
		{name: "member over the cap", data: good, args: []string{"--max-member-size", "999"},
			want: []string{`sample "a"`, "at byte 0", "member larger than the cap", "1000 bytes"}},
		{name: "duplicate extension", data: buildTar(t, member1K("a.x"), member1K("b.x"), member1K("b.x")),
			want: []string{`sample "b"`, "at byte 3072", `duplicate extension "x"`}},
		{name: "unknown scheme", url: "foo://bucket/x.tar", want: []string{"foo://bucket/x.tar", `unknown URL scheme "foo"`}},
		{name: "missing file", url: filepath.Join(dir, "nope.tar"), want: []string{"object not found"}},
	}
	for _, tc := range cases {
		for _, cmd := range []string{"ls", "cat"} {
			t.Run(tc.name+"/"+cmd, func(t *testing.T) {
				url := tc.url
				if url == "" {
					url = writeFile(t, t.TempDir(), "bad.tar", tc.data)
				}
				r := shardload(t, "", nil, append(append([]string{cmd}, tc.args...), url)...)
				expectOneLineError(t, r, append(tc.want, url))
				if cmd == "cat" && tc.name == "truncated mid-member" {
					checkCutShort(t, r.stdout, []string{"a"})
				}
			})
		}
	}
}

func expectOneLineError(t *testing.T, r result, want []string) {
	t.Helper()
	t.Logf("stderr: %s", r.stderr)
	if r.code != 1 {
		t.Errorf("exit status %d, want 1 (stderr %q)", r.code, r.stderr)
	}
	lines := strings.Split(strings.TrimRight(r.stderr, "\n"), "\n")
	if len(lines) != 1 {
		t.Errorf("stderr has %d lines, want one: %q", len(lines), r.stderr)
	}
	for _, w := range want {
		if !strings.Contains(r.stderr, w) {
			t.Errorf("error %q does not say %q", r.stderr, w)
		}
	}
}

// checkCutShort: what cat wrote before failing holds the complete samples and then
// ends without an end-of-archive marker, so a reader that checks cannot take it for a
// whole shard (and a pipe: reader sees the non-zero exit status).
func checkCutShort(t *testing.T, out []byte, keys []string) {
	t.Helper()
	var got []string
	for _, s := range regroup(t, bytes.NewReader(out)) {
		got = append(got, s.key)
	}
	if strings.Join(got, ",") != strings.Join(keys, ",") {
		t.Errorf("partial output holds samples %v, want %v", got, keys)
	}
	sr := shard.NewReader(bytes.NewReader(out), shard.Options{URL: "stdout"})
	var err error
	for err == nil {
		_, err = sr.Next()
	}
	if !errors.Is(err, shard.ErrTruncated) || !strings.Contains(err.Error(), "no end-of-archive marker") {
		t.Errorf("partial output ends with %v, want a tar without its end marker", err)
	}
}

func TestBadInputS3(t *testing.T) {
	m := testutil.MinIO(t)
	m.CreateBucket(t, "shards")
	m.Put(t, "shards", "ok.tar", buildTar(t, member1K("a.x")))
	t.Run("missing object", func(t *testing.T) {
		r := shardload(t, "", m.Env(), "ls", "s3://shards/missing-000000.tar")
		expectOneLineError(t, r, []string{"s3://shards/missing-000000.tar", "object not found"})
	})
	t.Run("missing bucket", func(t *testing.T) {
		r := shardload(t, "", m.Env(), "cat", "s3://no-such-bucket/x.tar")
		expectOneLineError(t, r, []string{"s3://no-such-bucket/x.tar", "bucket not found"})
	})
	t.Run("wrong credentials", func(t *testing.T) {
		env := append(m.Env(), "AWS_SECRET_ACCESS_KEY=wrong-"+m.SecretKey)
		r := shardload(t, "", env, "cat", "s3://shards/ok.tar")
		expectOneLineError(t, r, []string{"s3://shards/ok.tar", "access denied"})
	})
	t.Run("the good object reads", func(t *testing.T) {
		if got := regroup(t, bytes.NewReader(ok(t, m.Env(), "cat", "s3://shards/ok.tar"))); len(got) != 1 || got[0].key != "a" {
			t.Errorf("got %+v", got)
		}
	})
}

// TestUnsafeNamesNeverTouchTheFilesystem: member names with ../ or an absolute path are
// listed and streamed as strings; nothing is created anywhere.
func TestUnsafeNamesNeverTouchTheFilesystem(t *testing.T) {
	root := t.TempDir()
	work := filepath.Join(root, "work")
	if err := os.Mkdir(work, 0o755); err != nil {
		t.Fatal(err)
	}
	abs := filepath.Join(root, "abs-target")
	shardPath := writeTar(t, root, "evil.tar",
		tarMember{"../escaped.x", "1"}, tarMember{abs + ".x", "2"}, tarMember{"../../up/deep.x", "3"})
	for _, cmd := range [][]string{{"ls", shardPath}, {"cat", shardPath}} {
		r := shardload(t, work, nil, cmd...)
		if r.code != 0 {
			t.Fatalf("%v: exit %d: %s", cmd, r.code, r.stderr)
		}
		if cmd[0] == "cat" {
			got := regroup(t, bytes.NewReader(r.stdout))
			if len(got) != 3 || got[0].key != "../escaped" || got[1].key != abs {
				t.Errorf("cat keys %+v", got)
			}
		}
	}
	entries, _ := os.ReadDir(root)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if fmt.Sprint(names) != "[evil.tar work]" {
		t.Errorf("files beside the shard: %v", names)
	}
	if inner, _ := os.ReadDir(work); len(inner) != 0 {
		t.Errorf("files in the working directory: %v", inner)
	}
}
