package integration

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/shardload/shardload/internal/testutil"
)

// TestCacheFlipKeepingTimeIsFound: one byte flipped in the middle of a warmed cache
// entry's data file, its modification time set back as it was (as a change of the
// bytes under the file system, or touch -r, leaves it), is found by the next cat of
// the same boot: cat writes the shard's samples as the store holds them, fetched
// again from the bad block on, and --stats counts one corrupt entry; the log names
// the shard and the block.
func TestCacheFlipKeepingTimeIsFound(t *testing.T) {
	m := testutil.MinIO(t)
	urls, _, paths := cacheDataset(t, m, 1)
	proxy := newCacheProxy(t, m)
	env := proxy.env(m)
	dir := t.TempDir()
	ok(t, env, "warm", "--cache-dir", dir, urls[0])
	// A first cat from the cache: every block served, and checked, once already.
	got := ok(t, env, "cat", "--cache-dir", dir, urls[0])
	want := regroup(t, decompressed(t, paths[0]))
	sameSamples(t, regroup(t, bytes.NewReader(got)), want)

	path := filepath.Join(dir, "v1", cacheFiles(t, dir)["data"][0])
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	var b [1]byte
	mid := fi.Size() / 2
	if _, err := f.ReadAt(b[:], mid); err != nil {
		t.Fatal(err)
	}
	b[0] ^= 0x01
	if _, err := f.WriteAt(b[:], mid); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if err := os.Chtimes(path, fi.ModTime(), fi.ModTime()); err != nil {
		t.Fatal(err)
	}

	before := proxy.count("/shards/train/train-000000.tar")
	r := shardload(t, "", env, "cat", "--stats", "--cache-dir", dir, urls[0])
	if r.code != 0 {
		t.Fatalf("cat of the flipped entry: exit %d: %s", r.code, r.stderr)
	}
	sameSamples(t, regroup(t, bytes.NewReader(r.stdout)), want)
	if proxy.count("/shards/train/train-000000.tar") == before {
		t.Errorf("the flipped entry was not fetched again (stderr: %s)", r.stderr)
	}
	if !strings.Contains(r.stderr, " 1 corrupt") || !strings.Contains(r.stderr, "checksum") || !strings.Contains(r.stderr, urls[0]) || !strings.Contains(r.stderr, "block ") {
		t.Errorf("stderr %q: want a line naming %s, the block and its checksum, and 1 corrupt entry counted", r.stderr, urls[0])
	}
}
