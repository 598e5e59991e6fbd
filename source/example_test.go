package source_test

import (
	"context"
	"fmt"
	"io"
	"log"
	"strings"

	"github.com/shardload/shardload/source"
)

// memSource serves objects from a map: a stand-in for a user's own storage.
type memSource map[string]string

func (m memSource) Stat(_ context.Context, url string) (source.Info, error) {
	data, ok := m[url]
	if !ok {
		return source.Info{}, &source.Error{Op: "stat", URL: url, Err: source.ErrNotFound}
	}
	return source.Info{URL: url, Size: int64(len(data))}, nil
}

func (m memSource) Open(ctx context.Context, url string) (io.ReadCloser, error) {
	if _, err := m.Stat(ctx, url); err != nil {
		return nil, err
	}
	return io.NopCloser(strings.NewReader(m[url])), nil
}

// A library user plugs in a Source for a scheme of their own.
func ExampleRegister() {
	source.Register("mem", memSource{"mem://shards/a.tar": "tar bytes"})
	ctx := context.Background()
	info, err := source.Stat(ctx, "mem://shards/a.tar")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(info.Size)
	_, err = source.Open(ctx, "mem://shards/missing.tar")
	fmt.Println(err)
	// Output:
	// 9
	// stat mem://shards/missing.tar: source: object not found
}
