// Command shardload streams WebDataset tar shards from object storage and local disk.
//
//	shardload ls     URL...    samples of shards: key, fields, sizes
//	shardload cat    URL...    samples as one tar stream on stdout
//	shardload warm   URL...    fill the node's shard cache
//	shardload bench  URL...    the whole pipeline: samples/s, MB/s, stages, trainer wait
//	shardload index  URL...    write the dataset index: sample counts and offsets
//	shardload plan             what a job will cost, without reading a shard
//	shardload serve  [URL...]  the loader process beside PyTorch trainers
//	shardload doctor           topology, limits, what to change
//	shardload gen    DIR       write synthetic shards for tests and demos
//
// Run "shardload help" or "shardload COMMAND --help" for the flags.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
