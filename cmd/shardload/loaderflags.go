package main

// The loader's flags and the Config they make, shared by bench and serve.

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/shardload/shardload"
	"github.com/shardload/shardload/decode"
	"github.com/shardload/shardload/index"
	"github.com/shardload/shardload/logs"
	"github.com/shardload/shardload/plan"
)

// loaderFlags are the flags that configure a pipeline, shared by the commands that
// run one: a flag per shardload.Knob (written straight into cfg), and those that are
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

// knobFlag is a shardload.Knob as a flag: it sets the knob in a Config.
type knobFlag struct {
	k   shardload.Knob
	cfg *shardload.Config
	set bool
}

func (f *knobFlag) String() string {
	if !f.set {
		return f.k.DefaultText(shardload.Config{})
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
	for _, k := range shardload.Knobs {
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
	if err := localWorldSize(&cfg, lf.fs); err != nil {
		return shardload.Config{}, err
	}
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

// localWorldSize sets cfg.RanksPerNode from torchrun's LOCAL_WORLD_SIZE when the
// command has a --ranks-per-node flag and it was not given (nor SHARDLOAD_RANKS_PER_NODE).
func localWorldSize(cfg *shardload.Config, fs *pflag.FlagSet) error {
	if fs == nil || fs.Lookup("ranks-per-node") == nil || fs.Changed("ranks-per-node") {
		return nil
	}
	v, ok := os.LookupEnv("LOCAL_WORLD_SIZE")
	if !ok || v == "" {
		return nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 || n > plan.MaxWorld {
		return fmt.Errorf("%w: LOCAL_WORLD_SIZE=%q (the default of --ranks-per-node): want a number of ranks", errUsage, v)
	}
	cfg.RanksPerNode = n
	return nil
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
