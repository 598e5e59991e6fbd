package integration

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/shardload/shardload/internal/shardgen"
	"github.com/shardload/shardload/internal/testutil"
)

// TestCacheSharedByServeAndWarm: one cache directory for every process of a node.
// While a trainer reads dataset A through serve (paused mid-epoch, its shards open),
// warm pre-fills dataset B into the same directory; a warm killed mid-fill leaves
// serve unaffected and the next warm completes; a second serve then reads B from
// the cache alone, and the directory stays within its budget throughout.
func TestCacheSharedByServeAndWarm(t *testing.T) {
	py := python(t)
	m := testutil.MinIO(t)
	m.CreateBucket(t, "shards")
	var total int64
	keysOf := map[string][]string{}
	for _, name := range []string{"a", "b"} {
		spec := shardgen.Spec{Shards: 3, SamplesPerShard: 24, Seed: 7, Prefix: name}
		_, shards := putShards(t, m, "shards", "train", "", spec)
		for _, data := range shards {
			total += int64(len(data))
			for _, s := range regroup(t, bytes.NewReader(data)) {
				keysOf[name] = append(keysOf[name], s.key)
			}
		}
	}
	patternA := "s3://shards/train/a-{000000..000002}.tar"
	patternB := "s3://shards/train/b-{000000..000002}.tar"
	proxy := newCacheProxy(t, m)
	env := proxy.env(m)
	dir := t.TempDir()
	budget := total + total/4 // both datasets fit, with little to spare
	cacheFlags := []string{"--cache-dir", dir, "--cache-disk", itoa(budget)}
	checkBudget := func(when string) {
		t.Helper()
		if n, names := dirBytes(t, dir); n > budget {
			t.Fatalf("%s: the cache directory holds %d bytes (%d files), budget %d", when, n, len(names), budget)
		}
	}

	// Counted first: an epoch planned from estimated counts is padded or trimmed
	// to its plan, and this epoch is checked for every sample once.
	srvA := startServerEnv(t, env, "", append(cacheFlags, "--workers", "2", "--count-first", patternA)...)
	tr := startTrainer(t, py, srvA.socket, -1, "--seed", "3", "--batch-size", "8", "--pause-after", "2")
	for {
		if l := tr.line(t); l.Paused == 2 {
			break
		} else if l.Error != "" {
			t.Fatalf("trainer: %s: %s", l.Error, l.Message)
		}
	}

	// warm B, held mid-download, killed with SIGKILL.
	held := "/shards/train/b-000001.tar"
	hold := &cacheHold{path: held, n: 100_000, reached: make(chan struct{}), release: make(chan struct{})}
	proxy.setHold(hold)
	cmd := cacheCommand(env, append([]string{"warm", "--concurrency", "1"}, append(cacheFlags, patternB)...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-hold.reached:
	case <-t.Context().Done():
		t.Fatal("warm never reached the held download")
	}
	if files := cacheFiles(t, dir); len(files["tmp"]) != 1 {
		t.Fatalf("cache files while warm fills b-000001: %v; want its temporary file", files)
	}
	cmd.Process.Kill()
	cmd.Wait()
	close(hold.release)
	proxy.setHold(nil)
	checkBudget("after the kill")

	// The next warm completes, beside the serve still mid-epoch.
	out := string(ok(t, env, append([]string{"warm"}, append(cacheFlags, patternB)...)...))
	if !strings.Contains(out, "fetched") {
		t.Fatalf("second warm:\n%s", out)
	}
	again := string(ok(t, env, append([]string{"warm"}, append(cacheFlags, patternB)...)...))
	if !strings.Contains(again, "3 cached, 0 to fetch") {
		t.Fatalf("a third warm should find B cached:\n%s", again)
	}
	checkBudget("after warming B")

	// serve's trainer finishes epoch A, every sample once.
	io.WriteString(tr.stdin, "go\n")
	batches, errLine := tr.run(t)
	if errLine != nil {
		t.Fatalf("trainer of A: %s: %s", errLine.Error, errLine.Message)
	}
	var gotA []string
	for _, b := range batches {
		gotA = append(gotA, b.Keys...)
	}
	// The first two batches were printed before the pause.
	if len(gotA)+16 != len(keysOf["a"]) {
		t.Fatalf("trainer of A: %d samples after the pause, want %d", len(gotA), len(keysOf["a"])-16)
	}

	// A second serve reads B from the cache alone.
	var before int
	for i := range 3 {
		before += proxy.count("/shards/train/b-00000" + itoa(int64(i)) + ".tar")
	}
	srvB := startServerEnv(t, env, "", append(cacheFlags, "--count-first", patternB)...) // counted from the cache
	trB := startTrainer(t, py, srvB.socket, -1, "--seed", "3", "--batch-size", "8")
	batchesB, errB := trB.run(t)
	if errB != nil {
		t.Fatalf("trainer of B: %s: %s", errB.Error, errB.Message)
	}
	var gotB []string
	for _, b := range batchesB {
		gotB = append(gotB, b.Keys...)
	}
	slices.Sort(gotB)
	wantB := slices.Clone(keysOf["b"])
	slices.Sort(wantB)
	if !slices.Equal(gotB, wantB) {
		t.Fatalf("trainer of B: %d keys, want the %d of B", len(gotB), len(wantB))
	}
	var after int
	for i := range 3 {
		after += proxy.count("/shards/train/b-00000" + itoa(int64(i)) + ".tar")
	}
	if after != before {
		t.Errorf("serve fetched B's objects %d times: want them all from the cache", after-before)
	}
	checkBudget("at the end")
	if files := cacheFiles(t, dir); len(files["tmp"]) != 0 || len(files["data"]) != 6 {
		t.Errorf("cache files at the end: %v; want the six shards and no temporary file", files)
	}
	locks, _ := filepath.Glob(filepath.Join(dir, "v1", "*.lock"))
	if len(locks) != 0 {
		t.Errorf("fill locks left behind: %v", locks)
	}
}

// dirBytes sums the sizes of the cache directory's files (entries, temporary files,
// fill locks; the lock and budget files are a few bytes).
func dirBytes(t *testing.T, dir string) (total int64, names []string) {
	t.Helper()
	ents, err := os.ReadDir(filepath.Join(dir, "v1"))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if fi, err := e.Info(); err == nil && fi.Mode().IsRegular() {
			total += fi.Size()
			names = append(names, e.Name())
		}
	}
	return total, names
}
