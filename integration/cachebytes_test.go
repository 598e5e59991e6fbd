package integration

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/shardload/shardload/internal/shardgen"
	"github.com/shardload/shardload/internal/testutil"
	"github.com/shardload/shardload/shard"
)

// TestBenchCacheBytesS3: bench over S3 (MinIO) with a node cache of both tiers,
// three epochs: what it reports per epoch (cache_epochs) says where the bytes came
// from: the first epoch's every byte from the store, the dataset once; the next
// ones' none from the store, from the disk tier and then the memory tier.
func TestBenchCacheBytesS3(t *testing.T) {
	m := testutil.MinIO(t)
	m.CreateBucket(t, "cachebytes")
	spec := shardgen.Spec{Shards: 4, Samples: []int{30, 31, 32, 33}, Compression: shard.Zstd, Fields: shardgen.Presets["tokens"]}
	_, shards := putShards(t, m, "cachebytes", "tok", "", spec)
	var stored int64
	for _, data := range shards {
		stored += int64(len(data))
	}
	pattern := "s3://cachebytes/tok/" + spec.Pattern()
	index := filepath.Join(t.TempDir(), "index.jsonl")
	if err := os.WriteFile(index, ok(t, m.Env(), "ls", "--summary", "--json", pattern), 0o644); err != nil {
		t.Fatal(err)
	}
	out := ok(t, m.Env(), "bench", "--json", "--index", index, "--cache-dir", t.TempDir(), "--cache-memory", "64MiB",
		"--batch-size", "8", "--field", "tokens=npy:npy:int32:2048", "--epochs", "3", pattern)
	var res struct {
		Cache []struct {
			Epoch   int     `json:"epoch"`
			Store   int64   `json:"store_bytes"`
			Memory  int64   `json:"memory_bytes"`
			Disk    int64   `json:"disk_bytes"`
			Joined  int64   `json:"joined_bytes"`
			HitRate float64 `json:"hit_rate"`
		} `json:"cache_epochs"`
	}
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatalf("bench --json printed %q: %v", out, err)
	}
	if len(res.Cache) != 3 {
		t.Fatalf("cache_epochs %+v, want 3 epochs", res.Cache)
	}
	t.Logf("stored %d bytes; epochs %+v", stored, res.Cache)
	e := res.Cache[0]
	if e.Store != stored || e.Memory != 0 || e.HitRate != 0 {
		t.Errorf("epoch 0: %+v, want the dataset's %d bytes from the store, no hit", e, stored)
	}
	for i, e := range res.Cache[1:] {
		if e.Epoch != i+1 || e.Store != 0 || e.HitRate != 1 || e.Memory+e.Disk+e.Joined < stored {
			t.Errorf("epoch %d: %+v, want the dataset's %d bytes from the cache, none from the store", i+1, e, stored)
		}
	}
	if res.Cache[1].Disk == 0 || res.Cache[2].Memory == 0 {
		t.Errorf("epochs 1 and 2: %+v; want bytes from disk, then from memory", res.Cache[1:])
	}
}
