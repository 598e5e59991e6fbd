package shardload

import (
	"errors"
	"fmt"
	"log"
	"runtime"

	"github.com/shardload/shardload/decode"
	"github.com/shardload/shardload/device"
	"github.com/shardload/shardload/pinned"
	"github.com/shardload/shardload/shard"
	"github.com/shardload/shardload/source"
)

// Policy says what happens when a sample or shard is bad.
type Policy int

const (
	// Fail stops the loader at the first bad sample or shard: Next returns the error.
	Fail Policy = iota
	// Skip leaves bad samples (and the rest of a bad shard) out, logs each once with
	// shard URL, key and cause, counts them, and fails only when more than
	// Config.ErrorBudget of the epoch's samples or shards were skipped.
	Skip
)

func (p Policy) String() string {
	if p == Skip {
		return "skip"
	}
	return "fail"
}

// ParsePolicy parses "fail" or "skip".
func ParsePolicy(s string) (Policy, error) {
	switch s {
	case "fail":
		return Fail, nil
	case "skip":
		return Skip, nil
	}
	return Fail, fmt.Errorf("shardload: error policy %q: want fail or skip", s)
}

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
	// Index is a file or URL of JSON lines {"url": ..., "samples": N}, as written by
	// "shardload ls --summary --json". Without it (and without Shards), Open counts
	// the samples of every shard first, which reads them once.
	Index string

	// Fields to decode and collate. Default: every extension of the first sample of
	// the first shard, each with decode.ParseField's default for it.
	Fields []decode.Field
	// BatchSize is the number of samples per batch. Default 32.
	BatchSize int
	// DropLast drops the last batch of an epoch when it is not full.
	DropLast bool

	// Seed and Epoch seed the shard order and the shuffle: the order of samples a
	// rank sees is a pure function of (shards, Seed, Epoch, Rank, World, the shuffle
	// settings).
	Seed  uint64
	Epoch int
	// Rank in [0, World) and World, the number of ranks of a distributed job. Every
	// rank gets the same number of batches (see shard.NewPlan). Default 0 of 1.
	Rank, World int

	// NoShuffle reads shards and samples in order. The shuffle buffer's bytes then go
	// to the open shards' queues (ShuffleBytes/OpenShards more each), so that the
	// shards after the one being consumed are read and decoded ahead.
	NoShuffle bool
	// ShuffleBuffer is the number of samples the shuffle buffer holds. Default 1000.
	ShuffleBuffer int
	// ShuffleBytes caps the bytes the shuffle buffer holds. Default 64 MiB: a larger
	// window shuffles better but costs cache misses on every sample (see BENCHMARKS.md).
	ShuffleBytes int64
	// OpenShards is the number of shards read at once and interleaved. Default 4.
	OpenShards int
	// Workers is the number of shards being fetched, inflated, split and decoded at
	// the same moment. Default GOMAXPROCS, at most OpenShards.
	Workers int
	// QueueBytes caps the decoded samples waiting per open shard. Default 4 MiB.
	QueueBytes int64
	// MaxMemberSize caps one tar member in memory. Default 256 MiB.
	MaxMemberSize int64
	// MaxRatio caps the decompression ratio of a compressed shard. Default 1000.
	MaxRatio float64

	// Slabs is the number of batch slabs in the ring: batches ready or in use at once.
	// Default 4.
	Slabs int
	// SlabBytes is the size of one slab. Default 16 MiB (32 samples of up to 500 KB);
	// a batch that does not fit is an error that says how much it needs.
	SlabBytes int64
	// NoLock does not page-lock the slabs.
	NoLock bool
	// Ring, when set, is the slab ring batches are collated into, instead of one the
	// loader creates from Slabs, SlabBytes and NoLock. The loader does not close it,
	// so one ring can serve several epochs (a server shares it with a trainer once).
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
	// ErrorBudget is the fraction of the epoch's samples (or shards) that Skip may
	// leave out before the loader fails. Default 0.01 (1%).
	ErrorBudget float64

	// Sources resolves URLs. Default source.Default.
	Sources *source.Registry
	// Logf receives one line per skipped sample or shard and other warnings. Default
	// log.Printf.
	Logf func(format string, args ...any)
}

// withDefaults returns cfg with its zero fields set.
func (cfg Config) withDefaults() Config {
	if cfg.BatchSize == 0 {
		cfg.BatchSize = 32
	}
	if cfg.World == 0 {
		cfg.World = 1
	}
	if cfg.ShuffleBuffer == 0 {
		cfg.ShuffleBuffer = 1000
	}
	if cfg.ShuffleBytes == 0 {
		cfg.ShuffleBytes = 64 << 20
	}
	if cfg.OpenShards == 0 {
		cfg.OpenShards = 4
	}
	if cfg.Workers == 0 {
		cfg.Workers = runtime.GOMAXPROCS(0)
	}
	cfg.Workers = min(cfg.Workers, cfg.OpenShards)
	if cfg.QueueBytes == 0 {
		cfg.QueueBytes = 4 << 20
	}
	if cfg.MaxMemberSize == 0 {
		cfg.MaxMemberSize = shard.DefaultMaxMemberSize
	}
	if cfg.Slabs == 0 {
		cfg.Slabs = 4
	}
	if cfg.SlabBytes == 0 {
		cfg.SlabBytes = 16 << 20
	}
	if cfg.ErrorBudget == 0 {
		cfg.ErrorBudget = 0.01
	}
	if cfg.Sources == nil {
		cfg.Sources = source.Default
	}
	if cfg.Logf == nil {
		cfg.Logf = log.Printf
	}
	return cfg
}

func (cfg *Config) validate() error {
	var errs []error
	if len(cfg.URLs) == 0 && len(cfg.Shards) == 0 {
		errs = append(errs, errors.New("no shard URLs"))
	}
	if cfg.BatchSize < 0 || cfg.World < 0 || cfg.ShuffleBuffer < 0 || cfg.OpenShards < 0 || cfg.Workers < 0 || cfg.Slabs < 0 {
		errs = append(errs, errors.New("negative size or count"))
	}
	if cfg.ErrorBudget < 0 || cfg.ErrorBudget > 1 {
		errs = append(errs, fmt.Errorf("error budget %g outside [0, 1]", cfg.ErrorBudget))
	}
	if len(cfg.Fields) > 0 {
		if err := decode.Validate(cfg.Fields...); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("shardload: bad config: %w", err)
	}
	return nil
}

// MemoryBudget returns the bytes the loader's buffers hold at most with these
// settings: decoded samples queued per open shard, the shuffle buffer and the slabs.
// On top come two batches of decoded samples (the one being collated and the last
// one, kept to pad an epoch shortened by skipped samples), one sample being read per
// worker, the decompressors' windows (up to 8 MiB per zstd stream at common levels),
// the sources' buffers and Go's runtime.
func (cfg Config) MemoryBudget() int64 {
	cfg = cfg.withDefaults()
	return int64(cfg.OpenShards)*cfg.QueueBytes + cfg.ShuffleBytes + int64(cfg.Slabs)*cfg.SlabBytes
}
