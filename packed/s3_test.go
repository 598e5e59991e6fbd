package packed_test

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/shardload/shardload/internal/testutil"
	"github.com/shardload/shardload/megatron"
	"github.com/shardload/shardload/pack"
	"github.com/shardload/shardload/packed"
	"github.com/shardload/shardload/source"
	"github.com/shardload/shardload/source/s3"
)

// Packed epochs read from S3 (a real MinIO, by ranges) equal those read from local
// files: tar shards and a Megatron dataset.
func TestPackedFromS3(t *testing.T) {
	srv := testutil.MinIO(t)
	srv.SetEnv(t)
	// A registry of this test's own: an S3 source builds its client once, from the
	// environment of its first use (this server's, not an earlier run's).
	reg := &source.Registry{}
	reg.Register("file", &source.File{})
	s3.Register(reg, source.FetchOptions{})
	srv.CreateBucket(t, "tok")
	const seqLen = 48
	docs := corpusDocs(150, seqLen, 5)
	dir := t.TempDir()
	spec := pack.Spec{Field: "tokens.npy", SeqLen: seqLen, HasEOS: true, EOS: 65535, Pad: 65535}
	local := writeShards(t, dir, docs, 20, "<u2")
	idx := writeMegatron(t, dir, docs, megatron.Uint16)
	var remote []string
	for _, p := range append(slices.Clone(local), idx, filepath.Join(dir, "corpus.bin")) {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		srv.Put(t, "tok", "train/"+filepath.Base(p), b)
		remote = append(remote, "s3://tok/train/"+filepath.Base(p))
	}
	for _, tc := range []struct {
		name          string
		local, remote []string
		field         string
	}{
		{"tar", local, remote[:len(local)], "tokens.npy"},
		{"megatron", []string{idx}, []string{remote[len(local)]}, "tokens"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := spec
			s.Field = tc.field
			for _, world := range []int{1, 2} {
				for r := range world {
					cfg := packed.Config{Pack: s, BatchSize: 2, Seed: 11, Rank: r, World: world, ShuffleBuffer: 20, ReadGap: 1, Logf: t.Logf, Sources: reg}
					cfg.URLs = tc.local
					want, _, _, _ := epoch(t, cfg)
					cfg.URLs = tc.remote
					got, _, _, _ := epoch(t, cfg)
					if !slices.EqualFunc(got, want, slices.Equal) {
						t.Errorf("world %d rank %d: the batches read from S3 differ from the local files'", world, r)
					}
				}
			}
		})
	}
}
