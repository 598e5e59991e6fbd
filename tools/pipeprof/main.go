// Command pipeprof runs the loader over shards for some epochs, as `shardload bench`
// does with its defaults, and writes the profiles bench does not: where goroutines
// block (-blockprofile), lock contention (-mutexprofile), an execution trace (-trace)
// and a CPU profile (-cpuprofile). It prints the run's MB/s, CPU seconds and the
// stages' times as one JSON object. It is for finding where the loader waits:
//
//	pipeprof -index IDX -field tokens=npy:npy:int32:2048 -field cls -epochs 3 \
//	    -blockprofile block.prof -trace trace.out s3://b/tok-{000000..000007}.tar.zst
//	go tool pprof -top block.prof
//	go tool trace trace.out
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"
	"runtime/trace"
	"strings"
	"syscall"
	"time"

	"github.com/shardload/shardload"
	"github.com/shardload/shardload/decode"
	"github.com/shardload/shardload/source"
	"github.com/shardload/shardload/source/all"
)

type fieldFlags []string

func (f *fieldFlags) String() string     { return strings.Join(*f, ",") }
func (f *fieldFlags) Set(s string) error { *f = append(*f, s); return nil }

func main() {
	var fields fieldFlags
	flag.Var(&fields, "field", "a field to decode, as shardload bench --field (repeatable)")
	index := flag.String("index", "", "the shards' index file")
	epochs := flag.Int("epochs", 3, "epochs to run")
	workers := flag.Int("workers", 0, "Config.Workers (0: the default)")
	noTune := flag.Bool("no-autotune", false, "Config.NoAutotune")
	blockProf := flag.String("blockprofile", "", "write a block profile (every blocking event) to this file")
	mutexProf := flag.String("mutexprofile", "", "write a mutex profile (every contention) to this file")
	cpuProf := flag.String("cpuprofile", "", "write a CPU profile to this file")
	traceOut := flag.String("trace", "", "write an execution trace to this file")
	flag.Parse()
	if err := run(fields, *index, *epochs, *workers, *noTune, *blockProf, *mutexProf, *cpuProf, *traceOut, flag.Args()); err != nil {
		fmt.Fprintln(os.Stderr, "pipeprof:", err)
		os.Exit(1)
	}
}

func run(fields []string, index string, epochs, workers int, noTune bool, blockProf, mutexProf, cpuProf, traceOut string, urls []string) error {
	fds, err := decode.ParseFields(fields...)
	if err != nil {
		return err
	}
	reg := &source.Registry{}
	all.RegisterDefaults(reg, source.FetchOptions{})
	if blockProf != "" {
		runtime.SetBlockProfileRate(1)
	}
	if mutexProf != "" {
		runtime.SetMutexProfileFraction(1)
	}
	if cpuProf != "" {
		f, err := os.Create(cpuProf)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	if traceOut != "" {
		f, err := os.Create(traceOut)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := trace.Start(f); err != nil {
			return err
		}
		defer trace.Stop()
	}
	ctx := context.Background()
	cpu0, start := cpuSeconds(), time.Now()
	var tuner *shardload.Tuner
	if !noTune {
		tuner = shardload.NewTuner() // the epochs go on from the last one's settings, as in bench
	}
	var bytes int64
	stages := map[string]time.Duration{}
	var epochStats []map[string]float64
	for e := range epochs {
		t0, c0, f0 := time.Now(), cpuSeconds(), minorFaults()
		first := 0.0
		l, err := shardload.Open(ctx, shardload.Config{URLs: urls, Index: index, NoIndexStore: true, Fields: fds,
			Epoch: e, Workers: workers, NoAutotune: noTune, Tuner: tuner, Sources: reg})
		if err != nil {
			return err
		}
		opened := time.Since(t0).Seconds()
		for b, err := range l.All(ctx) {
			if err != nil {
				l.Close()
				return err
			}
			if first == 0 {
				first = time.Since(t0).Seconds()
			}
			bytes += int64(len(b.Data()))
			b.Release()
		}
		for k, v := range l.Stats().Stages {
			stages[k] += v
		}
		if err := l.Close(); err != nil {
			return err
		}
		epochStats = append(epochStats, map[string]float64{"open_seconds": opened, "first_batch_seconds": first,
			"seconds": time.Since(t0).Seconds(), "cpu_seconds": cpuSeconds() - c0, "minor_faults": float64(minorFaults() - f0)})
	}
	secs := time.Since(start).Seconds()
	for name, file := range map[string]string{"block": blockProf, "mutex": mutexProf} {
		if file == "" {
			continue
		}
		f, err := os.Create(file)
		if err != nil {
			return err
		}
		err = pprof.Lookup(name).WriteTo(f, 0)
		f.Close()
		if err != nil {
			return err
		}
	}
	st := map[string]float64{}
	for k, v := range stages {
		st[k] = v.Seconds()
	}
	return json.NewEncoder(os.Stdout).Encode(map[string]any{
		"mb_per_sec_out": float64(bytes) / 1e6 / secs, "seconds": secs, "cpu_seconds": cpuSeconds() - cpu0, "stages": st, "epochs": epochStats,
	})
}

func cpuSeconds() float64 {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
}

func minorFaults() int64 {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return ru.Minflt
}
