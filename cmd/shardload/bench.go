package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/pflag"

	"github.com/shardload/shardload"
	"github.com/shardload/shardload/cache"
	"github.com/shardload/shardload/decode"
	"github.com/shardload/shardload/device"
	"github.com/shardload/shardload/mem"
	"github.com/shardload/shardload/numa"
	"github.com/shardload/shardload/plan"
	"github.com/shardload/shardload/serve"
)

var benchCommand = command{
	name:  "bench",
	short: "run the whole pipeline: samples/s, MB/s, stage times, trainer wait",
	args:  "URL...",
	summary: `Run the whole pipeline (fetch, inflate, split, shuffle, decode, collate into pinned
slabs) over the shards for some epochs or batches, and report samples/s, MB/s
(stored and decompressed), time to first batch, peak RSS, where the time went per
stage, and, with --step-time, how long a trainer that holds each batch that long
would wait for data: the share of its time spent waiting after its first batch
(wait_fraction; the first batch's latency is reported on its own).`,
	setup: func(fs *pflag.FlagSet) func(context.Context, []string, io.Writer, io.Writer) error {
		var lf loaderFlags
		lf.register(fs, true)
		var df deviceFlags
		df.register(fs)
		epochs := fs.Int("epochs", 1, "epochs to run")
		batches := fs.Int("batches", 0, "stop after this many batches (0: run the epochs)")
		step := fs.Duration("step-time", 0, "simulated trainer step: hold each batch this long (e.g. 50ms)")
		asJSON := fs.Bool("json", false, "print one JSON object instead of the report")
		cpuProfile := fs.String("cpuprofile", "", "write a CPU profile of the run to this file (for go tool pprof)")
		verify := fs.Bool("verify", false, "read every batch back from the device and compare it with its slab (slow; fails on a difference)")
		metrics := fs.String("metrics", "", "serve Prometheus metrics at /metrics on this TCP address while the benchmark runs (as serve --metrics: the loader as session 0; :0 picks a port, printed on stderr)")
		withPprof := fs.Bool("pprof", false, "with --metrics on a loopback address, also serve Go's profiles at /debug/pprof there (they can hold URLs and credentials)")
		packSpec := fs.String("pack", "", "pack the documents of a field (1-D integer .npy members of indexed, uncompressed tar shards; or Megatron datasets, URLs ending in .idx, field tokens) into rows: FIELD:SEQ_LEN[:eos=ID][:pad=ID]; reports tokens/s")
		resumeAt := fs.Float64("resume-at", 0, "start the first epoch from the state after this fraction of its batches (0.5: half), as a trainer restarted from a checkpoint does: measures the restore (first_batch_seconds, read_before_first_batch_bytes)")
		return func(ctx context.Context, args []string, stdout, stderr io.Writer) error {
			if len(args) == 0 && len(lf.streams) == 0 && lf.streamsFile == "" {
				return fmt.Errorf("%w: no shard URLs given", errUsage)
			}
			switch {
			case *epochs < 1:
				return fmt.Errorf("%w: --epochs %d: want at least 1", errUsage, *epochs)
			case *batches < 0:
				return fmt.Errorf("%w: --batches %d: want 0 (the whole epochs) or more", errUsage, *batches)
			case *step < 0:
				return fmt.Errorf("%w: --step-time %v: want 0 (no trainer) or more", errUsage, *step)
			case !(*resumeAt >= 0 && *resumeAt < 1):
				return fmt.Errorf("%w: --resume-at %g: want a fraction in [0, 1)", errUsage, *resumeAt)
			}
			cfg, err := lf.config(args, stderr)
			if err != nil {
				return err
			}
			if err := df.apply(&cfg); err != nil {
				return err
			}
			placement := df.place(&cfg, stderr)
			setMemoryLimit(cfg.MemoryBudget())
			if *cpuProfile != "" {
				f, err := os.Create(*cpuProfile)
				if err != nil {
					return err
				}
				defer f.Close()
				if err := pprof.StartCPUProfile(f); err != nil {
					return err
				}
				defer pprof.StopCPUProfile()
			}
			if *packSpec != "" {
				return runPackedBench(ctx, cfg, *packSpec, *epochs, *batches, *step, *asJSON, stdout)
			}
			var mon *benchStats
			if *metrics != "" {
				if !cfg.NoAutotune {
					cfg.Tuner = shardload.NewTuner()
				}
				mon = &benchStats{rank: cfg.Rank, world: max(cfg.World, 1), start: time.Now(), budget: cfg.MemoryBudget(), tuner: cfg.Tuner}
				addr, stop, err := serveMetrics(*metrics, *withPprof, mon.stats, lf.rf.cache, stderr)
				if err != nil {
					return err
				}
				defer stop()
				fmt.Fprintf(stderr, "shardload bench: metrics on http://%s/metrics\n", addr)
			} else if *withPprof {
				return fmt.Errorf("%w: --pprof needs --metrics ADDR", errUsage)
			}
			res, err := bench(ctx, cfg, *epochs, *batches, *step, *verify, *resumeAt, mon)
			if err != nil {
				return err
			}
			res.Device.Placement = placement
			if *asJSON {
				enc := json.NewEncoder(stdout)
				return enc.Encode(res)
			}
			return res.report(stdout)
		}
	},
}

// deviceFlags choose bench's device-copy stage and where its loader runs.
type deviceFlags struct {
	device string
	gpu    int
	numa   bool
}

func (df *deviceFlags) register(fs *pflag.FlagSet) {
	fs.StringVar(&df.device, "device", "host", "device-copy stage: host (batches stay in pinned slabs), cuda (copy each batch to --gpu; fails without a driver) or auto (cuda when there is a GPU)")
	fs.IntVar(&df.gpu, "gpu", 0, "this rank's GPU as CUDA numbers it in this process (CUDA_VISIBLE_DEVICES applies): the cuda stage copies to it, and --numa places the loader on its NUMA node")
	fs.BoolVar(&df.numa, "numa", true, "place the loader on --gpu's NUMA node: its threads on that node's CPUs, its slabs in that node's memory (nothing to do on one node)")
}

// apply sets cfg's device stage.
func (df *deviceFlags) apply(cfg *shardload.Config) error {
	kind, err := device.ParseKind(df.device)
	if err != nil {
		return fmt.Errorf("%w: --device: %v", errUsage, err)
	}
	if df.gpu < 0 {
		return fmt.Errorf("%w: --gpu %d: want a CUDA device number, 0 or more", errUsage, df.gpu)
	}
	cfg.Device = device.Options{Kind: kind, GPU: df.gpu, Logf: cfg.Logf}
	return nil
}

// place applies --numa: it reads the topology, finds --gpu (a CUDA device number,
// through CUDA_VISIBLE_DEVICES) in PCI order, restricts the process's threads to its
// node's CPUs and makes cfg bind the slabs to that node's memory, warning on stderr
// where the system forbids it. It returns the plan's one line ("" with --numa=false).
func (df *deviceFlags) place(cfg *shardload.Config, stderr io.Writer) string {
	if !df.numa {
		return ""
	}
	topo, err := numa.Read("")
	if err != nil {
		fmt.Fprintf(stderr, "shardload: warning: NUMA placement skipped: %v\n", err)
		return ""
	}
	plan, err := topo.PlaceCUDA(df.gpu, os.Getenv("CUDA_VISIBLE_DEVICES"))
	if err != nil {
		fmt.Fprintf(stderr, "shardload: warning: NUMA placement skipped: --gpu %d: %v\n", df.gpu, err)
		return ""
	}
	if !plan.Placed() {
		return plan.Reason
	}
	if err := numa.SetProcessAffinity(plan.CPUs); err != nil {
		fmt.Fprintf(stderr, "shardload: warning: threads not placed: %v\n", err)
	}
	node := plan.Node
	cfg.BindSlabs = func(mem []byte) error { return numa.Bind(mem, node) }
	return plan.Reason
}

// verifyBatch reads b back from the device and compares it with its slab.
func verifyBatch(ctx context.Context, b *shardload.Batch, buf []byte) ([]byte, error) {
	tr := b.Transfer()
	buf = slices.Grow(buf[:0], tr.Len())[:tr.Len()]
	if err := tr.ReadBack(ctx, buf); err != nil {
		return buf, err
	}
	if i := mismatch(buf, b.Data()[:b.Used]); i >= 0 {
		return buf, fmt.Errorf("--verify: batch %d: byte %d of %d on the device differs from the slab's", b.Seq, i, tr.Len())
	}
	return buf, nil
}

// mismatch returns the first index where a and b differ, -1 if none.
func mismatch(a, b []byte) int {
	if bytes.Equal(a, b) {
		return -1
	}
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// benchStepHook, set by tests only, is called with the rank after each batch the
// trainer takes: ranks run in one process go in step through it, as trainers go
// through their collectives.
var benchStepHook func(rank int)

func bench(ctx context.Context, cfg shardload.Config, epochs, maxBatches int, step time.Duration, verify bool, resumeAt float64, mon *benchStats) (*benchResult, error) {
	start := time.Now()
	cpu0 := cpuTime()
	read0 := readBytes()
	fresh0, freshTime0 := mem.Fresh()
	// What the cache serves each epoch's reads, by tier (nothing without a cache);
	// the first epoch's counts the reads that find the counts and the state too.
	tally := new(cache.Tally)
	infos, err := shardload.Shards(cache.WithTally(ctx, tally), cfg)
	if err != nil {
		return nil, err
	}
	res := &benchResult{CountSeconds: time.Since(start).Seconds(), Stages: map[string]float64{}, StepSeconds: step.Seconds(),
		MemoryBudget: cfg.MemoryBudget()}
	for _, s := range infos {
		res.Estimated = res.Estimated || s.Estimated
	}
	cfg.Shards = infos
	if !cfg.NoAutotune && cfg.Tuner == nil {
		cfg.Tuner = shardload.NewTuner() // the epochs go on from the last one's settings
	}
	var resume *shardload.State
	if resumeAt > 0 {
		// The state a trainer restarted at that point would have saved: computed
		// from the plan, as the checkpoint holds it.
		plan, err := shardload.PlanOf(cache.WithTally(ctx, tally), cfg)
		if err != nil {
			return nil, err
		}
		st, err := shardload.StateAt(cache.WithTally(ctx, tally), cfg, int(resumeAt*float64(plan.Batches)))
		if err != nil {
			return nil, err
		}
		resume = &st
		res.ResumedAfter = st.Batches
	}
	var firstBatch time.Duration
	var consumed, samples int64     // batches and samples the trainer took
	var trainer, wait time.Duration // the simulated trainer: computing, and waiting after its first batch
	var readBack []byte
	epochStart := time.Now()
	// The epochs' reads, announced to the node's cache (with --cache-dir) so that it
	// evicts by next use (--cache-policy order).
	hints := serve.NewEpochHints(fmt.Sprintf("bench rank %d", cfg.Rank), cfg.Logf)
	defer hints.Close()
	for e := 0; e < max(epochs, 1); e++ {
		ecfg := cfg
		ecfg.Epoch = cfg.Epoch + e
		if e == 0 {
			ecfg.Resume = resume
		}
		if e > 0 {
			tally = new(cache.Tally)
		}
		// The epoch's reads are announced before its first.
		ecfg.Planned = func(p plan.Plan) { hints.OpenPlan(p, ecfg.Sources) }
		l, err := shardload.Open(cache.WithTally(ctx, tally), ecfg)
		if err != nil {
			return nil, err
		}
		mon.open(l, ecfg.Epoch, tally)
		taken := 0 // this epoch's batches
		res.Epochs++
		if e == 0 {
			res.PlanBatches = l.Plan().Batches
		}
		if res.Order == "" {
			res.Order = l.Order().Fingerprint()
		}
		for {
			t0 := time.Now()
			b, err := l.Next(ctx)
			if firstBatch > 0 {
				wait += time.Since(t0)
			}
			if err == io.EOF {
				break
			}
			if err != nil {
				l.Close()
				return nil, err
			}
			// The trainer waits for the batch to be on the device before its step.
			tw := time.Now()
			if err := b.Transfer().Wait(ctx); err != nil {
				b.Release()
				l.Close()
				return nil, err
			}
			if firstBatch > 0 {
				wait += time.Since(tw)
			} else {
				firstBatch = time.Since(start)
				res.ReadBeforeFirst = readBytes() - read0
			}
			if verify {
				if readBack, err = verifyBatch(ctx, b, readBack); err != nil {
					b.Release()
					l.Close()
					return nil, err
				}
				res.Device.Verified++
			}
			if step > 0 {
				t0 := time.Now()
				time.Sleep(step) // the simulated trainer computing on the batch
				trainer += time.Since(t0)
			}
			consumed++
			taken++
			hints.Batch(taken)
			samples += int64(b.Rows - b.Padded)
			b.Release()
			if benchStepHook != nil {
				benchStepHook(cfg.Rank)
			}
			if maxBatches > 0 && consumed >= int64(maxBatches) {
				break
			}
		}
		err = l.Close() // producers cut short by --batches add their byte counts as they stop
		mon.close(l)
		if err != nil {
			return nil, err
		}
		res.EpochSeconds = append(res.EpochSeconds, time.Since(epochStart).Seconds())
		epochStart = time.Now()
		res.add(l.Stats())
		res.addCache(ecfg.Epoch, tally.Bytes())
		res.Device.add(l)
		if maxBatches > 0 && consumed >= int64(maxBatches) {
			break
		}
	}
	// What the trainer took, not what the loader had prepared ahead of it.
	res.Batches, res.Samples = consumed, samples
	res.Seconds = time.Since(start).Seconds() - res.CountSeconds
	res.FirstBatch = firstBatch.Seconds()
	res.trainerSeconds = trainer.Seconds()
	res.SamplesPerSec = float64(res.Samples) / res.Seconds
	res.MBPerSec = float64(res.BytesIn) / 1e6 / res.Seconds
	res.MBPerSecDecomp = float64(res.BytesDecomp) / 1e6 / res.Seconds
	if w := wait.Seconds(); w+res.trainerSeconds > 0 {
		res.WaitFraction = w / (w + res.trainerSeconds)
	}
	res.Device.finish(step)
	res.PeakRSS = peakRSS()
	res.CPUSeconds = (cpuTime() - cpu0).Seconds()
	fresh, freshTime := mem.Fresh()
	res.ArenaFresh, res.ArenaFreshSecs = fresh-fresh0, (freshTime - freshTime0).Seconds()
	res.ArenaBasePages = mem.HugeDear()
	if res.Samples > 0 {
		res.CPUPerSample = res.CPUSeconds / float64(res.Samples)
	}
	if res.BytesIn > 0 {
		res.CPUPerGB = res.CPUSeconds / (float64(res.BytesIn) / 1e9)
	}
	for _, f := range cfg.Fields {
		if f.Kind == decode.KindImage {
			d, _ := cfg.ImageDecoder.Resolve()
			res.ImageDecoder = d.String()
		}
	}
	res.MemoryOverhead = shardload.MemoryOverhead
	if cfg.Tuner != nil {
		st := cfg.Tuner.Settings()
		res.Tuned = &st
	}
	res.addHints(hints.Stats())
	res.Bottleneck = res.bottleneck()
	res.RateLimit = throttledEndpoints()
	return res, nil
}

// cpuTime returns the user and system CPU time the process has used.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// peakRSS returns the process's peak resident set size (VmHWM) from the kernel.
func peakRSS() int64 {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			f := strings.Fields(rest)
			if len(f) == 2 && f[1] == "kB" {
				kb, _ := strconv.ParseInt(f[0], 10, 64)
				return kb << 10
			}
		}
	}
	return 0
}

// readBytes returns the bytes the process has read so far, from files and sockets
// alike (rchar in /proc/self/io), or 0 where that is not known.
func readBytes() int64 {
	data, err := os.ReadFile("/proc/self/io")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, "rchar:"); ok {
			n, _ := strconv.ParseInt(strings.TrimSpace(rest), 10, 64)
			return n
		}
	}
	return 0
}
