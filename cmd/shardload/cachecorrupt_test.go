package main

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/shardload/shardload"
	"github.com/shardload/shardload/cache"
	"github.com/shardload/shardload/serve"
	"github.com/shardload/shardload/source"
)

// oneObject is a source of one object in memory.
type oneObject struct{ data []byte }

func (o oneObject) Stat(ctx context.Context, url string) (source.Info, error) {
	return source.Info{URL: url, Size: int64(len(o.data)), Version: "v1"}, nil
}

func (o oneObject) Open(ctx context.Context, url string) (io.ReadCloser, error) {
	return io.NopCloser(bytes.NewReader(o.data)), nil
}

// A cached entry found corrupt is counted in the metrics,
// shardload_cache_failures_total{what="corrupt"}, and in cat's --stats line.
func TestCorruptEntryInMetricsAndStats(t *testing.T) {
	const url = "s3://b/a.tar"
	data := bytes.Repeat([]byte("0123456789abcdef"), 64<<10)
	dir := t.TempDir()
	c, err := cache.New(cache.Options{Dir: dir, DiskBytes: 64 << 20, Logf: t.Logf}, oneObject{data})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	read := func() []byte {
		r, err := c.Open(t.Context(), url)
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		b, err := io.ReadAll(r)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	read()
	files, _ := filepath.Glob(filepath.Join(dir, "v1", "*.data"))
	if len(files) != 1 {
		t.Fatalf("data files %v, want 1", files)
	}
	b, err := os.ReadFile(files[0])
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)/2] ^= 1
	if err := os.WriteFile(files[0], b, 0o600); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(read(), data) {
		t.Fatal("served the corrupted bytes")
	}
	m := newServerMetrics(func() ([]serve.SessionStats, shardload.Stats) { return nil, shardload.Stats{} }, c)
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(m); err != nil {
		t.Fatal(err)
	}
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, f := range fams {
		if f.GetName() != "shardload_cache_failures_total" {
			continue
		}
		for _, mt := range f.GetMetric() {
			for _, l := range mt.GetLabel() {
				if l.GetName() == "what" {
					got[l.GetValue()] = mt.GetCounter().GetValue()
				}
			}
		}
	}
	if got["corrupt"] != 1 || got["fetch"] != 0 || got["disk_write"] != 0 {
		t.Errorf("shardload_cache_failures_total by what: %v; want corrupt 1, fetch 0, disk_write 0", got)
	}
	if line := cacheSummary(c.Stats()); !strings.Contains(line, " 1 corrupt") {
		t.Errorf("cat's stats line %q does not count the corrupt entry", line)
	}
}
