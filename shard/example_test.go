package shard_test

import (
	"context"
	"fmt"
	"io"
	"log"

	"github.com/shardload/shardload/shard"
	"github.com/shardload/shardload/source"
)

// Read the samples of a shard, as a WebDataset reader groups them.
func ExampleReader() {
	ctx := context.Background()
	url := "../testdata/pytorch-data__wds.tar" // or s3://bucket/key
	body, err := source.Open(ctx, url)
	if err != nil {
		log.Fatal(err)
	}
	defer body.Close()
	r := shard.NewReader(body, shard.Options{URL: url})
	defer r.Close()
	for {
		s, err := r.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			log.Fatal(err) // names the shard, the sample key and the byte offset
		}
		txt, _ := s.Get("txt")
		if s.Key == "data/0" || s.Key == "data/9" {
			fmt.Printf("%s: %d fields, txt %q\n", s.Key, len(s.Fields), txt)
		}
	}
	// Output:
	// data/0: 2 fields, txt "text0"
	// data/9: 2 fields, txt "text9"
}

func ExampleExpand() {
	urls, err := shard.Expand("s3://bucket/{train,val}-{000..002}.tar")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(len(urls), urls[0], urls[5])
	// Output: 6 s3://bucket/train-000.tar s3://bucket/val-002.tar
}
