package main

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
)

// Go's profiles are served on the --metrics listener only when it is a loopback
// address: --pprof with --metrics on every interface is refused, naming --pprof-addr;
// on 127.0.0.1 they are there.
func TestPprofLoopbackOnly(t *testing.T) {
	dir := t.TempDir()
	if code, _, stderr := runCLI(t, "gen", "--shards", "1", "--samples", "8", dir); code != 0 {
		t.Fatalf("gen: %s", stderr)
	}
	shard := filepath.Join(dir, "train-000000.tar")
	code, _, stderr := runCLI(t, "serve", "--socket", filepath.Join(t.TempDir(), "s.sock"), "--metrics", ":0", "--pprof", shard)
	if code != 2 || !strings.Contains(stderr, "loopback") || !strings.Contains(stderr, "--pprof-addr") {
		t.Errorf("--pprof with --metrics :0: exit %d, %s", code, stderr)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pr, pw := io.Pipe()
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"serve", "--socket", filepath.Join(t.TempDir(), "s.sock"), "--metrics", "127.0.0.1:0", "--pprof", shard}, pw, io.Discard)
		pw.Close()
	}()
	sc := bufio.NewScanner(pr)
	var url string
	for sc.Scan() {
		if _, after, ok := strings.Cut(sc.Text(), "metrics on "); ok {
			url = strings.TrimSuffix(after, "/metrics") + "/debug/pprof/"
			break
		}
	}
	go io.Copy(io.Discard, pr)
	if url == "" {
		t.Fatal("serve printed no metrics address")
	}
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("GET %s: %s", url, resp.Status)
	}
	cancel()
	if code := <-done; code != 0 {
		t.Errorf("serve exited %d", code)
	}
}
