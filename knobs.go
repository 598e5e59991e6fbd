package shardload

import (
	"encoding/json"
	"fmt"
	"reflect"
	"strconv"
	"strings"

	"github.com/shardload/shardload/internal/mem"
	"github.com/shardload/shardload/internal/tune"
	"github.com/shardload/shardload/plan"
	"github.com/shardload/shardload/shard"
	"github.com/shardload/shardload/source"
)

// A Knob is one of Config's scalar settings, defined once: its name (the command
// line's --NAME flag, the SHARDLOAD_NAME environment variable, and, with dashes as
// underscores, the serve hello's settings member and the metrics' setting label), the
// Config field it sets, its default, its least value and its help text. The command
// line's flags, the settings a trainer's hello may give, the tuner's pins and the
// metrics' setting labels are all made from Knobs; adding a setting is one Knob and
// the code that uses its field.
type Knob struct {
	Name  string // "read-ahead"
	Field string // Config's field: "ReadAhead"
	Help  string
	// Default is the default the flag shows; the zero Config means it (withDefaults).
	// Auto, when set, says what the default is instead, when it is worked out.
	Default int64
	Auto    string
	Min     int64 // the least value given (counts and sizes)
	Bytes   bool  // a size: 512, 64KiB, 1GiB
	// Tuned: the tuner changes the setting while the loader runs, unless it is given.
	Tuned bool
	// Trainer: a trainer's hello may set it (serve; the server's flag is the default).
	Trainer bool
	// PerRank: each trainer's hello gives it (rank, world, seed, batching); a flag of
	// bench only.
	PerRank bool
	// Invert: a flag of the negated field (--autotune sets NoAutotune).
	Invert bool
	// ZeroIs: a value of 0 given is stored as this (--read-gap 0: none, -1).
	ZeroIs int64
	// Source: a flag of every command that reads shards (the sources' settings, which
	// a loader takes as its knobs when they are given), not of the loader's alone.
	Source bool

	tune tune.Knob // the tuner's name for it, when Tuned
}

// Knobs are Config's scalar settings (see Knob), in the order the command line lists
// them.
var Knobs = []Knob{
	{Name: "batch-size", Field: "BatchSize", Default: DefaultBatchSize, Min: 1, PerRank: true, Help: "samples per batch"},
	{Name: "drop-last", Field: "DropLast", PerRank: true, Help: "drop the last batch of an epoch when it is not full"},
	{Name: "seed", Field: "Seed", PerRank: true, Help: "seed of the shard order and the shuffle"},
	{Name: "epoch", Field: "Epoch", PerRank: true, Help: "first epoch (seeds the order with --seed)"},
	{Name: "rank", Field: "Rank", PerRank: true, Help: "this rank, in [0, --world)"},
	{Name: "world", Field: "World", Default: 1, Min: 1, PerRank: true, Help: "number of ranks; each gets the same number of batches"},
	{Name: "no-shuffle", Field: "NoShuffle", Trainer: true, Help: "read shards and samples in order (--shuffle-bytes then goes to the open shards' queues, to decode the next shards ahead)"},
	{Name: "shuffle-buffer", Field: "ShuffleBuffer", Default: DefaultShuffleBuffer, Min: 1, Trainer: true,
		Help: "samples the shuffle holds: the order permutes windows of half as many, from --open-shards regions of the shuffled shards, and the loader holds two"},
	{Name: "shuffle-bytes", Field: "ShuffleBytes", Default: DefaultShuffleBytes, Min: 1, Bytes: true, Trainer: true,
		Help: "bytes the shuffle may hold: fewer samples per window when the dataset's mean sample size calls for it"},
	{Name: "open-shards", Field: "OpenShards", Default: DefaultOpenShards, Min: 1, Trainer: true,
		Help: "lanes of the shuffled shard list read side by side and mixed in each window: shards read at once"},
	{Name: "workers", Field: "Workers", Auto: "the CPU count, at most --open-shards + --read-ahead, then tuned", Min: 1, Tuned: true, tune: tune.Workers,
		Help: "shards fetched, inflated and decoded at the same moment (given: the tuner leaves it)"},
	{Name: "read-gap", Field: "ReadGap", Default: plan.DefaultGapBytes, Bytes: true, Trainer: true, ZeroIs: -1,
		Help: "a rank reads the samples it wants of a window it shares with another rank (or of a resumed window) with one request per run of them, and two runs of a shard with one request when the samples between them take at most this much (0: one request per run)"},
	{Name: "queue-bytes", Field: "QueueBytes", Default: DefaultQueueBytes, Min: 1, Bytes: true, Tuned: true, tune: tune.QueueBytes,
		Help: "decoded bytes waiting per open shard (given: the tuner leaves it)"},
	{Name: "read-ahead", Field: "ReadAhead", Auto: "0, then tuned", Tuned: true, tune: tune.ReadAhead,
		Help: "shards opened beyond --open-shards, ahead of the order, to hide a store's latency per request (does not change the order; given: the tuner leaves it)"},
	{Name: "memory", Field: "Memory", Default: DefaultMemory, Min: 1, Bytes: true,
		Help: fmt.Sprintf("budget of the loader's buffers: slabs, decoded samples (queues, shuffle windows, batches) and remote reads' parts; settings left to their defaults are lowered to fit, the tuner never exceeds it (the process holds about %s more)", mem.FormatSize(MemoryOverhead))},
	{Name: "autotune", Field: "NoAutotune", Default: 1, Invert: true,
		Help: "tune --workers, --read-ahead, --queue-bytes, --fetch-parallel and --fetch-part-size while running, within --memory, from the rate delivered (those given are left alone; --autotune=false keeps the defaults)"},
	{Name: "slabs", Field: "Slabs", Default: DefaultSlabs, Min: 1, Trainer: true, Help: "pinned batch slabs in the ring (batches ready or in use at once)"},
	{Name: "slab-size", Field: "SlabBytes", Auto: "sized from the batch", Min: 1, Bytes: true, Trainer: true,
		Help: "bytes per slab (by default: exact for images, labels and npy fields with a shape, from the dataset's mean sample size for the others); a batch that does not fit grows its slab within --max-slab-size and --memory"},
	{Name: "max-slab-size", Field: "MaxSlabBytes", Default: DefaultMaxSlabBytes, Min: 1, Bytes: true,
		Help: "largest a slab may be, given or grown to hold a batch; a batch larger fails with the size it needs"},
	{Name: "count-first", Field: "CountFirst", Trainer: true,
		Help: "without an index, read every shard to count its samples before the first batch (exact epochs) instead of estimating the counts from the shards' sizes"},
	{Name: "allow-estimate", Field: "AllowEstimate", Trainer: true,
		Help: "let a job of more than one rank without an index plan from counts estimated from the shards' sizes: approximate epochs (samples left out or repeated, reported at each epoch's end) instead of an error before the first batch"},
	{Name: "max-sample-size", Field: "MaxSampleSize", Default: shard.DefaultMaxSampleSize, Min: 1, Bytes: true,
		Help: "largest sample (its members together) held in memory; a larger one is an error of that sample"},
	// The remote reads' parts: flags of every command that reads (the sources'
	// settings), which a loader takes as its knobs when they are given.
	{Name: "fetch-parallel", Field: "FetchParallel", Default: source.DefaultParallel, Min: 1, Tuned: true, Source: true, tune: tune.FetchParallel,
		Help: "ranged parts in flight per remote shard; each holds --fetch-part-size of memory"},
	{Name: "fetch-part-size", Field: "FetchPartSize", Default: source.DefaultPartSize, Min: 1, Bytes: true, Tuned: true, Source: true, tune: tune.FetchPartSize,
		Help: "remote objects (s3, gs, http) are read as ranged parts of this size"},
}

// Label returns the knob's name with underscores: its member in the serve hello's
// settings, and its label in the metrics.
func (k Knob) Label() string { return strings.ReplaceAll(k.Name, "-", "_") }

// KnobNamed returns the knob of a name or label, and whether there is one.
func KnobNamed(name string) (Knob, bool) {
	for _, k := range Knobs {
		if k.Name == name || k.Label() == name {
			return k, true
		}
	}
	return Knob{}, false
}

// field returns cfg's field of the knob.
func (k Knob) field(cfg *Config) reflect.Value {
	f := reflect.ValueOf(cfg).Elem().FieldByName(k.Field)
	if !f.IsValid() {
		panic("shardload: knob " + k.Name + ": Config has no field " + k.Field)
	}
	return f
}

// Set sets the knob in cfg from its command-line form ("8", "64MiB", "true"), checking
// it against the knob's least value.
func (k Knob) Set(cfg *Config, s string) error {
	f := k.field(cfg)
	switch f.Kind() {
	case reflect.Bool:
		b, err := strconv.ParseBool(s)
		if err != nil {
			return fmt.Errorf("--%s %q: want true or false", k.Name, s)
		}
		f.SetBool(b != k.Invert)
		return nil
	case reflect.Uint64:
		n, err := strconv.ParseUint(s, 0, 64)
		if err != nil {
			return fmt.Errorf("--%s %q: want a number from 0 to 2^64-1", k.Name, s)
		}
		f.SetUint(n)
		return nil
	}
	var n int64
	var err error
	if k.Bytes {
		n, err = mem.ParseSize(s)
	} else {
		n, err = strconv.ParseInt(s, 10, 64)
	}
	if err != nil {
		return fmt.Errorf("--%s %q: want a %s", k.Name, s, map[bool]string{true: "size (512, 64KiB, 1GiB)", false: "whole number"}[k.Bytes])
	}
	return k.setInt(f, n)
}

func (k Knob) setInt(f reflect.Value, n int64) error {
	if n < k.Min {
		return fmt.Errorf("--%s %d: want at least %d", k.Name, n, k.Min)
	}
	if n == 0 && k.ZeroIs != 0 {
		n = k.ZeroIs
	}
	if f.OverflowInt(n) {
		return fmt.Errorf("--%s %d: too large", k.Name, n)
	}
	f.SetInt(n)
	return nil
}

// SetJSON sets the knob in cfg from a JSON value: a number, or true or false.
func (k Knob) SetJSON(cfg *Config, raw json.RawMessage) error {
	f := k.field(cfg)
	switch f.Kind() {
	case reflect.Bool:
		var b bool
		if err := json.Unmarshal(raw, &b); err != nil {
			return fmt.Errorf("%s: want true or false, not %.40s", k.Label(), raw)
		}
		f.SetBool(b != k.Invert)
		return nil
	case reflect.Uint64:
		var n uint64
		if err := json.Unmarshal(raw, &n); err != nil {
			return fmt.Errorf("%s: want a number from 0 to 2^64-1, not %.40s", k.Label(), raw)
		}
		f.SetUint(n)
		return nil
	}
	var n int64
	if err := json.Unmarshal(raw, &n); err != nil {
		return fmt.Errorf("%s: want a whole number, not %.40s", k.Label(), raw)
	}
	if err := k.setInt(f, n); err != nil {
		return fmt.Errorf("%s: %w", k.Label(), err)
	}
	return nil
}

// Value returns the knob's value in cfg in its command-line form.
func (k Knob) Value(cfg *Config) string {
	f := k.field(cfg)
	switch f.Kind() {
	case reflect.Bool:
		return strconv.FormatBool(f.Bool() != k.Invert)
	case reflect.Uint64:
		return strconv.FormatUint(f.Uint(), 10)
	}
	n := f.Int()
	if n == k.ZeroIs && n != 0 {
		n = 0
	}
	if k.Bytes && n > 0 {
		return mem.FormatSize(n)
	}
	return strconv.FormatInt(n, 10)
}

// DefaultText returns the knob's default as the command line's help shows it.
func (k Knob) DefaultText() string {
	switch {
	case k.Auto != "":
		return k.Auto
	case k.Bytes:
		return mem.FormatSize(k.Default)
	}
	if reflect.ValueOf(Config{}).FieldByName(k.Field).Kind() == reflect.Bool {
		return strconv.FormatBool(k.Default != 0)
	}
	return strconv.FormatInt(k.Default, 10)
}

// pinsOf returns the tuned knobs cfg sets (non-zero fields): the tuner leaves them.
func pinsOf(cfg *Config) tune.Pins {
	var p tune.Pins
	for _, k := range Knobs {
		if k.Tuned {
			p = p.With(k.tune, !k.field(cfg).IsZero())
		}
	}
	return p
}
