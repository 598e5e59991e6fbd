package shard_test

import (
	"archive/tar"
	"bytes"
	"io"
	"testing"

	"github.com/shardload/shardload/internal/shardgen"
	"github.com/shardload/shardload/shard"
)

// benchShards are in-memory shards: image-like members (16-48 KiB) and small members
// (0.5-2 KiB), where per-member overhead dominates.
var benchShards = []struct {
	name string
	spec shardgen.Spec
}{
	{"images", shardgen.Spec{SamplesPerShard: 256}},
	{"small", shardgen.Spec{SamplesPerShard: 4096, Fields: []shardgen.Field{
		{Ext: "bin", MinBytes: 512, MaxBytes: 2048}, {Ext: "cls", Kind: shardgen.Class}}}},
}

func benchData(b *testing.B, spec shardgen.Spec) []byte {
	var buf bytes.Buffer
	if err := shardgen.WriteShard(&buf, spec, 0); err != nil {
		b.Fatal(err)
	}
	return buf.Bytes()
}

// BenchmarkRead compares shard.Reader (grouping samples, every member's bytes read into
// memory) with its baseline, Go's archive/tar reading the same bytes, each member into a
// reused buffer, with no grouping. Compare them with
//
//	go test -run '^$' -bench BenchmarkRead -count 10 ./shard/ > read.txt
//	benchstat -col /impl read.txt
func BenchmarkRead(b *testing.B) {
	for _, bs := range benchShards {
		data := benchData(b, bs.spec)
		b.Run("shape="+bs.name+"/impl=archive-tar", func(b *testing.B) {
			b.SetBytes(int64(len(data)))
			b.ReportAllocs()
			buf := make([]byte, 1<<20)
			for b.Loop() {
				tr := tar.NewReader(bytes.NewReader(data))
				for {
					h, err := tr.Next()
					if err == io.EOF {
						break
					}
					if err != nil {
						b.Fatal(err)
					}
					if _, err := io.ReadFull(tr, buf[:h.Size]); err != nil {
						b.Fatal(err)
					}
				}
			}
		})
		b.Run("shape="+bs.name+"/impl=shard", func(b *testing.B) {
			b.SetBytes(int64(len(data)))
			b.ReportAllocs()
			for b.Loop() {
				r := shard.NewReader(bytes.NewReader(data), shard.Options{})
				for {
					_, err := r.Next()
					if err == io.EOF {
						break
					}
					if err != nil {
						b.Fatal(err)
					}
				}
			}
		})
	}
}
