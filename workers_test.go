package shardload_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/shardload/shardload"
	"github.com/shardload/shardload/internal/shardgen"
	"github.com/shardload/shardload/source"
	"github.com/shardload/shardload/source/httpsrc"
)

// TestWorkersPerOpenShard: shards read over HTTP (as from any store) and local files
// get a worker for each open shard by default, more than the CPUs; a Workers given
// is kept either way, and one above the open shards is lowered to them.
func TestWorkersPerOpenShard(t *testing.T) {
	dir := t.TempDir()
	paths, err := shardgen.Generate(dir, shardgen.Spec{Shards: 4, Samples: []int{12}, Seed: 3})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(http.FileServer(http.Dir(dir)))
	defer srv.Close()
	var reg source.Registry
	reg.Register("file", &source.File{})
	httpsrc.Register(&reg, source.FetchOptions{})
	var urls []string
	for _, p := range paths {
		urls = append(urls, srv.URL+"/"+filepath.Base(p))
	}
	// More lanes than CPUs, so that the default differs from the CPU count on any
	// machine.
	cpus := runtime.GOMAXPROCS(0)
	lanes := cpus + 2
	for _, c := range []struct {
		name    string
		urls    []string
		workers int
		want    int
	}{
		{"http", urls, 0, lanes + 2},
		{"http, given", urls, 1, 1},
		{"files", paths, 0, lanes + 2},
		{"files, given", paths, 3, 3},
		{"files, more than open", paths, lanes + 5, lanes + 2},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := shardload.Config{URLs: c.urls, Sources: &reg, NoIndexStore: true, CountFirst: true, OpenShards: lanes, ReadAhead: 2,
				Workers: c.workers, NoAutotune: true, NoLock: true, Logf: t.Logf}
			l, err := shardload.Open(context.Background(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			if got := l.Settings().Workers; got != c.want {
				t.Errorf("workers %d, want %d", got, c.want)
			}
			n := 0
			for _, err := range l.All(context.Background()) {
				if err != nil {
					t.Fatal(err)
				}
				n++
			}
			if n == 0 {
				t.Error("no batches")
			}
		})
	}
}
