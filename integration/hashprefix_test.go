package integration

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"testing"

	sl "github.com/shardload/shardload"
	"github.com/shardload/shardload/internal/shardgen"
	"github.com/shardload/shardload/internal/testutil"
	"github.com/shardload/shardload/shard"
	"github.com/shardload/shardload/source"
	"github.com/shardload/shardload/source/s3"
)

// TestHashedPrefixesS3: a dataset in S3 (MinIO) under hashed key prefixes, laid out
// as gen --prefixes lays it out (s3://data/ds/<HashPrefix of the name>/train-N.tar),
// is named by one {hash:P} pattern, which no listing resolves: "shardload index"
// and "shardload cat" read every shard through it, and the two ranks of a job given
// the pattern and the index read every sample of the epoch exactly once.
func TestHashedPrefixesS3(t *testing.T) {
	m := testutil.MinIO(t)
	m.CreateBucket(t, "data")
	const shards, samples, prefixes = 10, 12, 4
	spec := shardgen.Spec{Shards: shards, SamplesPerShard: samples, Seed: 21, KeyPrefixes: prefixes,
		Fields: []shardgen.Field{{Ext: "bin", Kind: shardgen.Random, MinBytes: 100, MaxBytes: 900}, {Ext: "cls", Kind: shardgen.Class}}}
	paths, err := shardgen.Generate(t.TempDir(), spec)
	if err != nil {
		t.Fatal(err)
	}
	dirs := map[string]bool{}
	for i, p := range paths {
		data, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		key := "ds/" + spec.Path(i)
		if want := "ds/" + shard.HashPrefix(spec.Name(i), prefixes) + "/" + spec.Name(i); key != want {
			t.Fatalf("shard %d at %s, want %s", i, key, want)
		}
		dirs[key[:strings.LastIndexByte(key, '/')]] = true
		m.Put(t, "data", key, data)
	}
	if len(dirs) < 2 {
		t.Fatalf("%d shards in %d prefixes", shards, len(dirs))
	}
	pattern := "s3://data/ds/" + spec.Pattern()
	if !strings.Contains(pattern, "/{hash:4}/") {
		t.Fatalf("pattern %s", pattern)
	}

	r := shardload(t, "", m.Env(), "index", "--output", "s3://data/ds/", pattern)
	if r.code != 0 || !strings.Contains(r.stderr, shardsLine(shards, samples)) || strings.Contains(r.stderr, "give it --index") {
		t.Fatalf("index: exit %d: %s", r.code, r.stderr)
	}

	// cat: every sample of every shard, once.
	out := ok(t, m.Env(), "cat", pattern)
	catKeys := map[string]int{}
	tr := tar.NewReader(bytes.NewReader(out))
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("cat: %v", err)
		}
		if k, ext, _ := strings.Cut(h.Name, "."); ext == "cls" {
			catKeys[k]++
		}
	}

	// The library reads through a registry of this test's own: the default one keeps
	// the S3 client it made first, for the process's life.
	reg := &source.Registry{}
	reg.Register("s3", source.NewFetcher(&s3.Source{Client: m.Client}, source.FetchOptions{}))
	seen := map[string]int{}
	for rank := range 2 {
		for _, keys := range libraryKeys(t, sl.Config{URLs: []string{pattern}, NoIndexStore: true, Sources: reg, // the index in the prefixes' parent
			Fields: fields(t, "bin", "cls:int"), Seed: 4, Rank: rank, World: 2, BatchSize: 8, Logf: t.Logf}) {
			for _, k := range keys {
				seen[k]++
			}
		}
	}
	for i := range shards {
		for j := range samples {
			k := shardgen.Key(i, j)
			if seen[k] != 1 || catKeys[k] != 1 {
				t.Errorf("sample %s: read %d times by the job, %d times by cat; want once", k, seen[k], catKeys[k])
			}
		}
	}
	if len(seen) != shards*samples || len(catKeys) != shards*samples {
		t.Errorf("%d and %d distinct samples, want %d", len(seen), len(catKeys), shards*samples)
	}
}

// shardsLine is the start of index's summary for shards of samples each.
func shardsLine(shards, samples int) string {
	return fmt.Sprintf("shardload index: %d shards (%d with sample offsets), %d samples", shards, shards, shards*samples)
}
