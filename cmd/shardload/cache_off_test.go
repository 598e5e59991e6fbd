package main

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// captureStderr returns what fn writes to os.Stderr, where the cache's warnings go.
func captureStderr(t *testing.T, fn func()) string {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	old := os.Stderr
	os.Stderr = w
	done := make(chan string)
	go func() {
		b, _ := io.ReadAll(r)
		done <- string(b)
	}()
	defer func() { os.Stderr = old }()
	fn()
	os.Stderr = old
	w.Close()
	return <-done
}

// unusableCacheDirs returns cache directories that cannot be opened: a file where the
// directory should be (as a read-only or unwritable directory fails, and also for
// root), and a directory another process holds.
func unusableCacheDirs(t *testing.T) map[string]string {
	notDir := filepath.Join(t.TempDir(), "cache")
	if err := os.WriteFile(notDir, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	// A directory an older shardload holds alone (its lock taken exclusively).
	busy := t.TempDir()
	if err := os.MkdirAll(filepath.Join(busy, "v1"), 0o700); err != nil {
		t.Fatal(err)
	}
	lock, err := os.OpenFile(filepath.Join(busy, "v1", "lock"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lock.Close() })
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	return map[string]string{"not a directory": notDir, "held by another process": busy}
}

// A cache directory that cannot be used does not stop a command that reads local
// files, which are never cached.
func TestUnusableCacheDirLocalFiles(t *testing.T) {
	local := "../../testdata/aistore__small-mnist-3.tar"
	abs, err := filepath.Abs(local)
	if err != nil {
		t.Fatal(err)
	}
	for why, dir := range unusableCacheDirs(t) {
		for _, url := range []string{local, "file://" + abs} {
			var code int
			var stdout, stderr string
			captureStderr(t, func() { code, stdout, stderr = runCLI(t, "ls", "--summary", "--cache-dir", dir, url) })
			if code != 0 || !strings.Contains(stdout, "3 samples") {
				t.Errorf("cache dir %s: ls %s: exit %d, stdout %q, stderr %q; want the shard listed", why, url, code, stdout, stderr)
			}
		}
	}
}

// A remote shard with a cache directory that cannot be used is read from its source,
// with one warning that says the cache is off and why.
func TestUnusableCacheDirRemoteShard(t *testing.T) {
	data, err := os.ReadFile("../../testdata/aistore__small-mnist-3.tar")
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("ETag", `"1"`)
		http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(data))
	}))
	defer srv.Close()
	wants := map[string]string{"not a directory": "not a directory", "held by another process": "held by another process"}
	for why, dir := range unusableCacheDirs(t) {
		var code int
		var stdout, stderr string
		warn := captureStderr(t, func() {
			code, stdout, stderr = runCLI(t, "ls", "--summary", "--cache-dir", dir, srv.URL+"/a.tar", srv.URL+"/b.tar")
		})
		if code != 0 || strings.Count(stdout, "3 samples") != 2 {
			t.Errorf("cache dir %s: exit %d, stdout %q, stderr %q; want both shards listed", why, code, stdout, stderr)
		}
		if strings.Count(warn, "cache off") != 1 || !strings.Contains(warn, wants[why]) || strings.Count(warn, "\n") != 1 {
			t.Errorf("cache dir %s: warnings %q; want one line saying the cache is off and why", why, warn)
		}
	}
}
