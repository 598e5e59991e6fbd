package index_test

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/klauspost/compress/zstd"

	"github.com/shardload/shardload/index"
	"github.com/shardload/shardload/internal/shardgen"
	"github.com/shardload/shardload/shard"
	"github.com/shardload/shardload/source"
)

// npyHeader returns the header numpy.save writes for a 1-D array of n elements of
// descr: the magic, version 1.0, the length and the dict, padded to 64 bytes.
func npyHeader(descr string, n int) []byte {
	dict := fmt.Sprintf("{'descr': '%s', 'fortran_order': False, 'shape': (%d,), }", descr, n)
	hlen := len(dict) + 1
	hlen += (64 - (10+hlen)%64) % 64
	b := append([]byte("\x93NUMPY"), 1, 0)
	b = binary.LittleEndian.AppendUint16(b, uint16(hlen))
	b = append(b, dict...)
	b = append(b, bytes.Repeat([]byte(" "), hlen-len(dict)-1)...)
	return append(b, '\n')
}

// npyArray is a whole 1-D .npy of n elements of descr, size bytes each.
func npyArray(descr string, n, size int) []byte {
	return append(npyHeader(descr, n), make([]byte, n*size)...)
}

// memberShards returns n shards under prefix with samples samples each, and their
// members: a jpg of uneven size, a cls in most samples, and in every third shard a
// 1-D tokens.npy of uint16; the offsets are where a tar of those members puts the
// samples. Some shards are compressed (members, no offsets), some empty, some of
// unknown members.
func memberShards(prefix string, n, samples int) []shard.Info {
	infos := make([]shard.Info, n)
	for i := range infos {
		info := shard.Info{URL: fmt.Sprintf("%strain-%06d.tar", prefix, i), Samples: samples, Version: fmt.Sprintf(`"v%d"`, i)}
		if i%101 == 7 {
			info.Samples = 0
		}
		var b shard.MembersBuilder
		off := int64(0)
		for j := range info.Samples {
			info.Offsets = append(info.Offsets, off)
			b.Sample()
			add := func(ext string, size int64, head []byte) {
				b.MemberHead(ext, size, head)
				off += 512 + (size+511)/512*512
			}
			add("jpg", int64(100+(i*7+j*13)%5000), nil)
			if j%5 != 0 {
				add("cls", 1, nil)
			}
			if i%3 == 0 {
				tokens := (i + j) % 300
				head := npyHeader("<u2", tokens)
				add("tokens.npy", int64(len(head)+2*tokens), head)
			}
		}
		info.Size = off + 1024
		info.Members = b.Members()
		switch {
		case i%97 == 5:
			info.URL += ".gz" // compressed: members, no offsets
			info.Offsets, info.Size = nil, info.Size/3
		case i%89 == 3:
			info.Members = nil // unknown
		}
		infos[i] = info
	}
	return infos
}

// dropMembers returns a copy of infos without their members.
func dropMembers(infos []shard.Info) []shard.Info {
	out := make([]shard.Info, len(infos))
	for i, in := range infos {
		in.Members = nil
		out[i] = in
	}
	return out
}

// An index with members is version 2 and reads back as written, plain or
// compressed, addressable or not; one without is version 1 and has no member keys.
func TestMembersRoundTrip(t *testing.T) {
	infos := memberShards("s3://b/d/", 300, 20)
	for _, compress := range []bool{false, true} {
		var buf bytes.Buffer
		if err := index.Write(&buf, infos, compress); err != nil {
			t.Fatal(err)
		}
		if !compress && (!strings.HasPrefix(buf.String(), `{"format":"shardload-index","version":2,`) ||
			!strings.Contains(buf.String(), `,"exts":["cls","jpg","tokens.npy"],"dtypes":["","","<u2"],"sizes":"`)) {
			t.Fatalf("plain index: %.300s", buf.String())
		}
		got, err := index.Read(&buf, "x")
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, infos) {
			t.Fatalf("compress %v: read back differs", compress)
		}
		buf.Reset()
		index.Write(&buf, dropMembers(infos), false)
		if s := buf.String(); !strings.HasPrefix(s, `{"format":"shardload-index","version":1,`) || strings.Contains(s, `"exts"`) || strings.Contains(s, `"sizes"`) {
			t.Fatalf("an index without members: %.200s", s)
		}
	}
	var buf bytes.Buffer
	if err := index.WriteAddressable(&buf, infos); err != nil {
		t.Fatal(err)
	}
	got, err := index.Read(bytes.NewReader(buf.Bytes()), "x")
	if err != nil || !reflect.DeepEqual(got, infos) {
		t.Fatalf("addressable: read back differs (%v)", err)
	}
	if m := got[6].Members; m.DType("tokens.npy") != "<u2" {
		t.Fatalf("shard 6: tokens %q", m.DType("tokens.npy"))
	} else if n, ok := m.Items(4, "tokens.npy"); !ok || n != 10 {
		t.Fatalf("shard 6 sample 4: %d tokens %v, want 10", n, ok)
	}
	if got[3].Members != nil {
		t.Fatal("shard 3: members where they were unknown")
	}
	// A plain zstd decoder (a release before addressable offsets, or "zstd -d") reads
	// the counts: every shard, and the version that says members are in the blocks.
	zr, _ := zstd.NewReader(bytes.NewReader(buf.Bytes()))
	plain, err := io.ReadAll(zr)
	zr.Close()
	if err != nil || !strings.HasPrefix(string(plain), `{"format":"shardload-index","version":2,`) || strings.Contains(string(plain), `"exts"`) {
		t.Fatalf("the counts: %v %.100s", err, plain)
	}
	if counts, err := index.Read(bytes.NewReader(plain), "counts"); err != nil || !reflect.DeepEqual(counts[3], shard.Info{URL: infos[3].URL, Samples: 20, Version: infos[3].Version, Size: infos[3].Size}) {
		t.Fatalf("the counts read as an index: %v", err)
	}
}

// The counts of an addressable index are the same with members or without: the
// members lie in the blocks.
func TestMembersCountsDoNotGrow(t *testing.T) {
	infos := memberShards("s3://b/d/", 3000, 30)
	layout := func(infos []shard.Info) index.Layout {
		var buf bytes.Buffer
		if err := index.WriteAddressable(&buf, infos); err != nil {
			t.Fatal(err)
		}
		l, ok, err := index.ReadLayout(bytes.NewReader(buf.Bytes()), "x")
		if !ok || err != nil {
			t.Fatal(ok, err)
		}
		if first := index.BlockStarts(infos); !reflect.DeepEqual(first, l.First) {
			t.Fatalf("BlockStarts %v, the index's %v", first, l.First)
		}
		return l
	}
	with, without := layout(infos), layout(dropMembers(infos))
	if d := with.Counts - without.Counts; d < -8 || d > 8 {
		t.Errorf("counts of %d bytes with members, %d without", with.Counts, without.Counts)
	}
	t.Logf("%d shards of 30 samples: counts %d bytes; blocks %d bytes with members, %d without", len(infos), with.Counts, with.Size()-with.Counts-with.Head, without.Size()-without.Counts-without.Head)
}

// Quick leaves the members in the blocks with the offsets; Plan reads those of the
// shards it reads the offsets of, and LoadMembers those of others, one ranged read a
// block.
func TestMembersLazy(t *testing.T) {
	infos := memberShards("mem://b/d/", 1500, 30)
	lk, rf, urls := synthLookup(t, infos, false)
	ctx := context.Background()
	got, err := lk.Quick(ctx, urls, 16)
	if err != nil {
		t.Fatal(err)
	}
	for i := range got {
		if got[i].Members != nil || got[i].Offsets != nil {
			t.Fatalf("Quick: shard %d has its offsets or members", i)
		}
	}
	planned, _, err := index.Plan(ctx, got, planFn(5, 16))
	if err != nil {
		t.Fatal(err)
	}
	loaded := 0
	for i, in := range planned {
		if in.Offsets != nil || (in.Members != nil && strings.HasSuffix(in.URL, ".gz")) {
			loaded++
			if !reflect.DeepEqual(in.Members, infos[i].Members) || !reflect.DeepEqual(in.Offsets, infos[i].Offsets) {
				t.Fatalf("Plan: shard %d's offsets or members are not the index's", i)
			}
		} else if in.Members != nil {
			t.Fatalf("Plan: shard %d has members and no offsets", i)
		}
	}
	if loaded == 0 || loaded > len(infos)/4 {
		t.Fatalf("Plan loaded %d shards of %d", loaded, len(infos))
	}
	// MembersOf reads them without writing into the shards (which others may share).
	var notLoaded []int
	for i := range planned {
		if planned[i].Members == nil && len(notLoaded) < 40 {
			notLoaded = append(notLoaded, i)
		}
	}
	ms, err := index.MembersOf(ctx, planned, notLoaded)
	if err != nil || len(ms) != len(notLoaded) {
		t.Fatalf("MembersOf %d shards: %d, %v", len(notLoaded), len(ms), err)
	}
	for _, i := range notLoaded {
		if planned[i].Members != nil || !reflect.DeepEqual(ms[i], infos[i].Members) {
			t.Fatalf("MembersOf: shard %d's members are not the index's, or were written into the shards", i)
		}
	}
	ranges := rf.ranges
	if err := index.LoadMembers(ctx, planned, []int{0, 1, 2, 3}); err != nil {
		t.Fatal(err)
	}
	if rf.ranges != ranges+1 {
		t.Errorf("LoadMembers of 4 shards of one block: %d ranged reads", rf.ranges-ranges)
	}
	for i := range 4 {
		if !reflect.DeepEqual(planned[i].Members, infos[i].Members) {
			t.Fatalf("LoadMembers: shard %d", i)
		}
	}
	if err := index.LoadMembers(ctx, planned, nil); err != nil {
		t.Fatal(err)
	}
	for i := range planned {
		if !reflect.DeepEqual(planned[i].Members, infos[i].Members) {
			t.Fatalf("LoadMembers of all: shard %d", i)
		}
	}
	// Shards read whole have their members already: nothing to read.
	whole, err := index.Read(mustOpenFile(t, lk.Index), "x")
	if err != nil {
		t.Fatal(err)
	}
	ranges = rf.ranges
	if err := index.LoadMembers(ctx, whole, nil); err != nil || rf.ranges != ranges {
		t.Fatalf("LoadMembers of an index read whole: %v, %d reads", err, rf.ranges-ranges)
	}
}

func mustOpenFile(t *testing.T, p string) io.Reader {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return bytes.NewReader(b)
}

// Indexes that the release before members wrote (testdata/README.md) read as they
// did: every shard, count, version, size and offset, and members unknown.
func TestReadVersion1(t *testing.T) {
	want := []shard.Info{
		{URL: "s3://bucket/train/shard-000000.tar", Samples: 3, Version: `"9b2cf535f27731c974343645a3985328"`, Size: 5120, Offsets: []int64{0, 1536, 3072}},
		{URL: "s3://bucket/train/shard-000001.tar.gz", Samples: 2, Version: `"0c4d"`, Size: 900},
		{URL: "s3://bucket/train/shard-000002.tar", Samples: 0, Version: `"e3b0"`, Size: 10240},
		{URL: "s3://bucket/train/shard-000003.tar", Samples: 2, Version: `"77aa"`, Size: 4096, Offsets: []int64{0, 2048}},
	}
	for _, name := range []string{"v1.index.jsonl", "v1.index"} {
		data, err := os.ReadFile(filepath.Join("testdata", name))
		if err != nil {
			t.Fatal(err)
		}
		got, err := index.Read(bytes.NewReader(data), name)
		if err != nil || !reflect.DeepEqual(got, want) {
			t.Fatalf("%s: %+v, %v", name, got, err)
		}
		// Written again, byte for byte as that release wrote it.
		var buf bytes.Buffer
		if name == "v1.index" {
			err = index.WriteAddressable(&buf, got)
		} else {
			err = index.Write(&buf, got, false)
		}
		if err != nil || !bytes.Equal(buf.Bytes(), data) {
			t.Errorf("%s: written again, %d bytes differ from its %d (%v)", name, buf.Len(), len(data), err)
		}
	}
	// Lazily: the shards, offsets as Plan reads them, no members to load.
	reg := &source.Registry{}
	rf := &rangeFile{}
	reg.Register("file", rf)
	byURL := map[string]shard.Info{}
	var urls []string
	for _, in := range want {
		byURL[in.URL] = in
		urls = append(urls, in.URL)
	}
	reg.Register("s3", memShards{byURL})
	lk := index.Lookup{Sources: reg, Index: filepath.Join("testdata", "v1.index"), NoBeside: true, LazyOffsets: true}
	got, err := lk.Quick(context.Background(), urls, 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := index.LoadMembers(context.Background(), got, nil); err != nil || rf.ranges != 0 {
		t.Fatalf("LoadMembers of a version-1 index: %v, %d ranged reads", err, rf.ranges)
	}
	for i := range got {
		if got[i].Members != nil || got[i].Samples != want[i].Samples {
			t.Fatalf("shard %d: %+v", i, got[i])
		}
	}
}

// An index whose members no shard has is refused, naming the shard: sizes of
// another count, larger than the shard, overflowing, not base64; in a line and in
// a block, and when a loader reads a block lazily.
func TestMembersHostile(t *testing.T) {
	const url = "s3://b/d/train-000006.tar"
	base := memberShards("s3://b/d/", 7, 10)[6] // offsets, members of jpg, cls, tokens.npy
	line := func(in shard.Info) string {
		var buf bytes.Buffer
		if err := index.Write(&buf, []shard.Info{in}, false); err != nil {
			t.Fatal(err)
		}
		_, l, _ := strings.Cut(buf.String(), "\n") // no header: no sum to match
		return l
	}
	good := line(base)
	if _, err := index.Read(strings.NewReader(good), "good"); err != nil {
		t.Fatal(err)
	}
	sizes := good[strings.Index(good, `"sizes":"`)+len(`"sizes":"`):]
	sizes = sizes[:strings.IndexByte(sizes, '"')]
	big := base
	big.Size = base.Offsets[9] + 600 // the last sample's members do not fit
	for name, text := range map[string]string{
		"fewer samples":    strings.Replace(good, `"samples":10`, `"samples":9`, 1),
		"sizes count":      strings.Replace(good, sizes, sizes[:len(sizes)-8], 1),
		"larger than size": line(big),
		"overflow":         strings.Replace(good, sizes, "/////////////w", 1),
		"bad base64":       strings.Replace(good, sizes, "!!"+sizes[2:], 1),
		"no exts":          strings.Replace(good, `"exts":["cls","jpg","tokens.npy"],`, "", 1),
		"unsorted":         strings.Replace(good, `"exts":["cls","jpg"`, `"exts":["jpg","cls"`, 1),
		"dtype":            strings.Replace(good, `"<u2"`, `"<u3"`, 1),
		"items":            strings.Replace(good, `"items":"`, `"items":"AAAA`, 1),
	} {
		if text == good {
			t.Fatalf("%s: unchanged", name)
		}
		_, err := index.Read(strings.NewReader(text), name)
		if !errors.Is(err, index.ErrFormat) || !strings.Contains(err.Error(), url) {
			t.Errorf("%s: %v; want ErrFormat naming %s", name, err, url)
		}
	}
	// In blocks: whole, and lazily.
	short, _ := shard.DecodeMembers(9, base.Members.Exts(), base.Members.DTypes(), dropLast(base.Members.AppendSizes(nil), 3, 10), dropLast(base.Members.AppendItems(nil), 1, 10))
	for name, m := range map[string]*shard.Members{"fewer samples": short, "larger than size": base.Members} {
		infos := memberShards("mem://b/d/", 7, 10)
		infos[6].Members = m
		if name == "larger than size" {
			infos[6].Size = big.Size
		}
		var buf bytes.Buffer
		if err := index.WriteAddressable(&buf, infos); err != nil {
			t.Fatal(err)
		}
		_, err := index.Read(bytes.NewReader(buf.Bytes()), "x")
		if !errors.Is(err, index.ErrFormat) || !strings.Contains(err.Error(), "train-000006.tar") {
			t.Errorf("block, %s: %v; want ErrFormat naming the shard", name, err)
		}
		lk, _, urls := synthLookup(t, infos, false)
		got, err := lk.Quick(context.Background(), urls, 1)
		if err != nil {
			t.Fatal(err)
		}
		if err := index.LoadMembers(context.Background(), got, nil); err == nil || !strings.Contains(err.Error(), "train-000006.tar") || got[6].Members != nil {
			t.Errorf("LoadMembers, %s: %v; want an error naming the shard, and no members", name, err)
		}
	}
}

// dropLast returns the varints of b, cols columns of rows values each, without
// each column's last value.
func dropLast(b []byte, cols, rows int) []byte {
	var out []byte
	for range cols {
		for r := range rows {
			v, n := binary.Uvarint(b)
			b = b[n:]
			if r < rows-1 {
				out = binary.AppendUvarint(out, v)
			}
		}
	}
	return out
}

// tarOf writes members (name, data, ...) as a tar.
func tarOf(t testing.TB, members ...any) []byte {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for i := 0; i < len(members); i += 2 {
		data := members[i+1].([]byte)
		if err := tw.WriteHeader(&tar.Header{Name: members[i].(string), Mode: 0o644, Size: int64(len(data))}); err != nil {
			t.Fatal(err)
		}
		tw.Write(data)
	}
	tw.Close()
	return buf.Bytes()
}

// readerMembers checks that m holds the members the shard reader gives of the shard
// at path, every member of every sample.
func readerMembers(t *testing.T, path string, m *shard.Members) {
	t.Helper()
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
		for _, f := range s.Fields {
			if size, ok := m.Size(n, f.Ext); !ok || size != f.Size {
				t.Fatalf("%s sample %d: %s of %d bytes %v; the reader gives %d", path, n, f.Ext, size, ok, f.Size)
			}
		}
		count := 0
		for _, ext := range m.Exts() {
			if _, ok := m.Size(n, ext); ok {
				count++
			}
		}
		if count != len(s.Fields) {
			t.Fatalf("%s sample %d: %d members; the reader gives %d", path, n, count, len(s.Fields))
		}
	}
	if n != m.Samples() {
		t.Fatalf("%s: members of %d samples; the reader gives %d", path, m.Samples(), n)
	}
}

// countingOpen serves files whose reads it counts.
type countingOpen struct{ read atomic.Int64 }

func (c *countingOpen) Open(_ context.Context, url string) (io.ReadCloser, error) {
	f, err := os.Open(url)
	if err != nil {
		return nil, err
	}
	return &countedFile{f, c}, nil
}

type countedFile struct {
	*os.File
	c *countingOpen
}

func (f *countedFile) Read(p []byte) (int, error) {
	n, err := f.File.Read(p)
	f.c.read.Add(int64(n))
	return n, err
}

// Scan records the members the reader gives, compressed or not, and of .npy token
// arrays their type and counts, reading their headers and not their tokens.
func TestScanMembers(t *testing.T) {
	ctx := context.Background()
	reg, _ := registry()
	for _, comp := range []shard.Compression{shard.None, shard.Gzip, shard.Zstd} {
		paths, err := shardgen.Generate(t.TempDir(), shardgen.Spec{Shards: 2, Samples: []int{7, 30}, Compression: comp, Seed: 3,
			Fields: []shardgen.Field{{Ext: "jpg", Kind: shardgen.Random, MinBytes: 0, MaxBytes: 3000}, {Ext: "cls", Kind: shardgen.Class}}})
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range paths {
			info, err := index.Scan(ctx, reg, p, "v", 1, shard.Options{})
			if err != nil {
				t.Fatal(err)
			}
			if info.Members == nil || !reflect.DeepEqual(info.Members.Exts(), []string{"cls", "jpg"}) {
				t.Fatalf("%s: members %v", p, info.Members)
			}
			readerMembers(t, p, info.Members)
		}
	}

	dir := t.TempDir()
	tokens := filepath.Join(dir, "tokens.tar")
	os.WriteFile(tokens, tarOf(t,
		"d/0.tokens.npy", npyArray("<u2", 50_000, 2), "d/0.ids.npy", npyArray("<i4", 3, 4), "d/0.json", []byte("{}"),
		"d/1.tokens.npy", npyArray("<u2", 7, 2), "d/1.ids.npy", npyArray("<i4", 40_000, 4),
		"d/2.json", []byte(`{"a":1}`),
		"d/3.tokens.npy", npyArray("<u2", 0, 2), "d/3.ids.npy", npyArray("<i4", 1, 4),
	), 0o644)
	mixed := filepath.Join(dir, "mixed.tar")
	os.WriteFile(mixed, tarOf(t,
		"a.tokens.npy", npyArray("<u2", 5, 2), "a.mat.npy", npyArrayShape("<f4", "(2, 2)", 16),
		"b.tokens.npy", npyArray("<i4", 5, 4), "b.mat.npy", npyArrayShape("<f4", "(1, 2)", 8),
	), 0o644)
	var src countingOpen
	info, err := index.Scan(ctx, &src, tokens, "v", 1, shard.Options{})
	if err != nil {
		t.Fatal(err)
	}
	readerMembers(t, tokens, info.Members)
	m := info.Members
	if m.DType("tokens.npy") != "<u2" || m.DType("ids.npy") != "<i4" || m.DType("json") != "" {
		t.Fatalf("types %q", m.DTypes())
	}
	for _, c := range []struct {
		sample int
		ext    string
		n      int64
		ok     bool
	}{{0, "tokens.npy", 50_000, true}, {0, "ids.npy", 3, true}, {1, "tokens.npy", 7, true}, {1, "ids.npy", 40_000, true}, {2, "tokens.npy", 0, false}, {3, "tokens.npy", 0, true}, {3, "ids.npy", 1, true}} {
		if n, ok := m.Items(c.sample, c.ext); n != c.n || ok != c.ok {
			t.Errorf("sample %d %s: %d items %v; want %d %v", c.sample, c.ext, n, ok, c.n, c.ok)
		}
	}
	if st, _ := os.Stat(tokens); src.read.Load() > st.Size()/4 {
		t.Errorf("Scan read %d bytes of a %d-byte shard of tokens", src.read.Load(), st.Size())
	}
	// A read that holds the data records the same.
	f, _ := os.Open(tokens)
	defer f.Close()
	r := shard.NewReader(f, shard.Options{URL: tokens})
	rec := index.NewRecorder()
	for {
		s, err := r.Next()
		if err == io.EOF {
			break
		}
		rec.Add(s, err)
	}
	if got := rec.Info(tokens, r, "v", 1); !reflect.DeepEqual(got.Members, m) {
		t.Errorf("recorded from the data: %v; Scan's %v", got.Members, m)
	}

	info, err = index.Scan(ctx, &src, mixed, "v", 1, shard.Options{})
	if err != nil {
		t.Fatal(err)
	}
	readerMembers(t, mixed, info.Members)
	if info.Members.DTypes() != nil {
		t.Errorf("types of two dtypes and of 2-D arrays: %q", info.Members.DTypes())
	}
	if _, ok := info.Members.Items(0, "tokens.npy"); ok {
		t.Error("counts of a field of two dtypes")
	}
}

// npyArrayShape is a .npy of descr and shape holding n data bytes.
func npyArrayShape(descr, shape string, n int) []byte {
	h := npyHeader(descr, 0)
	dict := fmt.Sprintf("{'descr': '%s', 'fortran_order': False, 'shape': %s, }", descr, shape)
	hlen := len(dict) + 1
	hlen += (64 - (10+hlen)%64) % 64
	h = append(h[:8], byte(hlen), byte(hlen>>8))
	h = append(h, dict...)
	h = append(h, bytes.Repeat([]byte(" "), hlen-len(dict)-1)...)
	h = append(h, '\n')
	return append(h, make([]byte, n)...)
}

// With WantMembers, an entry without members (an earlier release's) is read again,
// with a line that says why; without, it is taken as it is.
func TestResolveWantMembers(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	paths := gen(t, dir, 3, shard.None)
	reg, _ := registry()
	infos, err := index.Lookup{Sources: reg, NoBeside: true}.Resolve(ctx, paths)
	if err != nil {
		t.Fatal(err)
	}
	old := dropMembers(infos)
	writeIndexFile(t, filepath.Join(dir, index.FileName), old)
	for _, want := range []bool{false, true} {
		reg, files := registry()
		var logs []string
		got, err := index.Lookup{Sources: reg, WantMembers: want, Logf: func(f string, a ...any) { logs = append(logs, fmt.Sprintf(f, a...)) }}.Resolve(ctx, paths)
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case !want && (files.shardOpens() != 0 || !reflect.DeepEqual(got, old)):
			t.Errorf("without WantMembers: %d shards read", files.shardOpens())
		case want && (files.shardOpens() != 3 || !reflect.DeepEqual(got, infos) || len(logs) != 1 || !strings.Contains(logs[0], "3 of 3 shards have entries without member sizes")):
			t.Errorf("with WantMembers: %d shards read, logs %q", files.shardOpens(), logs)
		}
	}
}
