// Command packprof reads one epoch of a packed token stream (package packed) and
// writes a CPU profile of it, for scripts/bench-pack.sh's figures to be explained.
//
//	packprof [-cpuprofile FILE] [-json] [-batch-size N] FIELD:SEQ_LEN[:eos=ID][:pad=ID] URL...
//
// It releases each batch (packed.Loader.Release) as a consumer that has copied it
// does. URLs may be s3:// ones (the AWS_* environment, as shardload's). -json prints
// {"batches", "tokens", "open_seconds", "seconds"} (seconds: Open and every batch).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime/pprof"
	"time"

	"github.com/shardload/shardload/pack"
	"github.com/shardload/shardload/packed"
	_ "github.com/shardload/shardload/source/s3"
)

func main() {
	prof := flag.String("cpuprofile", "", "write a CPU profile to this file")
	bs := flag.Int("batch-size", 32, "rows a batch")
	asJSON := flag.Bool("json", false, "print the figures as JSON")
	flag.Parse()
	if err := run(*prof, *bs, *asJSON, flag.Args()); err != nil {
		fmt.Fprintln(os.Stderr, "packprof:", err)
		os.Exit(1)
	}
}

func run(prof string, bs int, asJSON bool, args []string) error {
	if len(args) < 2 {
		return errors.New("usage: packprof -cpuprofile FILE SPEC URL")
	}
	s, err := pack.ParseSpec(args[0])
	if err != nil {
		return err
	}
	if prof != "" {
		f, err := os.Create(prof)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	ctx := context.Background()
	t0 := time.Now()
	l, err := packed.Open(ctx, packed.Config{URLs: args[1:], Pack: s, BatchSize: bs})
	if err != nil {
		return err
	}
	defer l.Close()
	t1 := time.Now()
	n := 0
	for {
		b, err := l.Next(ctx)
		if err == io.EOF {
			break
		}
		if err != nil {
			return err
		}
		l.Release(b) // as a consumer that has copied the batch does
		n++
	}
	if asJSON {
		return json.NewEncoder(os.Stdout).Encode(map[string]any{"batches": n, "tokens": l.Tokens(),
			"open_seconds": t1.Sub(t0).Seconds(), "seconds": time.Since(t0).Seconds()})
	}
	fmt.Printf("%d batches in %.3fs (open %.3fs, batches %.3fs)\n", n, time.Since(t0).Seconds(), t1.Sub(t0).Seconds(), time.Since(t1).Seconds())
	return nil
}
