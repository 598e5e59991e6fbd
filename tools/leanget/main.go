// Command leanget is the lean reader the loader is measured against: it reads every
// object named on the command line with one GET each, -jobs objects in flight, and
// discards the bytes (or, with -zstd, decompresses them and discards the output). It
// prints the bytes read, the bytes decompressed, the seconds and the process's CPU
// seconds as one JSON object (scripts/bench-peers.sh).
//
//	leanget [-jobs N] [-zstd] [-cpuprofile FILE] URL...
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime/pprof"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/klauspost/compress/zstd"

	"github.com/shardload/shardload/source"
	"github.com/shardload/shardload/source/all"
)

func main() {
	jobs := flag.Int("jobs", 4, "objects in flight")
	unzstd := flag.Bool("zstd", false, "decompress each object as a zstd stream")
	cpuProfile := flag.String("cpuprofile", "", "write a CPU profile of the reads to this file")
	flag.Parse()
	if flag.NArg() == 0 || *jobs < 1 {
		fmt.Fprintln(os.Stderr, "usage: leanget [-jobs N] [-zstd] URL...")
		os.Exit(2)
	}
	var reg source.Registry
	all.RegisterDefaults(&reg, source.FetchOptions{Parallel: 1})
	ctx := context.Background()
	urls := make(chan string)
	var in, out atomic.Int64
	var wg sync.WaitGroup
	var failed atomic.Bool
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err == nil {
			err = pprof.StartCPUProfile(f)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "leanget:", err)
			os.Exit(1)
		}
		defer f.Close()
	}
	cpu0, start := cpuSeconds(), time.Now()
	for range *jobs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, 256<<10)
			var dec *zstd.Decoder
			if *unzstd {
				dec, _ = zstd.NewReader(nil, zstd.WithDecoderConcurrency(1))
				defer dec.Close()
			}
			for u := range urls {
				if err := read(ctx, &reg, u, dec, buf, &in, &out); err != nil {
					fmt.Fprintln(os.Stderr, "leanget:", err)
					failed.Store(true)
				}
			}
		}()
	}
	for _, u := range flag.Args() {
		urls <- u
	}
	close(urls)
	wg.Wait()
	pprof.StopCPUProfile()
	if failed.Load() {
		os.Exit(1)
	}
	secs := time.Since(start).Seconds()
	json.NewEncoder(os.Stdout).Encode(map[string]float64{
		"bytes_in": float64(in.Load()), "bytes_decompressed": float64(out.Load()),
		"seconds": secs, "cpu_seconds": cpuSeconds() - cpu0,
	})
}

// read reads one object, through dec when it is set, adding the bytes to in and out.
func read(ctx context.Context, reg *source.Registry, url string, dec *zstd.Decoder, buf []byte, in, out *atomic.Int64) error {
	rc, err := reg.Open(ctx, url)
	if err != nil {
		return err
	}
	defer rc.Close()
	cr := &counter{r: rc, n: in}
	var r io.Reader = cr
	if dec != nil {
		if err := dec.Reset(cr); err != nil {
			return err
		}
		r = dec
	}
	n, err := io.CopyBuffer(io.Discard, struct{ io.Reader }{r}, buf)
	out.Add(n)
	return err
}

type counter struct {
	r io.Reader
	n *atomic.Int64
}

func (c *counter) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n.Add(int64(n))
	return n, err
}

func cpuSeconds() float64 {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
}
