package source_test

import (
	"context"
	"fmt"
	"io"
	"log"
	"os"
	"path/filepath"

	"github.com/shardload/shardload/source"
)

// A Fetcher reads an object of any Source with ranged reads as parallel parts,
// delivered in order, retrying and resuming after failures.
func ExampleNewFetcher() {
	dir, _ := os.MkdirTemp("", "fetcher-example")
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "train-000.tar")
	os.WriteFile(path, []byte("0123456789abcdefghij"), 0o644)

	f := source.NewFetcher(&source.File{}, source.FetchOptions{PartSize: 4, Parallel: 3})
	rc, err := f.OpenRange(context.Background(), path, 2, 15)
	if err != nil {
		log.Fatal(err)
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	fmt.Printf("%s %v\n", b, err)
	// Output: 23456789abcdefg <nil>
}

// Expand turns a trailing slash or a glob into the sorted list of objects.
func ExampleRegistry_Expand() {
	dir, _ := os.MkdirTemp("", "expand-example")
	defer os.RemoveAll(dir)
	for _, name := range []string{"train-001.tar", "train-000.tar", "val-000.tar"} {
		os.WriteFile(filepath.Join(dir, name), nil, 0o644)
	}
	var reg source.Registry
	reg.Register("file", &source.File{})
	urls, err := reg.Expand(context.Background(), []string{"file://" + dir + "/train-*.tar"})
	if err != nil {
		log.Fatal(err)
	}
	for _, u := range urls {
		fmt.Println(filepath.Base(u))
	}
	// Output:
	// train-000.tar
	// train-001.tar
}
