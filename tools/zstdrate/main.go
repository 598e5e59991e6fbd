// Command zstdrate measures the single-core zstd decode rate of this machine, the
// ceiling against which shardload's decompression stage is judged.
//
// Usage:
//
//	go run ./tools/zstdrate [--rounds N] [--lanes N [--run-bytes B]] FILE...
//
// It reads every FILE (whole-file zstd streams, such as the .tar.zst shards that
// `shardload gen --compression zstd` writes) into memory once, then, with
// runtime.GOMAXPROCS(1) and a github.com/klauspost/compress/zstd decoder built with
// WithDecoderConcurrency(1) (the decoder shardload uses, with no helper goroutines),
// decodes all of them into io.Discard, for several rounds. Reading the files is not
// timed; only decoding from memory is. The decoder is reused across files and rounds,
// as a long-lived decoder worker would be.
//
// With --lanes N the files are dealt to N lanes (file i to lane i mod N), each with a
// decoder of its own, and the lanes take turns on the core, each turn reading up to
// --run-bytes of its lane's stream in 256 KiB reads: the way the loader's workers
// decode N open shards, a queue's worth of each at a time (--open-shards,
// --queue-bytes). Comparing --lanes 8 with --lanes 1 separates what decoding 8
// streams side by side costs (their history windows taking turns in the caches) from
// the rest of the loader. first_round_seconds is the untimed first round, where each
// decoder's history window is first touched (page faults).
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
	Lanes             int     `json:"lanes,omitempty"`
	FirstRoundSeconds float64 `json:"first_round_seconds"`
}

func main() {
	rounds := flag.Int("rounds", 5, "number of timed rounds over all files; the median is reported")
	lanes := flag.Int("lanes", 0, "decode the files in this many lanes taking turns, each with a decoder of its own (0: each file whole, in turn, through one decoder)")
	runBytes := flag.Int("run-bytes", 2<<20, "with --lanes, the decompressed bytes a lane's turn reads")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "usage: zstdrate [--rounds N] [--lanes N [--run-bytes B]] FILE...\n\n"+
			"Decodes each zstd FILE on one core and prints the median round's rate as JSON.\n\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() == 0 || *rounds < 1 || *lanes < 0 || *runBytes < 1 {
		flag.Usage()
		os.Exit(2)
	}
	if err := run(flag.Args(), *rounds, *lanes, *runBytes, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "zstdrate:", err)
		os.Exit(1)
	}
}

func run(paths []string, rounds, lanes, runBytes int, w io.Writer) error {
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
	decodeAll := func() (int64, error) { return decodeWhole(paths, files) }
	if lanes > 0 {
		decodeAll = func() (int64, error) { return decodeLanes(paths, files, lanes, runBytes) }
	}
	// One untimed round warms the decoders' buffers and the CPU caches.
	first := time.Now()
	decompressed, err := decodeAll()
	if err != nil {
		return err
	}
	firstSecs := time.Since(first).Seconds()
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
		Lanes:             lanes,
		FirstRoundSeconds: firstSecs,
	}
	enc := json.NewEncoder(w)
	return enc.Encode(res)
}

// decoders are kept across rounds, one for the whole files and one a lane, as a
// long-lived worker keeps its decoders.
var decoders []*zstd.Decoder

func decoder(i int) (*zstd.Decoder, error) {
	for len(decoders) <= i {
		dec, err := zstd.NewReader(nil, zstd.WithDecoderConcurrency(1), zstd.WithDecoderLowmem(false))
		if err != nil {
			return nil, err
		}
		decoders = append(decoders, dec)
	}
	return decoders[i], nil
}

// decodeWhole decodes each file whole, in turn, through one decoder.
func decodeWhole(paths []string, files [][]byte) (int64, error) {
	dec, err := decoder(0)
	if err != nil {
		return 0, err
	}
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

// decodeLanes deals the files to lanes and decodes them in turns of runBytes a lane.
func decodeLanes(paths []string, files [][]byte, lanes, runBytes int) (int64, error) {
	type lane struct {
		dec   *zstd.Decoder
		files []int
		open  bool
	}
	ls := make([]*lane, lanes)
	for l := range ls {
		dec, err := decoder(l)
		if err != nil {
			return 0, err
		}
		ls[l] = &lane{dec: dec}
	}
	for i := range files {
		ls[i%lanes].files = append(ls[i%lanes].files, i)
	}
	buf := make([]byte, 256<<10)
	var n int64
	for left := len(files); left > 0; {
		for _, ln := range ls {
			for got := 0; got < runBytes; {
				if !ln.open {
					if len(ln.files) == 0 {
						break
					}
					if err := ln.dec.Reset(bytes.NewReader(files[ln.files[0]])); err != nil {
						return n, fmt.Errorf("%s: %w", paths[ln.files[0]], err)
					}
					ln.open = true
				}
				m, err := ln.dec.Read(buf[:min(len(buf), runBytes-got)])
				got += m
				n += int64(m)
				if err == io.EOF {
					ln.open, ln.files = false, ln.files[1:]
					left--
				} else if err != nil {
					return n, fmt.Errorf("%s: %w", paths[ln.files[0]], err)
				}
			}
		}
	}
	return n, nil
}
