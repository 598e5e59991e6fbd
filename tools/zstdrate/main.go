// Command zstdrate measures the single-core zstd decode rate of this machine, the
// ceiling against which shardload's decompression stage is judged.
//
// Usage:
//
//	go run ./tools/zstdrate [--rounds N] FILE...
//
// It reads every FILE (whole-file zstd streams, such as the .tar.zst shards that
// `shardload gen --compression zstd` writes) into memory once, then, with
// runtime.GOMAXPROCS(1) and a github.com/klauspost/compress/zstd decoder built with
// WithDecoderConcurrency(1) (the decoder shardload uses, with no helper goroutines),
// decodes all of them into io.Discard, for several rounds. Reading the files is not
// timed; only decoding from memory is. The decoder is reused across files and rounds,
// as a long-lived decoder worker would be.
//
// It prints one JSON object for the median round (by seconds):
//
//	{"files":64,"compressed_bytes":...,"decompressed_bytes":...,"seconds":...,
//	 "mb_per_sec_decompressed":...,"mb_per_sec_compressed":...,"rounds":5}
//
// MB is 10^6 bytes. mb_per_sec_decompressed is what one core can produce;
// scripts/bench-pipeline.sh multiplies it by the core count to get the ceiling for a
// pipeline that decodes on every core.
//
// It lives under tools/ because it is a measuring tool for this repository's
// benchmarks, not part of the shardload command line.
package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"sort"
	"time"

	"github.com/klauspost/compress/zstd"
)

// result is the JSON object printed for the median round.
type result struct {
	Files             int     `json:"files"`
	CompressedBytes   int64   `json:"compressed_bytes"`
	DecompressedBytes int64   `json:"decompressed_bytes"`
	Seconds           float64 `json:"seconds"`
	MBPerSecDecomp    float64 `json:"mb_per_sec_decompressed"`
	MBPerSecComp      float64 `json:"mb_per_sec_compressed"`
	Rounds            int     `json:"rounds"`
}

func main() {
	rounds := flag.Int("rounds", 5, "number of timed rounds over all files; the median is reported")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "usage: zstdrate [--rounds N] FILE...\n\n"+
			"Decodes each zstd FILE on one core and prints the median round's rate as JSON.\n\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() == 0 || *rounds < 1 {
		flag.Usage()
		os.Exit(2)
	}
	if err := run(flag.Args(), *rounds, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "zstdrate:", err)
		os.Exit(1)
	}
}

func run(paths []string, rounds int, w io.Writer) error {
	runtime.GOMAXPROCS(1)
	files := make([][]byte, len(paths))
	var compressed int64
	for i, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		files[i] = b
		compressed += int64(len(b))
	}
	dec, err := zstd.NewReader(nil, zstd.WithDecoderConcurrency(1), zstd.WithDecoderLowmem(false))
	if err != nil {
		return err
	}
	defer dec.Close()

	decodeAll := func() (int64, error) {
		var n int64
		for i, b := range files {
			if err := dec.Reset(bytes.NewReader(b)); err != nil {
				return n, fmt.Errorf("%s: %w", paths[i], err)
			}
			m, err := io.Copy(io.Discard, dec)
			n += m
			if err != nil {
				return n, fmt.Errorf("%s: %w", paths[i], err)
			}
		}
		return n, nil
	}
	// One untimed round warms the decoder's buffers and the CPU caches.
	decompressed, err := decodeAll()
	if err != nil {
		return err
	}
	secs := make([]float64, rounds)
	for r := range secs {
		start := time.Now()
		if _, err := decodeAll(); err != nil {
			return err
		}
		secs[r] = time.Since(start).Seconds()
	}
	sort.Float64s(secs)
	med := secs[len(secs)/2]
	if len(secs)%2 == 0 {
		med = (secs[len(secs)/2-1] + secs[len(secs)/2]) / 2
	}
	res := result{
		Files:             len(files),
		CompressedBytes:   compressed,
		DecompressedBytes: decompressed,
		Seconds:           med,
		MBPerSecDecomp:    float64(decompressed) / 1e6 / med,
		MBPerSecComp:      float64(compressed) / 1e6 / med,
		Rounds:            rounds,
	}
	enc := json.NewEncoder(w)
	return enc.Encode(res)
}
