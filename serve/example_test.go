package serve_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/shardload/shardload"
	"github.com/shardload/shardload/decode"
	"github.com/shardload/shardload/serve"
)

// A loader process for the trainers of a node: it serves one dataset, lets trainers
// name shards under one more prefix, and stops when ctx is done (main would use
// signal.NotifyContext for SIGTERM and SIGINT).
func ExampleListen() {
	dir, _ := os.MkdirTemp("", "example")
	defer os.RemoveAll(dir)
	label, _ := decode.ParseField("label=cls:int")
	srv, err := serve.Listen(serve.Options{
		Socket:   filepath.Join(dir, "run", "loader.sock"),
		URLs:     []string{"s3://bucket/train-{000000..000099}.tar"},
		Allow:    []string{"s3://bucket/eval/"},
		Pipeline: shardload.Config{Fields: []decode.Field{label}, Slabs: 4, SlabBytes: 16 << 20},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("listening on", filepath.Base(srv.Addr()), "protocol version", serve.Version)
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // a real server runs until a signal
	fmt.Println(srv.Serve(ctx))
	// Output:
	// listening on loader.sock protocol version 4
	// <nil>
}
