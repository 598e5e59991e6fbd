package cache_test

import (
	"context"
	"fmt"
	"io"
	"log"
	"os"
	"strings"

	"github.com/shardload/shardload/cache"
	"github.com/shardload/shardload/source"
)

// store is a stand-in for remote storage.
type store map[string]string

func (s store) Stat(_ context.Context, url string) (source.Info, error) {
	return source.Info{URL: url, Size: int64(len(s[url])), Version: "v1"}, nil
}

func (s store) Open(_ context.Context, url string) (io.ReadCloser, error) {
	return io.NopCloser(strings.NewReader(s[url])), nil
}

// A disk tier of 1 GiB in front of a source: the second read is a hit.
func Example() {
	dir, _ := os.MkdirTemp("", "shard-cache-")
	defer os.RemoveAll(dir)
	c, err := cache.New(cache.Options{Dir: dir, DiskBytes: 1 << 30}, store{"mem://b/a.tar": "tar bytes"})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	for range 2 {
		r, err := c.Open(context.Background(), "mem://b/a.tar")
		if err != nil {
			log.Fatal(err)
		}
		b, _ := io.ReadAll(r)
		r.Close()
		fmt.Println(string(b))
	}
	st := c.Stats()
	fmt.Println("fetches:", st.Fetches, "disk hits:", st.DiskHits)
	// Output:
	// tar bytes
	// tar bytes
	// fetches: 1 disk hits: 1
}

// Wrap puts one cache in front of every scheme of a registry but local files, as the
// command line does with --cache-dir.
func ExampleWrap() {
	dir, _ := os.MkdirTemp("", "shard-cache-")
	defer os.RemoveAll(dir)
	reg := &source.Registry{}
	reg.Register("mem", store{"mem://b/a.tar": "tar bytes"})
	reg.Register("file", &source.File{})
	cached, c, err := cache.Wrap(cache.Options{Dir: dir}, reg, "file")
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	p, err := c.Plan(context.Background(), []string{"mem://b/a.tar"}, 0)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("to fetch:", p.Fetch, "fits:", p.Fits)
	if err := c.Warm(context.Background(), p, cache.WarmOptions{}); err != nil {
		log.Fatal(err)
	}
	r, _ := cached.Open(context.Background(), "mem://b/a.tar")
	defer r.Close()
	b, _ := io.ReadAll(r)
	fmt.Println(string(b), c.Stats().DiskHits)
	// Output:
	// to fetch: 1 fits: true
	// tar bytes 1
}
