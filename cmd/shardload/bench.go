package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime/debug"
	"runtime/pprof"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/pflag"

	"github.com/shardload/shardload"
	"github.com/shardload/shardload/decode"
	"github.com/shardload/shardload/device"
	"github.com/shardload/shardload/index"
	"github.com/shardload/shardload/internal/knob"
	"github.com/shardload/shardload/internal/logs"
	"github.com/shardload/shardload/numa"
	"github.com/shardload/shardload/plan"
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

// loaderFlags are the flags that configure a pipeline, shared by the commands that
// run one: a flag per knob.Knob (written straight into cfg), and those that are
// not scalars. Those of the device-copy stage and of placement are bench's alone
// (deviceFlags): serve places each session itself.
type loaderFlags struct {
	rf            readFlags
	fs            *pflag.FlagSet
	cfg           shardload.Config // the knobs' flags' values: zero fields for those not given
	fields        []string
	onError       string
	errorBudget   float64
	budgetSamples int64
	budgetShards  int64
	index         string
	imageDecoder  string
	streams       []string // --stream
	streamsFile   string   // --streams
	epochSamples  int64
	batching      string
	startTimeout  time.Duration
}

// knobFlag is a knob.Knob as a flag: it sets the knob in a Config.
type knobFlag struct {
	k   knob.Knob
	cfg *shardload.Config
	set bool
}

func (f *knobFlag) String() string {
	if !f.set {
		return f.k.DefaultText()
	}
	return f.k.Value(f.cfg)
}

func (f *knobFlag) Set(s string) error {
	if err := f.k.Set(f.cfg, s); err != nil {
		return err
	}
	f.set = true
	return nil
}

func (f *knobFlag) Type() string {
	switch {
	case f.k.Bytes:
		return "size"
	case f.k.Value(&shardload.Config{}) == "false" || f.k.Value(&shardload.Config{}) == "true":
		return "bool"
	}
	return "int"
}

// register registers the pipeline's flags; with perRank, also those a trainer's
// hello says to serve (batch size, drop-last, seed, epoch, rank, world), which only
// bench takes from the command line.
func (lf *loaderFlags) register(fs *pflag.FlagSet, perRank bool) {
	lf.fs = fs
	fs.StringArrayVar(&lf.fields, "field", nil, "field to decode, repeatable: [NAME=]EXT[:KIND[:DTYPE[:SHAPE[:OPTIONS]]]], e.g. jpg, label=cls:int, tokens=npy:npy:int32:2048, img=jpg:image:uint8:224x224x3 (default: the extensions of the first sample). Kinds: raw, npy, int, text, json, image. An image (JPEG, PNG, WebP, GIF) is decoded to RGB, resized (bilinear, as PIL) and cropped: dtype uint8 (default), float16 or float32; shape HxWx3 (default 224x224x3), 3xHxW for CHW, HxWx1 or 1xHxW for grayscale; options, comma-separated: resize=N (shorter side before the center crop; default the crop's larger side), random-crop (RandomResizedCrop) with scale=A-B (0.08-1) and ratio=A-B (0.75-1.333), flip (random horizontal flip), mean=R/G/B and std=R/G/B or imagenet (float outputs: (x/255-mean)/std), full-decode (no reduced-scale JPEG decoding). Random transforms are seeded by --seed, the epoch and the sample's key")
	fs.StringVar(&lf.imageDecoder, "image-decoder", "auto", "JPEG decoder of image fields: libjpeg-turbo (loaded at run time from libturbojpeg.so.0, or $SHARDLOAD_TURBOJPEG), go (Go's image/jpeg, no C library, slower), or auto (libjpeg-turbo when it loads, else go)")
	for _, k := range knob.All {
		if k.Source || k.PerRank && !perRank {
			continue
		}
		f := &knobFlag{k: k, cfg: &lf.cfg}
		fs.Var(f, k.Name, k.Help)
		if f.Type() == "bool" {
			fs.Lookup(k.Name).NoOptDefVal = "true"
		}
	}
	fs.StringVar(&lf.onError, "on-error", "fail", "bad samples and shards: fail, or skip (each logged, counted, within the error budget)")
	fs.Float64Var(&lf.errorBudget, "error-budget", shardload.DefaultErrorBudget.Fraction, "fraction of the whole job's samples, or of its shards (all ranks together), that --on-error=skip may leave out before a rank fails (0: none)")
	fs.Int64Var(&lf.budgetSamples, "error-budget-samples", 0, "samples --on-error=skip may leave out before a rank fails, whatever --error-budget gives")
	fs.Int64Var(&lf.budgetShards, "error-budget-shards", 0, "shards --on-error=skip may leave out before a rank fails, whatever --error-budget gives")
	fs.StringArrayVar(&lf.streams, "stream", nil, "a stream of a mix, repeatable, instead of URL arguments: its URLs or patterns and one of weight=W (its share of each epoch, relative to the other streams'), repeat=R (R times its samples each epoch) or choose=N (N samples each epoch), separated by spaces, e.g. --stream 's3://b/web-{000..099}.tar weight=0.7' (none: its samples once an epoch; a stream drawn at fewer samples than it holds goes through them without replacement across epochs)")
	fs.StringVar(&lf.streamsFile, "streams", "", `a JSON file of the mix's streams instead of --stream: [{"urls": ["PATTERN", ...], "weight": W}, {"urls": [...], "repeat": R}, {"urls": [...], "choose": N}]`)
	fs.Int64Var(&lf.epochSamples, "epoch-samples", 0, "samples in each epoch of a mix of streams (0: what the streams give: their samples, or repeat or choose)")
	fs.StringVar(&lf.batching, "batching", "random", "how batches are made of a mix's streams: random (the mixed order), stratified (every batch holds each stream's share) or per_stream (every batch is one stream's, the batches in proportion)")
	fs.DurationVar(&lf.startTimeout, "start-timeout", shardload.DefaultStartTimeout, "the start of an epoch's planning (until the store has answered for the dataset's objects: their listing or Stats, or the index), and serve's --check of its store before it listens, fail with a message naming the store when they take longer than this: a store that does not answer or keeps throttling at start is an error within it, not a hang (0 or negative: no limit; a counting pass, --count-first or a mix, is not bounded by it)")
	fs.StringVar(&lf.index, "index", "", `index file or URL (from "shardload index"; JSON lines {"url","samples"} from "ls --summary --json" work too); without it the node's index store and an index object `+index.FileName+` beside the shards are used, and only shards none has are counted`)
	lf.rf.register(fs)
}

// check refuses what the knobs' flags do not (each refuses a value under its least
// on its own): a rank outside the world, a budget outside [0, 1].
func (lf *loaderFlags) check() error {
	var bad []string
	if world := max(lf.cfg.World, 1); lf.cfg.Rank >= world {
		bad = append(bad, fmt.Sprintf("--rank %d: want 0 to --world %d minus 1", lf.cfg.Rank, world))
	}
	if int64(lf.rf.maxMember) < 1 {
		bad = append(bad, fmt.Sprintf("--max-member-size %d: want at least 1", int64(lf.rf.maxMember)))
	}
	if !(lf.errorBudget >= 0 && lf.errorBudget <= 1) {
		bad = append(bad, fmt.Sprintf("--error-budget %g: want a fraction in [0, 1]", lf.errorBudget))
	}
	if lf.budgetSamples < 0 || lf.budgetShards < 0 {
		bad = append(bad, "--error-budget-samples and --error-budget-shards must not be negative")
	}
	if len(bad) > 0 {
		return fmt.Errorf("%w: %s", errUsage, strings.Join(bad, "; "))
	}
	return nil
}

// config returns the pipeline's settings for urls; callers check that there are some.
func (lf *loaderFlags) config(urls []string, stderr io.Writer) (shardload.Config, error) {
	if err := lf.check(); err != nil {
		return shardload.Config{}, err
	}
	policy, err := shardload.ParsePolicy(lf.onError)
	if err != nil {
		return shardload.Config{}, fmt.Errorf("%w: %v", errUsage, err)
	}
	fields, err := decode.ParseFields(lf.fields...)
	if err != nil {
		return shardload.Config{}, fmt.Errorf("%w: --field: %v", errUsage, err)
	}
	imageDecoder, err := decode.ParseImageDecoder(lf.imageDecoder)
	if err != nil {
		return shardload.Config{}, fmt.Errorf("%w: --image-decoder: %v", errUsage, err)
	}
	logger, err := newLogger(lf.rf.logFormat, stderr)
	if err != nil {
		return shardload.Config{}, err
	}
	cfg := lf.cfg
	// The fetch flags are every reading command's; given, they pin the loader's knobs.
	changed := func(name string) bool { return lf.fs != nil && lf.fs.Changed(name) }
	if changed("fetch-parallel") {
		cfg.FetchParallel = lf.rf.parallel
	}
	if changed("fetch-part-size") {
		cfg.FetchPartSize = int64(lf.rf.partSize)
	}
	cfg.URLs, cfg.Index, cfg.IndexDir, cfg.NoIndexStore = urls, lf.index, lf.rf.indexDir, lf.rf.noIndex || lf.rf.indexDir == ""
	cfg.Fields, cfg.ImageDecoder, cfg.MaxMemberSize = fields, imageDecoder, int64(lf.rf.maxMember)
	cfg.OnError, cfg.Logf, cfg.Sources = policy, logs.Printf(logger), lf.rf.sources()
	cfg.StartTimeout = lf.startTimeout
	if cfg.StartTimeout == 0 {
		cfg.StartTimeout = -1 // none
	}
	cfg.ErrorBudget = &shardload.Budget{Fraction: lf.errorBudget, Samples: lf.budgetSamples, Shards: lf.budgetShards}
	if cfg.Streams, err = lf.mix(); err != nil {
		return shardload.Config{}, err
	}
	if len(cfg.Streams) > 0 && len(urls) > 0 {
		return shardload.Config{}, fmt.Errorf("%w: give URL arguments or --stream/--streams, not both", errUsage)
	}
	if cfg.Batching, err = plan.ParseBatching(lf.batching); err != nil || lf.epochSamples < 0 {
		return shardload.Config{}, fmt.Errorf("%w: --batching %q, --epoch-samples %d: want random, stratified or per_stream, and 0 or more", errUsage, lf.batching, lf.epochSamples)
	}
	if cfg.EpochSamples = lf.epochSamples; len(cfg.Streams) == 0 && (cfg.EpochSamples != 0 || cfg.Batching != plan.Random) {
		return shardload.Config{}, fmt.Errorf("%w: --epoch-samples and --batching are settings of a mix of streams (--stream, --streams)", errUsage)
	}
	return cfg, nil
}

// mix returns the streams of --stream or --streams, none without them.
func (lf *loaderFlags) mix() ([]shardload.Stream, error) {
	if lf.streamsFile != "" {
		if len(lf.streams) > 0 {
			return nil, fmt.Errorf("%w: --stream and --streams are both given", errUsage)
		}
		b, err := os.ReadFile(lf.streamsFile)
		if err != nil {
			return nil, err
		}
		var streams []shardload.Stream
		dec := json.NewDecoder(bytes.NewReader(b))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&streams); err != nil {
			return nil, fmt.Errorf("%w: --streams %s: %v", errUsage, lf.streamsFile, err)
		}
		for i, st := range streams {
			if len(st.URLs) == 0 {
				return nil, fmt.Errorf("%w: --streams %s: stream %d has no urls", errUsage, lf.streamsFile, i)
			}
		}
		return streams, nil
	}
	var streams []shardload.Stream
	for _, spec := range lf.streams {
		st, err := parseStream(spec)
		if err != nil {
			return nil, fmt.Errorf("%w: --stream %q: %v", errUsage, spec, err)
		}
		streams = append(streams, st)
	}
	return streams, nil
}

// parseStream parses a --stream: URLs or patterns and weight=W, repeat=R or
// choose=N, separated by spaces.
func parseStream(spec string) (shardload.Stream, error) {
	var st shardload.Stream
	for _, f := range strings.Fields(spec) {
		k, v, _ := strings.Cut(f, "=")
		var err error
		switch k {
		case "weight":
			st.Weight, err = strconv.ParseFloat(v, 64)
		case "repeat":
			st.Repeat, err = strconv.ParseFloat(v, 64)
		case "choose":
			st.Choose, err = strconv.ParseInt(v, 10, 64)
		default:
			st.URLs = append(st.URLs, f)
		}
		if err != nil {
			return st, fmt.Errorf("%s: %v", f, err)
		}
	}
	if len(st.URLs) == 0 {
		return st, errors.New("no URLs")
	}
	return st, nil
}

// setMemoryLimit sets the Go runtime's soft memory limit of a loader process to its
// loaders' budgets plus shardload.MemoryOverhead, unless GOMEMLIMIT sets one: the
// heap's garbage (part and sample buffers the pools drop) is collected before the
// process grows past what it states.
func setMemoryLimit(budgets int64) {
	if os.Getenv("GOMEMLIMIT") == "" {
		debug.SetMemoryLimit(budgets + shardload.MemoryOverhead)
	}
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

// benchResult is what bench reports; its JSON form is stable for scripts.
type benchResult struct {
	Samples         int64               `json:"samples"`
	Batches         int64               `json:"batches"`
	Epochs          int                 `json:"epochs"`
	BytesIn         int64               `json:"bytes_in"`
	Requests        int64               `json:"requests"` // reads of shards opened (spans of the plan, count checks)
	BytesDecomp     int64               `json:"bytes_decompressed"`
	BytesOut        int64               `json:"bytes_out"`
	Seconds         float64             `json:"seconds"`
	EpochSeconds    []float64           `json:"epoch_seconds"`
	CountSeconds    float64             `json:"count_seconds"` // finding the shards' counts (an index, estimates or a count)
	Estimated       bool                `json:"estimated_counts"`
	ResumedAfter    int                 `json:"resumed_after_batches,omitempty"` // --resume-at: the batches the state had consumed
	PlanBatches     int                 `json:"plan_batches"`                    // the batches the first epoch's plan holds for the rank (after ResumedAfter)
	Order           string              `json:"order_fingerprint"`               // the first epoch's Order, the same on every rank of a job
	ReadBeforeFirst int64               `json:"read_before_first_batch_bytes"`   // bytes the process read (files and sockets) before the first batch`
	SamplesPerSec   float64             `json:"samples_per_sec"`
	MBPerSec        float64             `json:"mb_per_sec"`
	MBPerSecDecomp  float64             `json:"mb_per_sec_decompressed"`
	FirstBatch      float64             `json:"first_batch_seconds"`
	PeakRSS         int64               `json:"peak_rss_bytes"`
	CPUSeconds      float64             `json:"cpu_seconds"`             // user + system CPU time of the process over the run
	CPUPerSample    float64             `json:"cpu_seconds_per_sample"`  // CPUSeconds / Samples
	CPUPerGB        float64             `json:"cpu_seconds_per_gb"`      // CPUSeconds per 10^9 bytes read (BytesIn)
	ImageDecoder    string              `json:"image_decoder,omitempty"` // the JPEG decoder of image fields`
	StepSeconds     float64             `json:"step_seconds"`
	WaitFraction    float64             `json:"wait_fraction"`
	Skipped         int64               `json:"skipped"`
	Padded          int64               `json:"padded"`
	Trimmed         int64               `json:"trimmed"`
	Workers         int                 `json:"workers"`
	Stages          map[string]float64  `json:"stages"`
	Bottleneck      string              `json:"bottleneck"`
	MemoryBudget    int64               `json:"memory_budget_bytes"`
	MemoryOverhead  int64               `json:"memory_overhead_bytes"`
	Tuned           *shardload.Settings `json:"tuned,omitempty"` // where the tuner settled; nil with --autotune=false
	SlabsPageLocked bool                `json:"slabs_page_locked"`
	Device          deviceResult        `json:"device"`
	// Streams are each stream's figures in a mix of streams (--stream), in order.
	Streams []streamResult `json:"streams,omitempty"`
	// RateLimit is, per endpoint the store throttled, what the process's request rate
	// limiter did (none when no store throttled).
	RateLimit      []rateLimitResult `json:"rate_limit,omitempty"`
	trainerSeconds float64
}

// streamResult is one stream's part of the report of a mix.
type streamResult struct {
	Samples int64 `json:"samples"`
	BytesIn int64 `json:"bytes_in"`
	Skipped int64 `json:"skipped"`
}

// deviceResult is the device-copy stage's part of the report.
type deviceResult struct {
	Kind        string  `json:"kind"`
	Name        string  `json:"name"`
	Placement   string  `json:"placement,omitempty"`
	Copies      int64   `json:"copies"`
	Bytes       int64   `json:"bytes"`
	CopySeconds float64 `json:"copy_seconds"`
	GBPerSec    float64 `json:"gb_per_sec"`
	WaitSeconds float64 `json:"wait_seconds"`
	// Overlap is the share of copy time the trainer did not wait for; Overlapped
	// says whether copies hid behind a --step-time step (at least 90% of it).
	Overlap    float64 `json:"overlap"`
	Overlapped bool    `json:"overlapped"`
	Verified   int64   `json:"verified_batches"`
}

func (d *deviceResult) add(l *shardload.Loader) {
	st := l.DeviceStats()
	d.Kind, d.Name = string(st.Kind), l.Device().String()
	d.Copies += st.Copies
	d.Bytes += st.Bytes
	d.CopySeconds += st.CopyTime.Seconds()
	d.WaitSeconds += st.WaitTime.Seconds()
}

func (d *deviceResult) finish(step time.Duration) {
	st := device.Stats{Bytes: d.Bytes, CopyTime: time.Duration(d.CopySeconds * float64(time.Second)),
		WaitTime: time.Duration(d.WaitSeconds * float64(time.Second))}
	d.GBPerSec, d.Overlap = st.GBPerSec(), st.Overlap()
	d.Overlapped = step > 0 && d.CopySeconds > 0 && d.Overlap >= 0.9
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

func bench(ctx context.Context, cfg shardload.Config, epochs, maxBatches int, step time.Duration, verify bool, resumeAt float64, mon *benchStats) (*benchResult, error) {
	start := time.Now()
	cpu0 := cpuTime()
	read0 := readBytes()
	infos, err := shardload.Shards(ctx, cfg)
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
		plan, err := shardload.PlanOf(ctx, cfg)
		if err != nil {
			return nil, err
		}
		st, err := shardload.StateAt(ctx, cfg, int(resumeAt*float64(plan.Batches)))
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
	for e := 0; e < max(epochs, 1); e++ {
		ecfg := cfg
		ecfg.Epoch = cfg.Epoch + e
		if e == 0 {
			ecfg.Resume = resume
		}
		l, err := shardload.Open(ctx, ecfg)
		if err != nil {
			return nil, err
		}
		mon.open(l, ecfg.Epoch)
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
			samples += int64(b.Rows - b.Padded)
			b.Release()
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
	res.Bottleneck = res.bottleneck()
	res.RateLimit = throttledEndpoints()
	return res, nil
}

func (r *benchResult) add(st shardload.Stats) {
	r.BytesIn += st.BytesIn
	r.Requests += st.Requests
	r.BytesDecomp += st.BytesInflated
	r.BytesOut += st.BytesOut
	r.Skipped += st.Skipped
	r.Padded += st.Padded
	r.Trimmed += st.Trimmed
	r.Workers = st.Workers
	r.SlabsPageLocked = st.PageLocked
	for i, s := range st.Streams {
		if i == len(r.Streams) {
			r.Streams = append(r.Streams, streamResult{})
		}
		r.Streams[i].Samples += s.Samples
		r.Streams[i].BytesIn += s.BytesIn
		r.Streams[i].Skipped += s.Skipped
	}
	for k, v := range st.Stages {
		r.Stages[k] += v.Seconds()
	}
}

// bottleneck names, in one line, what limits the loader: nothing when the trainer
// barely waits, otherwise the stage busiest for the goroutines that run it.
func (r *benchResult) bottleneck() string {
	if r.StepSeconds > 0 && r.WaitFraction < 0.01 {
		return fmt.Sprintf("none: the trainer waited %.1f%% of its time; the loader keeps up with a %s step", 100*r.WaitFraction, time.Duration(r.StepSeconds*float64(time.Second)))
	}
	type load struct {
		stage string
		share float64
	}
	var loads []load
	for _, s := range []string{"fetch", "inflate", "split", "decode"} {
		loads = append(loads, load{s, r.Stages[s] / (r.Seconds * float64(r.Workers))})
	}
	for _, s := range []string{"shuffle", "collate"} {
		loads = append(loads, load{s, r.Stages[s] / r.Seconds})
	}
	sort.SliceStable(loads, func(i, j int) bool { return loads[i].share > loads[j].share })
	top := loads[0]
	who := fmt.Sprintf("%d workers'", r.Workers)
	if top.stage == "shuffle" || top.stage == "collate" {
		who = "the mixer's"
	}
	msg := fmt.Sprintf("%s: %.0f%% of %s time", top.stage, 100*top.share, who)
	if r.StepSeconds > 0 {
		msg = fmt.Sprintf("loader-bound, the trainer waited %.0f%% of its time; busiest stage %s", 100*r.WaitFraction, msg)
	}
	return msg
}

func (r *benchResult) report(w io.Writer) error {
	bw := bufio.NewWriter(w)
	fmt.Fprintf(bw, "bench: %d samples in %d batches (%d epoch(s)) in %.2fs", r.Samples, r.Batches, r.Epochs, r.Seconds)
	if r.CountSeconds > 0.005 {
		fmt.Fprintf(bw, ", after %.2fs finding the sample counts", r.CountSeconds)
	}
	if r.Estimated {
		fmt.Fprintf(bw, " (estimated from the shards' sizes: %d rows padded, %d samples trimmed)", r.Padded, r.Trimmed)
	}
	if len(r.EpochSeconds) > 1 {
		fmt.Fprintf(bw, "\n  epochs took")
		for _, s := range r.EpochSeconds {
			fmt.Fprintf(bw, " %.2fs", s)
		}
	}
	fmt.Fprintf(bw, "\n  %.0f samples/s, %.1f MB/s stored, %.1f MB/s decompressed, %.1f MB/s into slabs\n",
		r.SamplesPerSec, r.MBPerSec, r.MBPerSecDecomp, float64(r.BytesOut)/1e6/r.Seconds)
	fmt.Fprintf(bw, "  CPU %.2fs (%.0f µs a sample, %.2f s a GB read)", r.CPUSeconds, 1e6*r.CPUPerSample, r.CPUPerGB)
	if r.ImageDecoder != "" {
		fmt.Fprintf(bw, "; images decoded by %s", r.ImageDecoder)
	}
	fmt.Fprintln(bw)
	fmt.Fprintf(bw, "  first batch after %.3fs (%.1f MB read before it); peak RSS %.0f MB (memory budget %.0f MB + %.0f MB for the process); slabs page-locked: %v\n",
		r.FirstBatch, float64(r.ReadBeforeFirst)/1e6, float64(r.PeakRSS)/1e6, float64(r.MemoryBudget)/1e6, float64(r.MemoryOverhead)/1e6, r.SlabsPageLocked)
	if r.Tuned != nil {
		state := "still trying changes"
		if r.Tuned.Settled {
			state = "settled"
		}
		fmt.Fprintf(bw, "  autotune: %s (%d changes kept, %s)\n", r.Tuned, r.Tuned.Changes, state)
	}
	for i, s := range r.Streams {
		fmt.Fprintf(bw, "  stream %d: %d samples (%.1f%%), %.1f MB read, %d skipped\n", i, s.Samples, 100*float64(s.Samples)/float64(max(r.Samples, 1)), float64(s.BytesIn)/1e6, s.Skipped)
	}
	fmt.Fprintf(bw, "  stages (seconds, summed over %d workers):", r.Workers)
	for _, s := range shardload.StageNames {
		fmt.Fprintf(bw, " %s %.2f", s, r.Stages[s])
	}
	fmt.Fprintln(bw)
	if r.Skipped > 0 || r.Padded > 0 {
		fmt.Fprintf(bw, "  skipped %d samples, padded %d rows\n", r.Skipped, r.Padded)
	}
	if r.StepSeconds > 0 {
		fmt.Fprintf(bw, "  trainer step %s: waited %.1f%% of its time (GPU busy %.1f%% as the loader sees it)\n",
			time.Duration(r.StepSeconds*float64(time.Second)), 100*r.WaitFraction, 100*(1-r.WaitFraction))
	}
	d := r.Device
	if d.Kind == string(device.CUDA) {
		fmt.Fprintf(bw, "  device %s: %d copies, %.1f MB in %.3fs of copy time: %.2f GB/s host to device",
			d.Name, d.Copies, float64(d.Bytes)/1e6, d.CopySeconds, d.GBPerSec)
		if r.StepSeconds > 0 {
			fmt.Fprintf(bw, "; trainer waited %.3fs for copies, %.0f%% of copy time overlapped the step (overlapped: %v)",
				d.WaitSeconds, 100*d.Overlap, d.Overlapped)
		}
		fmt.Fprintln(bw)
	} else {
		fmt.Fprintf(bw, "  device host: no copy; %d batches (%.1f MB) passed the stage in their pinned slabs, counting those prepared ahead of the trainer\n", d.Copies, float64(d.Bytes)/1e6)
	}
	if d.Verified > 0 {
		fmt.Fprintf(bw, "  verified: %d batches on the device equal their slabs\n", d.Verified)
	}
	if d.Placement != "" {
		fmt.Fprintf(bw, "  placement: %s\n", d.Placement)
	}
	for _, e := range r.RateLimit {
		fmt.Fprintf(bw, "  %s\n", e)
	}
	fmt.Fprintf(bw, "  bottleneck: %s\n", r.Bottleneck)
	return bw.Flush()
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
