package integration

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	awss3 "github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/shardload/shardload/index"
	"github.com/shardload/shardload/internal/shardgen"
	"github.com/shardload/shardload/internal/testutil"
	"github.com/shardload/shardload/plan"
	"github.com/shardload/shardload/shard"
	"github.com/shardload/shardload/source"
	"github.com/shardload/shardload/source/s3"
)

// copySpec is the dataset the copy tests index: uncompressed shards of uneven counts.
var copySpec = shardgen.Spec{Shards: 6, Samples: []int{40, 37, 25, 50, 33, 12}, Seed: 17}

// summaryRE is the summary line of "shardload index".
var summaryRE = regexp.MustCompile(`shardload index: (\d+) shards \((\d+) with sample offsets\)`)

// copied is a dataset indexed in one place (its "a" directory or prefix) that can be
// copied whole, its index with it, to another keeping each object's identity (base
// name, version and size).
type copied struct {
	env     []string         // for the command line
	reg     *source.Registry // for the library
	copyTo  func(dir string) // copies every object of "a" to dir
	pattern func(dir string) string
	urls    func(dir string) []string // as an index written of dir has them
	output  func(dir string) string   // the --output of dir's index
	read    func(dir string) []byte   // dir's index object
}

// checkIndexed checks that a run of "shardload index" over shards (want, in order,
// under other URLs) succeeded, that its summary line says every shard has sample
// offsets, and that the index it wrote (data) has, for every shard, the count and
// the offsets of want.
func checkIndexed(t *testing.T, name string, r result, data []byte, urls []string, want []shard.Info) {
	t.Helper()
	if r.code != 0 {
		t.Errorf("%s: exit %d: %s", name, r.code, r.stderr)
		return
	}
	n := len(want)
	if m := summaryRE.FindStringSubmatch(r.stderr); m == nil || m[1] != fmt.Sprint(n) || m[2] != fmt.Sprint(n) {
		t.Errorf("%s: want the summary to say %d shards (%d with sample offsets); stderr:\n%s", name, n, n, r.stderr)
	}
	got, err := index.Read(bytes.NewReader(data), name)
	if err != nil {
		t.Errorf("%s: reading the index written: %v", name, err)
		return
	}
	if len(got) != n {
		t.Errorf("%s: the index has %d shards, want %d", name, len(got), n)
		return
	}
	for i, e := range got {
		if e.URL != urls[i] || e.Samples != want[i].Samples || len(e.Offsets) != e.Samples || !slices.Equal(e.Offsets, want[i].Offsets) {
			t.Errorf("%s: shard %d: %s, %d samples, %d offsets; want %s, %d samples and the offsets of %s",
				name, i, e.URL, e.Samples, len(e.Offsets), urls[i], want[i].Samples, want[i].URL)
		}
	}
}

// copyStore returns a copy of the index store in dir, for one case alone.
func copyStore(t *testing.T, dir string) string {
	t.Helper()
	to := filepath.Join(t.TempDir(), "store")
	if out, err := exec.Command("cp", "-a", dir, to).CombinedOutput(); err != nil {
		t.Fatalf("cp -a: %v: %s", err, out)
	}
	return to
}

// checkCopies indexes the dataset of c in "a" with an index store of its own, then
// copies it (each case to a directory of its own) and checks that every index
// written of the copy has every shard's offsets: by "shardload index" to the
// copy's directory and to stdout, with the store that indexed "a", a fresh one, or
// none; and by it after a loader (Lookup.Quick with the offsets left in the index
// beside the copy, then Plan) looked the copy up with such a store.
func checkCopies(t *testing.T, c copied) {
	ctx := context.Background()
	storeA := filepath.Join(t.TempDir(), "store")
	r := shardload(t, "", append(c.env, "SHARDLOAD_INDEX_DIR="+storeA), "index", "--output", c.output("a"), c.pattern("a"))
	if r.code != 0 {
		t.Fatalf("index of a: exit %d: %s", r.code, r.stderr)
	}
	want, err := index.Read(bytes.NewReader(c.read("a")), "a")
	if err != nil {
		t.Fatal(err)
	}
	checkIndexed(t, "a", r, c.read("a"), c.urls("a"), want)
	if t.Failed() {
		t.FailNow()
	}

	cases := []struct {
		name  string
		store string // "same": a copy of the store that indexed a; "fresh"; "none": --no-index-store
		out   bool   // --output to the copy's directory; otherwise stdout
	}{
		{"same store, --output", "same", true},
		{"same store, stdout", "same", false},
		{"fresh store, --output", "fresh", true},
		{"fresh store, stdout", "fresh", false},
		{"no store, --output", "none", true},
		{"no store, stdout", "none", false},
	}
	for k, cs := range cases {
		dir := fmt.Sprintf("b%d", k)
		c.copyTo(dir)
		env := slices.Clone(c.env)
		args := []string{"index"}
		switch cs.store {
		case "same":
			env = append(env, "SHARDLOAD_INDEX_DIR="+copyStore(t, storeA))
		case "fresh":
			env = append(env, "SHARDLOAD_INDEX_DIR="+filepath.Join(t.TempDir(), "store"))
		case "none":
			args = append(args, "--no-index-store")
		}
		if cs.out {
			args = append(args, "--output", c.output(dir))
		}
		r := shardload(t, "", env, append(args, c.pattern(dir))...)
		data := r.stdout
		if cs.out {
			data = c.read(dir)
		}
		checkIndexed(t, cs.name, r, data, c.urls(dir), want)
	}

	for k, same := range []bool{true, false} {
		dir := fmt.Sprintf("c%d", k)
		name := fmt.Sprintf("a loader over %s (with the store of a: %v)", dir, same)
		c.copyTo(dir)
		storeDir := filepath.Join(t.TempDir(), "store")
		if same {
			storeDir = copyStore(t, storeA)
		}
		store, err := index.OpenStore(storeDir)
		if err != nil {
			t.Fatal(err)
		}
		urls := c.urls(dir)
		lk := index.Lookup{Sources: c.reg, Store: store, LazyOffsets: true}
		infos, err := lk.Quick(ctx, urls, 4)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if n := index.Deferred(infos); n != len(urls) {
			t.Errorf("%s: the offsets of %d of %d shards left in the index, want every shard's", name, n, len(urls))
		}
		for i, e := range infos {
			if e.URL != urls[i] || e.Samples != want[i].Samples || e.Estimated {
				t.Errorf("%s: shard %d: %s, %d samples (estimated %v); want %s, %d", name, i, e.URL, e.Samples, e.Estimated, urls[i], want[i].Samples)
			}
		}
		inPart := 0
		for rank := range 4 {
			planFn := func(in []shard.Info) (plan.Plan, error) {
				return plan.New(in, plan.Config{Seed: 7, Rank: rank, World: 4, Shuffle: true, BatchSize: 8, DropLast: true, GapBytes: 1, Window: 64, Lanes: 2})
			}
			got, p, err := index.Plan(ctx, infos, planFn)
			if err != nil {
				t.Fatalf("%s: rank %d: %v", name, rank, err)
			}
			for i, part := range p.InPart(got) {
				if !part {
					continue
				}
				inPart++
				if !slices.Equal(got[i].Offsets, want[i].Offsets) {
					t.Errorf("%s: rank %d reads shard %d in part with %d offsets, want those of %s (%d)", name, rank, i, len(got[i].Offsets), want[i].URL, len(want[i].Offsets))
				}
			}
		}
		if inPart == 0 {
			t.Errorf("%s: no rank reads a shard in part: the plans check no offsets", name)
		}
		// What the loader left in the store is what a later run takes.
		for _, e := range store.GetMany(urls) {
			if e.Version != "" && len(e.Offsets) == 0 {
				t.Errorf("%s: the store holds %s at version %s without its sample offsets", name, e.URL, e.Version)
			}
		}
		env := append(slices.Clone(c.env), "SHARDLOAD_INDEX_DIR="+storeDir)
		r := shardload(t, "", env, "index", c.pattern(dir))
		checkIndexed(t, name+", then index to stdout", r, r.stdout, urls, want)
		r = shardload(t, "", env, "index", "--output", c.output(dir), c.pattern(dir))
		checkIndexed(t, name+", then index --output", r, c.read(dir), urls, want)
	}
}

// TestIndexOfCopiedDatasetS3: a dataset indexed under s3://data/a/ and copied
// object by object with its shardload.index to other prefixes (CopyObject, which
// keeps the ETags: the copies have the names, versions and sizes of the originals) is
// indexed there with the sample offsets of every shard, however its entries are
// found: in the node's index store that indexed the first (under the old URLs), in
// the index beside the copies (read whole, or lazily as a loader reads it, with
// its offsets left in blocks), or by reading every shard again. A loader that
// found the copies' entries in the index beside them leaves the store nothing
// that a later "shardload index" takes for shards without offsets.
func TestIndexOfCopiedDatasetS3(t *testing.T) {
	m := testutil.MinIO(t)
	m.CreateBucket(t, "data")
	ctx := context.Background()
	paths, err := shardgen.Generate(t.TempDir(), copySpec)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range paths {
		data, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		m.Put(t, "data", "a/"+filepath.Base(p), data)
	}
	reg := &source.Registry{}
	reg.Register("s3", source.NewFetcher(&s3.Source{Client: m.Client}, source.FetchOptions{}))
	checkCopies(t, copied{
		env: m.Env(),
		reg: reg,
		copyTo: func(dir string) {
			t.Helper()
			list, err := m.Client.ListObjectsV2(ctx, &awss3.ListObjectsV2Input{Bucket: aws.String("data"), Prefix: aws.String("a/")})
			if err != nil {
				t.Fatal(err)
			}
			if len(list.Contents) != len(paths)+1 {
				t.Fatalf("%d objects under a/, want the %d shards and the index", len(list.Contents), len(paths))
			}
			for _, o := range list.Contents {
				dst := dir + "/" + strings.TrimPrefix(*o.Key, "a/")
				if _, err := m.Client.CopyObject(ctx, &awss3.CopyObjectInput{Bucket: aws.String("data"), Key: aws.String(dst), CopySource: aws.String("data/" + *o.Key)}); err != nil {
					t.Fatalf("copy %s to %s: %v", *o.Key, dst, err)
				}
				h, err := m.Client.HeadObject(ctx, &awss3.HeadObjectInput{Bucket: aws.String("data"), Key: aws.String(dst)})
				if err != nil {
					t.Fatal(err)
				}
				if aws.ToString(h.ETag) != aws.ToString(o.ETag) || aws.ToInt64(h.ContentLength) != aws.ToInt64(o.Size) {
					t.Fatalf("the copy %s has ETag %s and %d bytes, its original %s and %d", dst, aws.ToString(h.ETag), aws.ToInt64(h.ContentLength), aws.ToString(o.ETag), aws.ToInt64(o.Size))
				}
			}
		},
		pattern: func(dir string) string { return "s3://data/" + dir + "/" + copySpec.Pattern() },
		urls: func(dir string) []string {
			urls := make([]string, len(paths))
			for i, p := range paths {
				urls[i] = "s3://data/" + dir + "/" + filepath.Base(p)
			}
			return urls
		},
		output: func(dir string) string { return "s3://data/" + dir + "/" },
		read: func(dir string) []byte {
			t.Helper()
			out, err := m.Client.GetObject(ctx, &awss3.GetObjectInput{Bucket: aws.String("data"), Key: aws.String(dir + "/" + index.FileName)})
			if err != nil {
				t.Fatalf("get %s/%s: %v", dir, index.FileName, err)
			}
			defer out.Body.Close()
			b, err := io.ReadAll(out.Body)
			if err != nil {
				t.Fatal(err)
			}
			return b
		},
	})
}

// TestIndexOfCopiedDatasetLocal is TestIndexOfCopiedDatasetS3 for a local
// directory copied with its index by "cp -p", which keeps each file's size and
// modification time: its version.
func TestIndexOfCopiedDatasetLocal(t *testing.T) {
	root := t.TempDir()
	paths, err := shardgen.Generate(filepath.Join(root, "a"), copySpec)
	if err != nil {
		t.Fatal(err)
	}
	reg := &source.Registry{}
	reg.Register("file", &source.File{})
	checkCopies(t, copied{
		reg: reg,
		copyTo: func(dir string) {
			t.Helper()
			if out, err := exec.Command("cp", "-p", "-r", filepath.Join(root, "a"), filepath.Join(root, dir)).CombinedOutput(); err != nil {
				t.Fatalf("cp -p -r: %v: %s", err, out)
			}
			if _, err := os.Stat(filepath.Join(root, dir, index.FileName)); err != nil {
				t.Fatalf("the copy has no index: %v", err)
			}
		},
		pattern: func(dir string) string { return filepath.Join(root, dir, copySpec.Pattern()) },
		urls: func(dir string) []string {
			urls := make([]string, len(paths))
			for i, p := range paths {
				urls[i] = source.Canonical(filepath.Join(root, dir, filepath.Base(p)))
			}
			return urls
		},
		output: func(dir string) string { return filepath.Join(root, dir) + "/" },
		read: func(dir string) []byte {
			t.Helper()
			b, err := os.ReadFile(filepath.Join(root, dir, index.FileName))
			if err != nil {
				t.Fatal(err)
			}
			return b
		},
	})
}
