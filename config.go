package shardload

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"time"

	"github.com/shardload/shardload/decode"
	"github.com/shardload/shardload/device"
	"github.com/shardload/shardload/internal/budget"
	"github.com/shardload/shardload/internal/pipeline"
	"github.com/shardload/shardload/internal/tune"
	"github.com/shardload/shardload/logs"
	"github.com/shardload/shardload/pack"
	"github.com/shardload/shardload/packed"
	"github.com/shardload/shardload/pinned"
	"github.com/shardload/shardload/plan"
	"github.com/shardload/shardload/shard"
	"github.com/shardload/shardload/source"
)

// Policy says what happens when a sample or shard is bad: Fail or Skip.
type Policy = pipeline.Policy

const (
	// Fail stops the loader at the first bad sample or shard: Next returns the error.
	Fail = pipeline.Fail
	// Skip leaves bad samples (and the rest of a bad shard) out, logs each once with
	// shard URL, key and cause, counts them, and fails only when more than
	// Config.ErrorBudget allows were skipped.
	Skip = pipeline.Skip
)

// ParsePolicy parses "fail" or "skip".
func ParsePolicy(s string) (Policy, error) { return pipeline.ParsePolicy(s) }

// Config configures a Loader. The zero value plus URLs works: one rank, batches of 32,
// shuffled, fields taken from the first sample of the first shard with the decoder
// each extension suggests (see decode.ParseField), failing on the first bad sample.
// Each default is stated beside its field.
type Config struct {
	// URLs are shard URLs or brace patterns (s3://b/train-{000000..000099}.tar).
	URLs []string
	// Shards, when set, gives the shards with their sample counts and replaces URLs,
	// Index and the counting pass (see Count).
	Shards []shard.Info
	// Streams, instead of URLs or Shards, mixes several datasets into each epoch
	// (Stream, plan.Mix): an epoch of EpochSamples samples (default: what the
	// streams give), made into batches by Batching (Random, the default: the mixed
	// order; Stratified: every batch holds each stream's share; PerStream: every
	// batch is one stream's, in proportion). A mix is planned from exact counts: its
	// shards are counted before the first batch when no index has them. One stream
	// of weight 1 is a job of its URLs, with its order.
	Streams      []Stream
	EpochSamples int64
	Batching     plan.Batching
	// Pack, when set ("FIELD:SEQ_LEN[:eos=ID][:pad=ID]", pack.ParseSpec), packs the
	// documents of FIELD (1-D integer arrays: a tar shard's .npy member, or a
	// Megatron dataset's tokens, a URL ending in .idx) into rows of SEQ_LEN tokens:
	// batches of BatchSize rows with the columns input_ids, position_ids,
	// cu_seqlens and max_seqlen instead of the fields (see package packed, and the
	// README's "Language models"). A State then resumes on any world size by rows.
	// With Streams, a stream's weight is its share of the epoch's tokens, and
	// EpochTokens (default: what the streams give) an epoch's length in tokens.
	Pack        string
	EpochTokens int64
	// Index is an index file or URL (package index), as "shardload index" writes;
	// JSON lines {"url": ..., "samples": N} ("shardload ls --summary --json") work too.
	// Without it (and without Shards), Open looks in the node's index store and for
	// an index object beside the shards, and counts the shards none has (see Count).
	// Lines match shards by their URL with secrets removed (package redact): a
	// presigned URL's index stays valid when its signature changes.
	Index string
	// IndexDir is the node's index store (package index): the entries of the shards
	// counted on this node, kept for later runs and other processes. Default
	// $SHARDLOAD_INDEX_DIR, else shardload/index in the user's cache directory.
	IndexDir string
	// NoIndexStore neither reads nor writes the index store.
	NoIndexStore bool
	// CountFirst plans from exact counts when there is no index: Open reads every
	// shard the node's index store lacks before the first batch (see Count). By
	// default such shards' counts are estimated from their sizes (see Shards): the
	// first batch comes at once, every rank yields the planned number of batches
	// (Plan().Batches, a job of one rank too), and a shard with more or fewer samples
	// than estimated makes ranks leave some out or repeat some.
	CountFirst bool
	// AllowEstimate lets a job of more than one rank plan its epochs from estimated
	// counts (no index, no CountFirst): each rank yields the same number of batches,
	// but a shard holding more or fewer samples than estimated makes ranks leave some
	// out (Stats.Trimmed) or repeat some (Stats.Padded), reported at each epoch's end.
	// Without it such a job fails at Open with ErrEstimated, before any batch: a
	// silent loss of samples is worse than a clear error. A job of one rank needs no
	// permission: its epochs too are exactly the planned batches (Plan().Batches),
	// padded or trimmed to them, with the same reports.
	AllowEstimate bool
	// StartTimeout bounds the start of Open's planning (and of Shards): the time
	// until the store has answered for the dataset's objects (their listing or
	// Stats, or the index). A store that does not answer or keeps throttling fails
	// Open with ErrStartTimeout within it, naming the dataset, instead of waiting on
	// retries of every shard (one that refuses, a missing bucket or a wrong key,
	// fails at its first refusal). Once the store has answered, counting the shards
	// the index lacks and reading the first sample are bounded by the sources'
	// retries, not by it. Default DefaultStartTimeout (1 minute); negative: none (ctx
	// alone bounds Open). A job that counts its shards before the first batch
	// (CountFirst, or a mix of Streams) is not bounded by it.
	StartTimeout time.Duration

	// Fields to decode and collate. Default: every extension of the first sample of
	// the first shard, each with decode.ParseField's default for it.
	Fields []decode.Field
	// ImageDecoder decodes image fields' JPEGs: libjpeg-turbo, loaded at run time,
	// when it loads (the zero value, decode.ImageDecoderAuto), or as chosen. Open
	// fails when libjpeg-turbo is asked for and does not load.
	ImageDecoder decode.ImageDecoder
	// BatchSize is the number of samples per batch. Default 32.
	BatchSize int
	// DropLast drops the last batch of an epoch when it is not full.
	DropLast bool

	// Seed and Epoch seed the order of the epoch's samples: a pure function of (the
	// shards and their counts, Seed, Epoch, the shuffle settings), which World does
	// not change (see plan.Order); each rank reads a contiguous part of it.
	Seed  uint64
	Epoch int
	// Rank in [0, World) and World, the number of ranks of a distributed job. Every
	// rank gets the same number of batches (see plan.New). Default 0 of 1.
	Rank, World int
	// RanksPerNode says the ranks sit on nodes of RanksPerNode consecutive ranks
	// (torchrun's LOCAL_WORLD_SIZE). A shuffled epoch of more than one node then
	// keeps each node on the same shards from epoch to epoch, shuffled anew within
	// the node, so that the nodes' caches add up (plan.Config.RanksPerNode); a state
	// records the layout and resumes exactly on any other. 0 (the default): one order
	// for any layout. NoNodeAffinity keeps that order whatever RanksPerNode says.
	RanksPerNode   int
	NoNodeAffinity bool
	// Resume, when set, continues an epoch from a State that Loader.State returned,
	// in a job of this World (the same or another): the loader reads none of what
	// was consumed before. Its Epoch is the epoch read (Config.Epoch must be 0 or the
	// same); the dataset, Seed and shuffle settings must be those the state was saved
	// under (ErrResume otherwise). BatchSize may differ.
	Resume *State

	// NoShuffle reads shards and samples in order. The shuffle window's bytes then go
	// to the open shards' queues (ShuffleBytes/OpenShards more each), so that the
	// shards after the one being consumed are read and decoded ahead.
	NoShuffle bool
	// ShuffleBuffer is the most samples the shuffle holds: the order permutes
	// windows of half as many samples, each drawn from OpenShards regions of the
	// shuffled shard list (plan.Order), and the loader holds two (the one it
	// yields and the next). Default 1000.
	ShuffleBuffer int
	// ShuffleBytes caps the bytes the shuffle holds: the windows hold fewer samples
	// when ShuffleBytes over the dataset's mean stored sample size (from the shards'
	// sizes) is less than ShuffleBuffer. Default 64 MiB: a larger window shuffles
	// better but costs cache misses on every sample (see BENCHMARKS.md).
	ShuffleBytes int64
	// OpenShards is the number of lanes the shuffled order interleaves, and the
	// number of shards read at once. Default 8.
	OpenShards int
	// Workers is the number of shards being read (fetched, inflated, split and
	// decoded) at the same moment; opening a shard (and waiting for its first byte)
	// takes no worker. Default OpenShards + ReadAhead, from any source (a worker
	// for each open shard: one that waits, for the network, a page fault or room on
	// its queue, leaves its core to another); then the tuner's.
	Workers int
	// ReadAhead is the shards opened beyond OpenShards, ahead of the order: each is
	// read and its first QueueBytes of samples queued before the windows need them,
	// which hides a store's latency per request (small shards, a distant store). It
	// does not change the order. Default 0, then the tuner's; set, it is pinned.
	ReadAhead int
	// QueueBytes caps the decoded samples waiting per open shard. Default 2 MiB,
	// then the tuner's.
	QueueBytes int64
	// FetchParallel and FetchPartSize are the ranged parts of remote reads: at most
	// FetchParallel parts of FetchPartSize bytes in flight per shard (see
	// source.FetchOptions). Set, they override the Fetchers' own options for this
	// loader's reads (source.WithTuning). Default source.DefaultParallel and
	// source.DefaultPartSize, then the tuner's; with NoAutotune and neither set,
	// the Fetchers' own options.
	FetchParallel int
	FetchPartSize int64

	// Memory is the budget of the loader's buffers, in bytes: the slab ring, the
	// decoded samples (the open shards' queues, the shuffle windows, the batches being
	// collated), the remote reads' parts and the open shards' decompressors (see
	// MemoryBudget), and what grows with
	// the dataset: the shards' index entries and the plan. Open fails with
	// ErrMemory when the settings set need more; the settings left to their defaults
	// are lowered to fit, and the tuner never raises them past it. The process holds
	// MemoryOverhead more. Default 1 GiB (DefaultMemory).
	Memory int64
	// NoAutotune keeps Workers, QueueBytes and the fetch settings as they are set (or
	// default) for the whole epoch. By default the loader tunes those it was not
	// given while it runs (package doc: Autotuning): every half second it compares
	// the rate it delivers with the last, keeps a change that raised it by 5% or
	// more, and undoes one that did not, while its consumer waits for it; Workers,
	// QueueBytes, FetchParallel and FetchPartSize when set are left alone. No
	// setting the tuner changes alters the batches.
	NoAutotune bool
	// Tuner, when set, carries the tuner's settings from loader to loader: give one
	// to every epoch's loader of a job (Tuner.Settings says where it is). Default:
	// a tuner of the loader's own, starting from the defaults.
	Tuner *Tuner
	// ReadGap: the samples a rank wants of a window it holds only some of are read
	// with one request per run of them (a window shared with another rank is a run
	// of each lane; a resumed rank's first window, a DropLast rank's last and a
	// window a stratified mix's ranks share may be scattered), and two runs of
	// one shard are read in one request, dropping the samples between them, when
	// these take at most ReadGap bytes. Default: the request cost of the first shard's
	// source (source.RequestCostOf: 64 KiB for local files, 1 MiB for object stores
	// and HTTP). Negative: one request per run, reading no sample the rank does not
	// yield.
	ReadGap int64
	// MaxMemberSize caps one tar member in memory. Default 256 MiB.
	MaxMemberSize int64
	// MaxSampleSize caps one sample's members together in memory. Default 1 GiB
	// (shard.DefaultMaxSampleSize); a larger sample is an error of its own.
	MaxSampleSize int64
	// MaxRatio caps the decompression ratio of a compressed shard. Default 1000.
	MaxRatio float64

	// Slabs is the number of batch slabs in the ring: batches ready or in use at once.
	// Default 4.
	Slabs int
	// SlabBytes is the size of one slab. Default: sized from the batch (SlabSize):
	// exact for fixed-size fields (images, labels, npy with a shape), from the
	// shards' mean sample size for ragged ones. A batch that does not fit grows its
	// slab, as far as MaxSlabBytes and Memory allow (one log line); only a batch
	// beyond them fails, with the size it needs, and before the first batch when its
	// fixed-size fields alone do not fit.
	SlabBytes int64
	// MaxSlabBytes is the largest a slab may be, given or grown. Default 1 GiB
	// (DefaultMaxSlabBytes).
	MaxSlabBytes int64
	// SlabReads reads the members of raw, text and json fields whose sizes an index
	// gives straight into their rows of the slab that will carry them, where a free
	// slab could be taken for the batch before they are read (its rows are in the
	// windows being filled), instead of into sample memory and copied at collate.
	// The batches are the same bytes either way. Off by default: on the machines
	// measured the reads into the slabs' cold memory cost what the copy saved (see
	// BENCHMARKS.md, "Reads straight into slab rows").
	SlabReads bool
	// NoLock does not page-lock the slabs.
	NoLock bool
	// Ring, when set, is the slab ring batches are collated into, instead of one the
	// loader creates from Slabs, SlabBytes and NoLock. The loader does not close it,
	// so one ring can serve several epochs (a server shares it with a trainer once).
	// Without it, loaders opened one after another with the same slab settings share
	// one ring too (see Loader.Close).
	Ring *pinned.Ring
	// BindSlabs, when set, is called with each new slab's memory before its pages
	// are faulted in: numa.Bind(mem, node) places the slabs on the node of the GPU
	// they feed (see pinned.Options.Bind). A failure gives one warning. Not used with
	// Ring.
	BindSlabs func(mem []byte) error
	// CPUs, when set, are the CPUs the loader's workers and mixer run on: each wires
	// its goroutine to an OS thread restricted to them (numa.LockThread), so that a
	// pipeline runs on the NUMA node of the GPU it feeds without restricting the rest
	// of the process. serve sets them per session. A failure gives one warning.
	CPUs []int
	// Device is the device-copy stage after collation (package device). The zero
	// value is the host backend: batches stay in their slabs. device.CUDA copies each
	// batch to GPU Device.GPU (Batch.Transfer says when it is there); device.Auto does
	// so when there is a GPU. Device.BufferBytes defaults to the slab size.
	Device device.Options

	// OnError is the error policy, Fail by default.
	OnError Policy
	// ErrorBudget is what the Skip policy may leave out of the whole job's epoch (all
	// ranks together) before the loader fails. nil means DefaultErrorBudget (1% of
	// the samples or of the shards); &Budget{} allows nothing.
	ErrorBudget *Budget

	// Sources resolves URLs. Default source.Default.
	Sources *source.Registry
	// Planned, if not nil, is called by Open with the rank's plan of the epoch (what
	// it reads, after any Resume) before any shard is read for it (fields left to
	// infer read the first sample before): the place to announce the epoch's reads
	// to a cache that evicts by next use (serve.EpochHints.OpenPlan), so that they
	// count from the epoch's first read. With Pack, the plan has the rank's Batches
	// and, as spans without samples, the reads of the objects (tar shards, Megatron
	// .bin files) in order, each at its first read and its last
	// (packed.Planned.ReadPlan).
	Planned func(plan.Plan)
	// Logger receives the loader's log lines: one per skipped sample or shard, and
	// the warnings (at level Warn; the others at Info). Default: Logf when set, else
	// slog.Default(). Nothing the loader logs goes anywhere else.
	Logger *slog.Logger
	// Logf, when set and Logger is not, receives the log lines as Printf-style
	// calls instead.
	Logf func(format string, args ...any)

	pins      tune.Pins // the tuner's knobs the caller set
	logKey    any       // the logger's identity (see once)
	defaulted bool
	// answered lifts Open's start timeout once the store answered for the
	// dataset's objects (index.Lookup.Answered); nil outside Open.
	answered func()
}

// Budget bounds what the Skip policy may leave out of one epoch of the whole job
// (see pipeline.ErrorBudget): Fraction of the job's samples and shards, or Samples
// and Shards, whichever is more.
type Budget = pipeline.ErrorBudget

// DefaultErrorBudget is the budget of a Config whose ErrorBudget is nil: 1% of the
// job's samples or shards.
var DefaultErrorBudget = Budget{Fraction: 0.01}

// The defaults of Config's zero fields, each defined once (the CLI's flags take
// theirs from here).
const (
	DefaultBatchSize     = 32
	DefaultShuffleBuffer = 1000
	DefaultShuffleBytes  = 64 << 20
	DefaultOpenShards    = 8
	DefaultQueueBytes    = 2 << 20
	DefaultSlabs         = pinned.DefaultSlabs
)

// withDefaults returns cfg with its zero fields set.
func (cfg Config) withDefaults() Config {
	if cfg.defaulted {
		return cfg
	}
	cfg.defaulted = true
	cfg.pins = pinsOf(&cfg)
	for _, k := range Knobs {
		k.SetDefault(&cfg) // the table's defaults
	}
	// A worker for each shard open (lanes and read-ahead), from any source: a worker
	// that waits (for a socket, a page fault, its turn on a full queue) leaves its
	// core to another, and with one worker a core the cores idled in those waits
	// (2 cores, 8 lanes: 3-5% more samples a second with 8 workers than with 2, for
	// shards from local files, tokens, raw images and decoded images alike;
	// BENCHMARKS.md, "Workers for shards from a store").
	cfg.Workers = min(cmp.Or(cfg.Workers, cfg.OpenShards+cfg.ReadAhead), cfg.OpenShards+cfg.ReadAhead)
	cfg.MaxMemberSize = cmp.Or(cfg.MaxMemberSize, shard.DefaultMaxMemberSize)
	cfg.Batching = cmp.Or(cfg.Batching, plan.Random)
	if cfg.ErrorBudget == nil {
		b := DefaultErrorBudget
		cfg.ErrorBudget = &b
	}
	cfg.Sources = cmp.Or(cfg.Sources, source.Default)
	cfg.logKey = logs.Key(cfg.Logger, cfg.Logf)
	if cfg.Logger != nil || cfg.Logf == nil {
		cfg.Logf = logs.Printf(cmp.Or(cfg.Logger, slog.Default()))
	}
	return cfg
}

// options returns cfg (with defaults) as the engine takes it: the one place where
// a Config's settings are handed to the engine (pipeline.Options).
func (cfg *Config) options() pipeline.Options {
	spec, _ := pack.ParseSpec(cfg.Pack) // checked by Validate; SeqLen 0 without Pack
	o := pipeline.Options{
		Sources: cfg.Sources, URLs: slices.Clip(cfg.URLs), Shards: cfg.Shards, Index: cfg.Index, EpochTokens: cfg.EpochTokens, Pack: spec,
		Resume: cfg.Resume, Seed: cfg.Seed, Epoch: cfg.Epoch, Rank: cfg.Rank, World: cfg.World, BatchSize: cfg.BatchSize,
		DropLast: cfg.DropLast, NoShuffle: cfg.NoShuffle, SlabReads: cfg.SlabReads, ShuffleBuffer: cfg.ShuffleBuffer, ShuffleBytes: cfg.ShuffleBytes,
		OpenShards: cfg.OpenShards, ReadGap: cfg.ReadGap, Pins: cfg.pins, NoAutotune: cfg.NoAutotune, ImageDecoder: cfg.ImageDecoder,
		Knobs: tune.Knobs{Workers: cfg.Workers, ReadAhead: cfg.ReadAhead, QueueBytes: cfg.QueueBytes,
			FetchParallel: cfg.FetchParallel, FetchPartSize: cfg.FetchPartSize},
		Reader: shard.Options{MaxMemberSize: cfg.MaxMemberSize, MaxSampleSize: cfg.MaxSampleSize, MaxRatio: cfg.MaxRatio},
		Memory: cfg.Memory, Slabs: cfg.Slabs, SlabBytes: cfg.SlabBytes, MaxSlabBytes: cfg.MaxSlabBytes, NoLock: cfg.NoLock,
		Ring: cfg.Ring, BindSlabs: cfg.BindSlabs, Device: cfg.Device, CPUs: cfg.CPUs,
		Skip: cfg.OnError == Skip, ErrorBudget: *cfg.ErrorBudget, Logf: cfg.Logf, LogKey: cfg.logKey,
	}
	if cfg.Planned != nil && cfg.Pack != "" {
		o.Planned = func(p packed.Planned) { cfg.Planned(p.ReadPlan()) }
	}
	// A mix: the streams' URLs one after the other (a packed epoch's; an epoch of
	// samples is planned from cfg.Streams).
	for _, st := range cfg.Streams {
		o.Streams = append(o.Streams, plan.Stream{First: len(o.URLs), Count: len(st.URLs), Weight: st.Weight, Repeat: st.Repeat, Choose: st.Choose})
		o.URLs = append(o.URLs, st.URLs...)
	}
	return o
}

// once calls f unless a line of the kind what went to cfg's logger (with defaults)
// already in this process (logs.Once).
func (cfg Config) once(what string, f func()) { logs.Once(cfg.logKey, what, f) }

// Validate reports every setting of cfg that is negative or makes no sense, such as a
// rank outside the world or a slab ring larger than half of the machine's memory
// (Open calls it; a loader process checks its settings once with it before any
// trainer connects). It does not require URLs.
func (cfg Config) Validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	// Every scalar setting within its knob's limits (0 is its default; a value that
	// stands for 0 given, as ReadGap's -1, is in them), as the command line and a
	// trainer's hello check them.
	for _, k := range Knobs {
		if n, ok := k.IntValue(&cfg); ok && n != 0 && (k.ZeroIs == 0 || n != k.ZeroIs) {
			if err := k.Check(n); err != nil && n < 0 {
				bad("%s %d is negative (--%s: %v)", k.Field, n, k.Name, err)
			} else if err != nil {
				bad("%s %d (--%s): %v", k.Field, n, k.Name, err)
			}
		}
	}
	// The others that are counts and sizes.
	for name, n := range map[string]int64{"EpochSamples": cfg.EpochSamples, "EpochTokens": cfg.EpochTokens, "MaxMemberSize": cfg.MaxMemberSize} {
		if n < 0 {
			bad("%s %d is negative", name, n)
		}
	}
	if d := cfg.withDefaults(); d.Slabs > 0 {
		o := d.options()
		errs = append(errs, o.Budget(budget.Shape{Remote: true}).Check(o.MaxSlabBytes, o.Knobs)...)
	}
	if world := max(cfg.World, 1); cfg.Rank < 0 || cfg.Rank >= world {
		bad("Rank %d outside [0, World %d)", cfg.Rank, world)
	}
	if math.IsNaN(cfg.MaxRatio) || cfg.MaxRatio < 0 || (cfg.MaxRatio > 0 && cfg.MaxRatio < 1) {
		bad("MaxRatio %g: want 0 (the default) or at least 1", cfg.MaxRatio)
	}
	if cfg.OnError != Fail && cfg.OnError != Skip {
		bad("OnError %d is neither Fail nor Skip", int(cfg.OnError))
	}
	if b := cfg.ErrorBudget; b != nil {
		errs = append(errs, b.Check())
	}
	for _, c := range cfg.CPUs {
		if c < 0 {
			bad("CPUs lists CPU %d", c)
			break
		}
	}
	if len(cfg.Streams) > 0 && len(cfg.URLs)+len(cfg.Shards) > 0 {
		bad("Streams and URLs or Shards are both set")
	}
	if _, err := plan.ParseBatching(string(cfg.Batching)); err != nil {
		errs = append(errs, err)
	}
	for _, s := range cfg.Shards {
		if err := s.Check(-1, cfg.MaxRatio); err != nil {
			errs = append(errs, err)
			break
		}
	}
	if cfg.Pack != "" {
		if _, err := pack.ParseSpec(cfg.Pack); err != nil {
			bad("Pack: %v", err)
		}
	} else if cfg.EpochTokens != 0 {
		bad("EpochTokens %d without Pack", cfg.EpochTokens)
	}
	if len(cfg.Fields) > 0 {
		if err := decode.Validate(cfg.Fields...); err != nil {
			errs = append(errs, err)
		}
	}
	if _, err := cfg.ImageDecoder.Resolve(); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("shardload: bad config: %w", err)
	}
	return nil
}

// pinsOf returns the tuned settings cfg sets (non-zero): the tuner leaves them.
func pinsOf(cfg *Config) tune.Pins {
	var p tune.Pins
	p = p.With(tune.Workers, cfg.Workers != 0).With(tune.ReadAhead, cfg.ReadAhead != 0).With(tune.QueueBytes, cfg.QueueBytes != 0)
	return p.With(tune.FetchParallel, cfg.FetchParallel != 0).With(tune.FetchPartSize, cfg.FetchPartSize != 0)
}

// RingBytes returns the bytes of the slab ring with these settings: Slabs x SlabBytes,
// 0 when the slabs are sized from the batch (SlabBytes 0).
func (cfg Config) RingBytes() int64 {
	cfg = cfg.withDefaults()
	return int64(cfg.Slabs) * cfg.SlabBytes
}

// MemoryBudget returns the budget of the loader's buffers: Memory, or DefaultMemory.
// It holds the shards' index entries the loader keeps (about 150 bytes a shard, and
// the sample offsets of the shards it reads in part) and its plan (its spans: one
// or a few a shard it reads), the slabs, the decoded samples queued per open shard, in the shuffle
// windows and in the two batches being collated (the one being written and the last
// one, kept to pad an epoch shortened by skipped samples), with an eighth more for
// the buffers' size classes, and the parts of the remote reads in flight
// (FetchParallel x FetchPartSize per open shard, when reads use parts). Not in it:
// one sample being read per worker beyond its queue (at most MaxSampleSize; a
// sample larger than a queue holds that queue alone), the decompressors' windows
// (up to 8 MiB per zstd stream at common levels), an image field's scratch per
// worker (the decoded picture, width x height x 3 bytes, at a reduced scale for
// large JPEGs), and what the process holds once (MemoryOverhead). The shuffle
// windows hold ShuffleBytes of samples at their stored size (the order is planned
// from it): samples that inflate when decoded (zstd shards, npy stored compressed,
// images decoded to more bytes than their JPEG) hold more.
func (cfg Config) MemoryBudget() int64 {
	return cfg.withDefaults().Memory
}
