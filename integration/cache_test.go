package integration

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/shardload/shardload/cache"
	"github.com/shardload/shardload/internal/shardgen"
	"github.com/shardload/shardload/internal/testutil"
	"github.com/shardload/shardload/source"
	"github.com/shardload/shardload/source/s3"
)

// cacheProxy is a reverse proxy in front of MinIO that counts GET requests per
// object path and can hold a GET's body after some bytes until released.
type cacheProxy struct {
	srv   *httptest.Server
	mu    sync.Mutex
	gets  map[string]int
	heads map[string]int
	hold  *cacheHold
}

// cacheHold stops the body of GETs of path after n bytes: reached is closed when the
// first one gets there, and they go on when release is closed.
type cacheHold struct {
	path             string
	n                int64
	reached, release chan struct{}
	once             sync.Once
}

func newCacheProxy(t *testing.T, m *testutil.MinIOServer) *cacheProxy {
	t.Helper()
	target, err := url.Parse(m.Endpoint)
	if err != nil {
		t.Fatal(err)
	}
	p := &cacheProxy{gets: map[string]int{}, heads: map[string]int{}}
	rp := httputil.NewSingleHostReverseProxy(target)
	rp.FlushInterval = -1 // pass bytes on as they come, so a held body is partly sent
	rp.ModifyResponse = func(resp *http.Response) error {
		req := resp.Request
		p.mu.Lock()
		defer p.mu.Unlock()
		if req.Method == http.MethodHead {
			p.heads[req.URL.Path]++
		}
		if req.Method != http.MethodGet {
			return nil
		}
		p.gets[req.URL.Path]++
		if h := p.hold; h != nil && req.URL.Path == h.path {
			resp.Body = &heldBody{ReadCloser: resp.Body, h: h, ctx: req.Context()}
		}
		return nil
	}
	// The request keeps the proxy's Host header, which is what the client signed.
	p.srv = httptest.NewServer(rp)
	t.Cleanup(p.srv.Close)
	return p
}

// setHold holds GETs of h.path from now on. (Under the lock: the proxy's handler
// goroutines read it, and a request that crossed a subprocess and a socket gives the
// race detector no ordering to go by.)
func (p *cacheProxy) setHold(h *cacheHold) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.hold = h
}

func (p *cacheProxy) count(path string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.gets[path]
}

// countHeads returns the HEAD requests of path MinIO answered.
func (p *cacheProxy) countHeads(path string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.heads[path]
}

// env points a subprocess's AWS configuration at the proxy.
func (p *cacheProxy) env(m *testutil.MinIOServer) []string {
	return append(m.Env(), "AWS_ENDPOINT_URL="+p.srv.URL, "AWS_ENDPOINT_URL_S3="+p.srv.URL)
}

type heldBody struct {
	io.ReadCloser
	h    *cacheHold
	ctx  context.Context
	sent int64
}

func (b *heldBody) Read(p []byte) (int, error) {
	if b.sent >= b.h.n {
		b.h.once.Do(func() { close(b.h.reached) })
		select {
		case <-b.h.release:
		case <-b.ctx.Done():
			return 0, b.ctx.Err()
		}
	} else if int64(len(p)) > b.h.n-b.sent {
		p = p[:b.h.n-b.sent]
	}
	n, err := b.ReadCloser.Read(p)
	b.sent += int64(n)
	return n, err
}

// cacheDataset writes shards locally and to MinIO and returns their s3 URLs, the
// samples they hold, and the local paths.
func cacheDataset(t *testing.T, m *testutil.MinIOServer, shards int) (urls []string, want []refSample, paths []string) {
	t.Helper()
	m.CreateBucket(t, "shards")
	spec := shardgen.Spec{Shards: shards, SamplesPerShard: 40, Seed: 6}
	paths, data := putShards(t, m, "shards", "train", "", spec)
	for i, p := range paths {
		urls = append(urls, "s3://shards/train/"+filepath.Base(p))
		want = append(want, regroup(t, bytes.NewReader(data[i]))...)
	}
	return urls, want, paths
}

// cacheFiles lists the cache's files by kind: "data", "meta", "tmp".
func cacheFiles(t *testing.T, dir string) map[string][]string {
	t.Helper()
	ents, err := os.ReadDir(filepath.Join(dir, "v1"))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]string{}
	for _, e := range ents {
		n := e.Name()
		switch {
		case strings.HasPrefix(n, "tmp-"):
			out["tmp"] = append(out["tmp"], n)
		case strings.HasSuffix(n, ".data"):
			out["data"] = append(out["data"], n)
		case strings.HasSuffix(n, ".meta"):
			out["meta"] = append(out["meta"], n)
		}
	}
	return out
}

func TestCacheWarmThenCatWithSourceStopped(t *testing.T) {
	m := testutil.MinIO(t)
	urls, want, _ := cacheDataset(t, m, 4)
	dir := t.TempDir()
	pattern := "s3://shards/train/train-{000000..000003}.tar"

	dry := string(ok(t, m.Env(), "warm", "--cache-dir", dir, "--dry-run", pattern))
	if !strings.Contains(dry, "4 to fetch") || !strings.Contains(dry, "fits") || strings.Count(dry, "would fetch") != 4 {
		t.Fatalf("dry run:\n%s", dry)
	}
	if files := cacheFiles(t, dir); len(files["data"]) != 0 {
		t.Fatalf("a dry run cached %v", files["data"])
	}
	out := string(ok(t, m.Env(), "warm", "--cache-dir", dir, pattern))
	if !strings.Contains(out, "fetched 4 shards") || strings.Count(out, "warm: ") < 5 {
		t.Fatalf("warm output (plain lines expected off a terminal):\n%s", out)
	}
	again := string(ok(t, m.Env(), "warm", "--cache-dir", dir, pattern))
	if !strings.Contains(again, "4 cached, 0 to fetch") {
		t.Fatalf("second warm should fetch nothing:\n%s", again)
	}

	m.Stop()
	r := shardload(t, "", m.Env(), "cat", "--stats", "--cache-dir", dir, pattern)
	if r.code != 0 {
		t.Fatalf("cat with the source stopped: exit %d: %s", r.code, r.stderr)
	}
	got := r.stdout
	sameSamples(t, regroup(t, bytes.NewReader(got)), want)
	// --stats says what the cache did: every shard from disk, nothing fetched.
	if stats := r.stderr; !strings.Contains(stats, "cache: 4 opens from disk, 0 from memory, 0 fetched") {
		t.Errorf("cat --stats with the source stopped:\n%s", stats)
	}
	ls := string(ok(t, m.Env(), "ls", "--summary", "--cache-dir", dir, urls[0]))
	if !strings.Contains(ls, "40 samples") {
		t.Errorf("ls with the source stopped: %s", ls)
	}
	// Without the cache the same command fails: the cache is what served it.
	if r := shardload(t, "", m.Env(), "cat", "--retry-budget=1s", pattern); r.code == 0 {
		t.Error("cat without the cache succeeded with MinIO stopped")
	}
}

func TestCacheWarmKilledMidDownload(t *testing.T) {
	m := testutil.MinIO(t)
	urls, want, _ := cacheDataset(t, m, 3)
	proxy := newCacheProxy(t, m)
	held := "/shards/train/train-000001.tar"
	hold := &cacheHold{path: held, n: 100_000, reached: make(chan struct{}), release: make(chan struct{})}
	proxy.setHold(hold)
	dir := t.TempDir()

	cmd := cacheCommand(proxy.env(m), "warm", "--cache-dir", dir, "--concurrency", "1", urls[0], urls[1], urls[2])
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-hold.reached:
	case <-t.Context().Done():
		t.Fatal("the download never reached the hold")
	}
	// The second shard is half written to a temporary file: kill the process now.
	if files := cacheFiles(t, dir); len(files["tmp"]) != 1 || len(files["data"]) != 1 {
		t.Fatalf("cache files at the kill: %v; want one entry and one temporary file", files)
	}
	cmd.Process.Kill()
	cmd.Wait()
	close(hold.release)
	proxy.setHold(nil)

	// The next start drops the partial file, serves the finished shard from the cache
	// and fetches the others.
	before0, before1 := proxy.count("/shards/train/train-000000.tar"), proxy.count(held)
	got := ok(t, proxy.env(m), "cat", "--cache-dir", dir, urls[0], urls[1], urls[2])
	sameSamples(t, regroup(t, bytes.NewReader(got)), want)
	if n := proxy.count("/shards/train/train-000000.tar") - before0; n != 0 {
		t.Errorf("the shard warmed before the kill was fetched %d more times", n)
	}
	if n := proxy.count(held) - before1; n == 0 {
		t.Error("the shard cut short by the kill was not fetched again")
	}
	if files := cacheFiles(t, dir); len(files["tmp"]) != 0 || len(files["data"]) != 3 || len(files["meta"]) != 3 {
		t.Errorf("cache files after the restart: %v", files)
	}
	m.Stop()
	got = ok(t, proxy.env(m), "cat", "--cache-dir", dir, urls[0], urls[1], urls[2])
	sameSamples(t, regroup(t, bytes.NewReader(got)), want)
}

func TestCacheBudgetCorruptionAndNewVersion(t *testing.T) {
	m := testutil.MinIO(t)
	urls, want, paths := cacheDataset(t, m, 6)
	proxy := newCacheProxy(t, m)
	env := proxy.env(m)
	var one int64
	for _, p := range paths {
		fi, _ := os.Stat(p)
		one = max(one, fi.Size())
	}
	// Room for about three of the six shards: reading all of them is twice the budget.
	budget := 3*one + 3*8192
	dir := t.TempDir()
	got := ok(t, env, append([]string{"cat", "--cache-dir", dir, "--cache-disk", itoa(budget)}, urls...)...)
	sameSamples(t, regroup(t, bytes.NewReader(got)), want)
	var onDisk int64
	filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			fi, _ := d.Info()
			onDisk += fi.Size()
		}
		return nil
	})
	if onDisk > budget || onDisk < one {
		t.Fatalf("%d bytes in the cache directory after reading %d shards of up to %d bytes; budget %d", onDisk, len(urls), one, budget)
	}

	// Flip one byte of a cached shard: it is detected, refetched, and served right.
	dir2 := t.TempDir()
	ok(t, env, "warm", "--cache-dir", dir2, urls[0])
	files := cacheFiles(t, dir2)
	path := filepath.Join(dir2, "v1", files["data"][0])
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	data[len(data)/2] ^= 1
	os.WriteFile(path, data, 0o600)
	before := proxy.count("/shards/train/train-000000.tar")
	r := shardload(t, "", env, "cat", "--cache-dir", dir2, urls[0])
	if r.code != 0 {
		t.Fatalf("cat of a corrupted entry: exit %d: %s", r.code, r.stderr)
	}
	sameSamples(t, regroup(t, bytes.NewReader(r.stdout)), regroup(t, decompressed(t, paths[0])))
	if proxy.count("/shards/train/train-000000.tar") == before || !strings.Contains(r.stderr, "checksum") {
		t.Errorf("the corrupted entry was not refetched (stderr: %s)", r.stderr)
	}

	// A new object at the same key (a new ETag) is fetched, not served from the cache,
	// once no check of the node (the last cat's, within --cache-validate-within) serves:
	// here at once, with the checks not shared.
	other, err := os.ReadFile(paths[1])
	if err != nil {
		t.Fatal(err)
	}
	m.Put(t, "shards", "train/train-000000.tar", other)
	got = ok(t, env, "cat", "--cache-dir", dir2, "--cache-validate-within", "0", urls[0])
	sameSamples(t, regroup(t, bytes.NewReader(got)), regroup(t, bytes.NewReader(other)))
}

// TestCacheColdFillOneStat: a shard the cache does not hold, opened through the
// cache over the fetcher (as the loader and cat read with --cache-dir), costs one
// HEAD (the open's check of the version) and one GET: the fetch reads the version
// and size that check found, pinned to that version, without asking again. Every
// way in: Open (no index), OpenVersion (a count from an index), and a Stat (a
// loader's estimate from the object's size) followed by an Open and a second Open
// that joins the fill, which the Stat's check serves as a cached copy's would.
func TestCacheColdFillOneStat(t *testing.T) {
	m := testutil.MinIO(t)
	urls, _, paths := cacheDataset(t, m, 3)
	proxy := newCacheProxy(t, m)
	for _, kv := range proxy.env(m) {
		k, v, _ := strings.Cut(kv, "=")
		t.Setenv(k, v)
	}
	t.Setenv("AWS_CONFIG_FILE", os.DevNull)
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", os.DevNull)
	reg := &source.Registry{}
	reg.Register("s3", source.NewFetcher(&s3.Source{}, source.FetchOptions{}))
	c, err := cache.New(cache.Options{Dir: t.TempDir(), Logf: t.Logf}, reg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := t.Context()
	info, err := reg.Stat(ctx, urls[1]) // the version an index records
	if err != nil {
		t.Fatal(err)
	}
	opens := []func() (io.ReadCloser, error){
		func() (io.ReadCloser, error) { return c.Open(ctx, urls[0]) },
		func() (io.ReadCloser, error) { return c.OpenVersion(ctx, urls[1], info.Version, 0, -1) },
		func() (io.ReadCloser, error) {
			if _, err := c.Stat(ctx, urls[2]); err != nil {
				return nil, err
			}
			r, err := c.Open(ctx, urls[2])
			if err != nil {
				return nil, err
			}
			r2, err := c.Open(ctx, urls[2]) // joins the fill, or opens the copy
			if err != nil {
				r.Close()
				return nil, err
			}
			r2.Close()
			return r, nil
		},
	}
	for i, open := range opens {
		path := "/shards/train/" + filepath.Base(paths[i])
		heads0 := proxy.countHeads(path)
		r, err := open()
		if err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(r)
		r.Close()
		want, _ := os.ReadFile(paths[i])
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("%s: %d bytes, %v; want the object's %d", path, len(got), err, len(want))
		}
		if heads, gets := proxy.countHeads(path)-heads0, proxy.count(path); heads != 1 || gets != 1 {
			t.Errorf("%s, a cold fill: %d HEAD and %d GET requests reached MinIO; want 1 and 1", path, heads, gets)
		}
	}
	if st := c.Stats(); st.Fetches != 3 {
		t.Errorf("stats %+v: want 3 fetches", st)
	}
}

// TestCacheConcurrentReadersOneFetch opens one uncached shard from many goroutines of
// one process, with S3 behind a proxy that counts the GETs MinIO answers.
func TestCacheConcurrentReadersOneFetch(t *testing.T) {
	const readers = 12
	m := testutil.MinIO(t)
	urls, _, paths := cacheDataset(t, m, 1)
	want, err := os.ReadFile(paths[0])
	if err != nil {
		t.Fatal(err)
	}
	proxy := newCacheProxy(t, m)
	path := "/shards/train/train-000000.tar"
	// Hold the body before its first byte, so that every open meets the fetch in
	// flight.
	hold := &cacheHold{path: path, n: 0, reached: make(chan struct{}), release: make(chan struct{})}
	proxy.setHold(hold)
	for _, kv := range proxy.env(m) {
		k, v, _ := strings.Cut(kv, "=")
		t.Setenv(k, v)
	}
	t.Setenv("AWS_CONFIG_FILE", os.DevNull)
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", os.DevNull)
	c, err := cache.New(cache.Options{Dir: t.TempDir(), Logf: t.Logf}, &s3.Source{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	rs := make([]io.ReadCloser, readers)
	var wg sync.WaitGroup
	for i := range rs {
		wg.Go(func() {
			r, err := c.Open(t.Context(), urls[0])
			if err != nil {
				t.Error(err)
				return
			}
			rs[i] = r
		})
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	close(hold.release)
	for i, r := range rs {
		wg.Go(func() {
			defer r.Close()
			got, err := io.ReadAll(r)
			if err != nil || !bytes.Equal(got, want) {
				t.Errorf("reader %d: %d bytes, %v; want the object's %d", i, len(got), err, len(want))
			}
		})
	}
	wg.Wait()
	if n := proxy.count(path); n != 1 {
		t.Errorf("%d GET requests reached MinIO for %d concurrent readers; want 1", n, readers)
	}
	if st := c.Stats(); st.Fetches != 1 || st.Joined != readers-1 {
		t.Errorf("stats %+v", st)
	}
}

// cacheCommand returns the binary's command with args, run as the shardload helper
// runs it (no AWS or SHARDLOAD configuration from the caller's environment) plus env,
// for tests that must signal the process.
func cacheCommand(env []string, args ...string) *exec.Cmd {
	cmd := exec.Command(bin, args...)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "AWS_") && !strings.HasPrefix(kv, "SHARDLOAD_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, "AWS_EC2_METADATA_DISABLED=true", "AWS_CONFIG_FILE=/dev/null", "AWS_SHARED_CREDENTIALS_FILE=/dev/null")
	cmd.Env = append(cmd.Env, env...)
	return cmd
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }
