// Command fetchbench reads one object through the source package's Fetcher and
// prints the bytes, seconds and MB/s, for scripts/bench-fetch.sh.
//
//	fetchbench [-parallel N] [-part-size BYTES] [-repeat N] URL
//
// -parallel 1 reads the object as one stream; more reads it as ranged parts, that
// many in flight (default 4). -part-size defaults to 8 MiB. -repeat reads the object
// that many times in one process (a loader is a long-lived process: the later reads
// reuse the connections and part buffers of the first), one line per read.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/shardload/shardload/source"
	"github.com/shardload/shardload/source/all"
)

func main() {
	parallel := flag.Int("parallel", source.DefaultParallel, "parts in flight (1: one stream)")
	partSize := flag.Int64("part-size", source.DefaultPartSize, "bytes per part")
	repeat := flag.Int("repeat", 1, "reads of the object in this process")
	flag.Parse()
	if flag.NArg() != 1 || *repeat < 1 {
		fmt.Fprintln(os.Stderr, "usage: fetchbench [-parallel N] [-part-size BYTES] [-repeat N] URL")
		os.Exit(2)
	}
	var reg source.Registry
	all.RegisterDefaults(&reg, source.FetchOptions{Parallel: *parallel, PartSize: *partSize})
	ctx := context.Background()
	for range *repeat {
		start := time.Now()
		rc, err := reg.Open(ctx, flag.Arg(0))
		if err != nil {
			fmt.Fprintln(os.Stderr, "fetchbench:", err)
			os.Exit(1)
		}
		n, err := io.Copy(io.Discard, rc)
		rc.Close()
		if err != nil {
			fmt.Fprintln(os.Stderr, "fetchbench:", err)
			os.Exit(1)
		}
		secs := time.Since(start).Seconds()
		fmt.Printf("%d bytes %.3f s %.1f MB/s\n", n, secs, float64(n)/1e6/secs)
	}
}
