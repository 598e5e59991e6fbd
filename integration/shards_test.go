package integration

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/shardload/shardload/internal/shardgen"
	"github.com/shardload/shardload/internal/testutil"
)

// putShards generates spec's shards in dir (a new temporary directory when dir is
// "") and puts each into bucket (which must exist) as prefix/NAME. It returns the
// local paths and each shard's bytes, in order.
func putShards(t *testing.T, m *testutil.MinIOServer, bucket, prefix, dir string, spec shardgen.Spec) (paths []string, data [][]byte) {
	t.Helper()
	if dir == "" {
		dir = t.TempDir()
	}
	paths, err := shardgen.Generate(dir, spec)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		m.Put(t, bucket, prefix+"/"+filepath.Base(p), b)
		data = append(data, b)
	}
	return paths, data
}
