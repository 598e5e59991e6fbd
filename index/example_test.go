package index_test

import (
	"bytes"
	"context"
	"fmt"
	"log"
	"os"

	"github.com/shardload/shardload/index"
	"github.com/shardload/shardload/internal/shardgen"
	"github.com/shardload/shardload/source"
)

// Index a dataset once and write the index beside its shards, where every loader
// given the same URLs finds it.
func ExampleLookup_Resolve() {
	dir, _ := os.MkdirTemp("", "example")
	defer os.RemoveAll(dir)
	paths, err := shardgen.Generate(dir, shardgen.Spec{Shards: 3, SamplesPerShard: 5})
	if err != nil {
		log.Fatal(err)
	}
	infos, err := index.Lookup{Sources: source.Default, NoBeside: true}.Resolve(context.Background(), paths)
	if err != nil {
		log.Fatal(err)
	}
	f, err := os.Create(dir + "/" + index.FileName)
	if err != nil {
		log.Fatal(err)
	}
	if err := index.Write(f, infos, true); err != nil {
		log.Fatal(err)
	}
	f.Close()
	for _, in := range infos {
		fmt.Println(in.Samples, "samples, offsets", in.Offsets[:2], "...")
	}
	// Output:
	// 5 samples, offsets [0 41472] ...
	// 5 samples, offsets [0 33280] ...
	// 5 samples, offsets [0 50176] ...
}

// Read an index, compressed or not; the lines of "shardload ls --summary --json"
// are an index too.
func ExampleRead() {
	infos, err := index.Read(bytes.NewReader([]byte(`{"url":"s3://bucket/train-0.tar","samples":1000,"extensions":["cls","jpg"]}`)), "ls.jsonl")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(infos[0].URL, infos[0].Samples)
	// Output: s3://bucket/train-0.tar 1000
}
