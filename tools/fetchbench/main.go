// Command fetchbench reads one object through the source package's Fetcher and
// prints the bytes, seconds and MB/s, for scripts/bench-fetch.sh.
//
//	fetchbench [-parallel N] [-part-size BYTES] [-repeat N] URL
//
// -parallel 1 reads the object as one stream; more reads it as ranged parts, that
// many in flight (default 4). -part-size defaults to 8 MiB. -repeat reads the object
// that many times in one process (a loader is a long-lived process: the later reads
// reuse the connections and part buffers of the first), one line per read.
// -ranges SIZE reads the object instead as one ranged request of SIZE bytes after
// another, and prints the requests and the process's CPU seconds too: what a
// request costs a store (scripts/bench-reads.sh measures it so).
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"syscall"
	"time"

	"github.com/shardload/shardload/source"
	"github.com/shardload/shardload/source/all"
)

func main() {
	parallel := flag.Int("parallel", source.DefaultParallel, "parts in flight (1: one stream)")
	partSize := flag.Int64("part-size", source.DefaultPartSize, "bytes per part")
	repeat := flag.Int("repeat", 1, "reads of the object in this process")
	ranges := flag.Int64("ranges", 0, "read the object as ranged requests of this many bytes, one after another")
	flag.Parse()
	if flag.NArg() != 1 || *repeat < 1 {
		fmt.Fprintln(os.Stderr, "usage: fetchbench [-parallel N] [-part-size BYTES] [-repeat N] URL")
		os.Exit(2)
	}
	var reg source.Registry
	all.RegisterDefaults(&reg, source.FetchOptions{Parallel: *parallel, PartSize: *partSize})
	ctx := context.Background()
	if *ranges > 0 {
		readRanges(ctx, &reg, flag.Arg(0), *ranges, *repeat)
		return
	}
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

// readRanges reads url repeat times as ranged requests of size bytes and prints the
// bytes, requests, seconds and the process's CPU seconds.
func readRanges(ctx context.Context, reg *source.Registry, url string, size int64, repeat int) {
	src, err := reg.Lookup(url)
	if err != nil {
		fail(err)
	}
	rr, ok := src.(source.RangeReader)
	if !ok {
		fail(fmt.Errorf("%s: no ranged reads", url))
	}
	info, err := src.Stat(ctx, url)
	if err != nil {
		fail(err)
	}
	buf := make([]byte, size)
	cpu0, start := cpuSeconds(), time.Now()
	var n, requests int64
	for range repeat {
		for off := int64(0); off < info.Size; off += size {
			rc, err := rr.OpenRange(ctx, url, off, size)
			if err != nil {
				fail(err)
			}
			k, err := io.ReadFull(rc, buf[:min(size, info.Size-off)])
			rc.Close()
			if err != nil {
				fail(err)
			}
			n += int64(k)
			requests++
		}
	}
	fmt.Printf("%d bytes %d requests %.3f s %.3f cpu_s\n", n, requests, time.Since(start).Seconds(), cpuSeconds()-cpu0)
}

func cpuSeconds() float64 {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "fetchbench:", err)
	os.Exit(1)
}
