// Command jpegrate measures how fast this machine's cores decode the JPEGs of some
// shards, the ceilings against which image fields are judged: libjpeg-turbo's
// decode alone (the call PIL makes too), and decode + resize + crop as an image
// field does it.
//
// Usage:
//
//	go run ./tools/jpegrate [--threads N] [--rounds N] [--field SPEC] SHARD...
//
// It reads every member with the field's extension (default jpg) of every SHARD (tar
// files) into memory once, then, for several rounds, has N goroutines (default: the
// CPUs) take the JPEGs one by one and (1) decode them with libjpeg-turbo into RGB at
// full size, (2) decode them as the field (default
// img=jpg:image:uint8:3x224x224) with libjpeg-turbo, each image's random transforms
// seeded from its sample key as the loader seeds them (a round standing for an
// epoch). Reading is not timed. It prints one JSON object with the median round of
// each:
//
//	{"images":2000,"threads":2,"decode_per_sec":...,"decode_cpu_ms":...,
//	 "field_per_sec":...,"field_cpu_ms":...,"rounds":5}
//
// *_cpu_ms is the CPU time of the process per image over the round (user + system).
// It lives under tools/ because it is a measuring tool for this repository's
// benchmarks, not part of the shardload command line.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"sort"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/shardload/shardload/decode"
	"github.com/shardload/shardload/decode/turbojpeg"
	"github.com/shardload/shardload/shard"
)

func main() {
	threads := flag.Int("threads", runtime.NumCPU(), "goroutines decoding at once")
	rounds := flag.Int("rounds", 5, "rounds over every image")
	spec := flag.String("field", "img=jpg:image:uint8:3x224x224", "the image field to decode as")
	flag.Parse()
	if err := run(*threads, *rounds, *spec, flag.Args()); err != nil {
		fmt.Fprintln(os.Stderr, "jpegrate:", err)
		os.Exit(1)
	}
}

func run(threads, rounds int, spec string, paths []string) error {
	f, err := decode.ParseField(spec)
	if err != nil {
		return err
	}
	lib, err := turbojpeg.Default()
	if err != nil {
		return err
	}
	var images []image
	for _, p := range paths {
		file, err := os.Open(p)
		if err != nil {
			return err
		}
		r := shard.NewReader(file, shard.Options{URL: p})
		for {
			s, err := r.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				return err
			}
			if b, ok := s.Get(f.Ext); ok {
				images = append(images, image{key: s.Key, data: append([]byte(nil), b...)})
			}
		}
		r.Close()
		file.Close()
	}
	if len(images) == 0 {
		return fmt.Errorf("no .%s members in %v", f.Ext, paths)
	}
	// decodeOnly decodes img at full size into the worker's buffer; asField decodes it
	// as the field does.
	decodeOnly := func(w *worker, img image, _ int) error {
		h, err := lib.Header(img.data)
		if err != nil {
			return err
		}
		n := h.Width * h.Height * 3
		if cap(w.buf) < n {
			w.buf = make([]byte, n)
		}
		return lib.Decode(img.data, w.buf[:n], h.Width, h.Height, turbojpeg.RGB, 0)
	}
	asField := func(w *worker, img image, round int) error {
		// Each image's random transforms (crop, flip) seeded as the loader seeds
		// them, a round standing for an epoch: the same work as the loader's, not
		// one crop repeated for every image.
		w.d.Seed = decode.SampleSeed(0, round, img.key)
		_, _, err := w.d.Decode(&f, img.data, nil)
		return err
	}
	dec, err := measure(images, threads, rounds, decodeOnly)
	if err != nil {
		return err
	}
	fld, err := measure(images, threads, rounds, asField)
	if err != nil {
		return err
	}
	return json.NewEncoder(os.Stdout).Encode(map[string]any{
		"images": len(images), "threads": threads, "field": f.String(), "rounds": rounds,
		"decode_per_sec": dec.perSec, "decode_cpu_ms": dec.cpuMS,
		"field_per_sec": fld.perSec, "field_cpu_ms": fld.cpuMS,
	})
}

// image is one JPEG and its sample's key.
type image struct {
	key  string
	data []byte
}

// worker is one decoding goroutine's state.
type worker struct {
	buf []byte
	d   decode.Decoder
}

// result is one round: images a second, and CPU milliseconds an image.
type result struct{ perSec, cpuMS float64 }

// measure runs work over every image on threads goroutines, rounds times, and returns
// the median round.
func measure(images []image, threads, rounds int, work func(w *worker, img image, round int) error) (result, error) {
	var res []result
	for round := range rounds {
		var next atomic.Int64
		var wg sync.WaitGroup
		var firstErr atomic.Value
		cpu0, t0 := cpuTime(), time.Now()
		for range threads {
			wg.Add(1)
			go func() {
				defer wg.Done()
				w := &worker{d: decode.Decoder{Images: decode.ImageDecoderTurbo}}
				for {
					i := next.Add(1) - 1
					if i >= int64(len(images)) {
						return
					}
					if err := work(w, images[i], round); err != nil {
						firstErr.CompareAndSwap(nil, err)
						return
					}
				}
			}()
		}
		wg.Wait()
		if err, _ := firstErr.Load().(error); err != nil {
			return result{}, err
		}
		secs := time.Since(t0).Seconds()
		res = append(res, result{float64(len(images)) / secs, (cpuTime() - cpu0).Seconds() * 1e3 / float64(len(images))})
	}
	sort.Slice(res, func(i, j int) bool { return res[i].perSec < res[j].perSec })
	return res[len(res)/2], nil
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
