package shardload

// The loader's scalar settings as one table: each Knob names a field of Config with
// its flag name, default, limits and help. The command line's flags and environment
// variables, the settings a trainer's hello may give (serve), the metrics' setting
// labels and Config.Validate's limits are all made from it, so that adding a setting
// is one Knob and the code that uses its Config field.

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"strings"

	"github.com/shardload/shardload/mem"
	"github.com/shardload/shardload/shard"
	"github.com/shardload/shardload/source"
	"github.com/shardload/shardload/wire"
)

// A Knob is one of Config's scalar settings: its name (the command line's
// --NAME flag and SHARDLOAD_NAME environment variable; with dashes as underscores,
// its label in the metrics), the Config field it sets, its default, its limits and its
// help text.
type Knob struct {
	Name  string // "read-ahead"
	Field string // Config's field: "ReadAhead"
	Help  string
	// Default is the default the flag shows; the zero Config means it (withDefaults).
	// Auto, when set, says what the default is instead, when it is worked out.
	Default int64
	Auto    string
	Min     int64 // the least value given (counts and sizes)
	Max     int64 // the most, when not 0
	Bytes   bool  // a size: 512, 64KiB, 1GiB
	// Tuned: the tuner changes the setting while the loader runs, unless it is given.
	Tuned bool
	// Hello is the member of a trainer's hello (serve, protocol version 4) that sets
	// it, "" when a trainer may not (the server's flag is the default); with HelloNot
	// the member is the setting's negation (shuffle for --no-shuffle).
	Hello    string
	HelloNot bool
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
}

// Knobs are Config's scalar settings, in the order the command line lists them.
var Knobs = []Knob{
	{Name: "batch-size", Field: "BatchSize", Default: DefaultBatchSize, Min: 1, PerRank: true, Help: "samples per batch"},
	{Name: "drop-last", Field: "DropLast", PerRank: true, Help: "drop the last batch of an epoch when it is not full"},
	{Name: "seed", Field: "Seed", PerRank: true, Help: "seed of the shard order and the shuffle"},
	{Name: "epoch", Field: "Epoch", PerRank: true, Help: "first epoch (seeds the order with --seed)"},
	{Name: "rank", Field: "Rank", PerRank: true, Help: "this rank, in [0, --world)"},
	{Name: "world", Field: "World", Default: 1, Min: 1, PerRank: true, Help: "number of ranks; each gets the same number of batches"},
	{Name: "no-shuffle", Field: "NoShuffle", Hello: "shuffle", HelloNot: true, Help: "read shards and samples in order (--shuffle-bytes then goes to the open shards' queues, to decode the next shards ahead)"},
	{Name: "shuffle-buffer", Field: "ShuffleBuffer", Default: DefaultShuffleBuffer, Min: 1, Max: 1 << 24, Hello: "shuffle_buffer",
		Help: "samples the shuffle holds: the order permutes windows of half as many, from --open-shards regions of the shuffled shards, and the loader holds two"},
	{Name: "shuffle-bytes", Field: "ShuffleBytes", Default: DefaultShuffleBytes, Min: 1, Bytes: true, Hello: "shuffle_bytes",
		Help: "bytes the shuffle may hold: fewer samples per window when the dataset's mean sample size calls for it"},
	{Name: "open-shards", Field: "OpenShards", Default: DefaultOpenShards, Min: 1, Max: 1 << 12, Hello: "open_shards",
		Help: "lanes of the shuffled shard list read side by side and mixed in each window: shards read at once"},
	{Name: "workers", Field: "Workers", Auto: "the CPU count, at most --open-shards + --read-ahead, then tuned", Min: 1, Tuned: true,
		Help: "shards fetched, inflated and decoded at the same moment (given: the tuner leaves it)"},
	{Name: "read-gap", Field: "ReadGap", Auto: "the source's request cost: 64KiB for local files, 1MiB for object stores and HTTP", Bytes: true, Hello: "read_gap", ZeroIs: -1,
		Help: "a rank reads the samples it wants of a window it shares with another rank (or of a resumed window) with one request per run of them, and two runs of a shard with one request when the samples between them take at most this much (0: one request per run)"},
	{Name: "queue-bytes", Field: "QueueBytes", Default: DefaultQueueBytes, Min: 1, Bytes: true, Tuned: true,
		Help: "decoded bytes waiting per open shard (given: the tuner leaves it)"},
	{Name: "read-ahead", Field: "ReadAhead", Auto: "0, then tuned", Tuned: true,
		Help: "shards opened beyond --open-shards, ahead of the order, to hide a store's latency per request (does not change the order; given: the tuner leaves it)"},
	{Name: "memory", Field: "Memory", Default: DefaultMemory, Min: 1, Bytes: true,
		Help: fmt.Sprintf("budget of the loader's buffers: slabs, decoded samples (queues, shuffle windows, batches) and remote reads' parts, and of the shards' index entries and the plan; settings left to their defaults are lowered to fit, the tuner never exceeds it (the process holds about %s more)", mem.FormatSize(MemoryOverhead))},
	{Name: "autotune", Field: "NoAutotune", Default: 1, Invert: true,
		Help: "tune --workers, --read-ahead, --queue-bytes, --fetch-parallel and --fetch-part-size while running, within --memory, from the rate delivered (those given are left alone; --autotune=false keeps the defaults)"},
	{Name: "slabs", Field: "Slabs", Default: DefaultSlabs, Min: 1, Max: wire.MaxFDs, Hello: "slabs", Help: "pinned batch slabs in the ring (batches ready or in use at once)"},
	{Name: "slab-size", Field: "SlabBytes", Auto: "sized from the batch", Min: 1, Bytes: true, Hello: "slab_bytes",
		Help: "bytes per slab (by default: exact for images, labels and npy fields with a shape, from the dataset's mean sample size for the others); a batch that does not fit grows its slab within --max-slab-size and --memory"},
	{Name: "max-slab-size", Field: "MaxSlabBytes", Default: DefaultMaxSlabBytes, Min: 1, Bytes: true,
		Help: "largest a slab may be, given or grown to hold a batch; a batch larger fails with the size it needs"},
	{Name: "count-first", Field: "CountFirst", Hello: "count_first",
		Help: "without an index, read every shard to count its samples before the first batch (exact epochs) instead of estimating the counts from the shards' sizes"},
	{Name: "allow-estimate", Field: "AllowEstimate", Hello: "allow_estimate",
		Help: "let a job of more than one rank without an index plan from counts estimated from the shards' sizes: approximate epochs (samples left out or repeated, reported at each epoch's end) instead of an error before the first batch"},
	{Name: "max-sample-size", Field: "MaxSampleSize", Default: shard.DefaultMaxSampleSize, Min: 1, Bytes: true,
		Help: "largest sample (its members together) held in memory; a larger one is an error of that sample"},
	// The remote reads' parts: flags of every command that reads (the sources'
	// settings), which a loader takes as its knobs when they are given.
	{Name: "fetch-parallel", Field: "FetchParallel", Default: source.DefaultParallel, Min: 1, Tuned: true, Source: true,
		Help: "ranged parts in flight per remote shard; each holds --fetch-part-size of memory"},
	{Name: "fetch-part-size", Field: "FetchPartSize", Default: source.DefaultPartSize, Min: 1, Bytes: true, Tuned: true, Source: true,
		Help: "remote objects (s3, gs, http) are read as ranged parts of this size"},
}

// intValue returns the knob's value in cfg when its field is an integer.
func (k Knob) intValue(cfg *Config) (int64, bool) {
	f := k.field(cfg)
	if !f.CanInt() {
		return 0, false
	}
	return f.Int(), true
}

// Label returns the knob's name with underscores: its label in the metrics.
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
		panic("knob: " + k.Name + ": Config has no field " + k.Field)
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
	if err = k.check(n); err == nil {
		err = k.setInt(f, n)
	}
	if err != nil {
		return fmt.Errorf("--%s %d: %v", k.Name, n, err)
	}
	return nil
}

// check refuses a value outside the knob's limits, saying what it wants.
func (k Knob) check(n int64) error {
	switch {
	case k.Max > 0 && (n < k.Min || n > k.Max):
		return fmt.Errorf("want %d to %d", k.Min, k.Max)
	case n < k.Min:
		return fmt.Errorf("want at least %d", k.Min)
	}
	return nil
}

// setInt sets f to n, a value given (its ZeroIs stands for 0).
func (k Knob) setInt(f reflect.Value, n int64) error {
	if n == 0 && k.ZeroIs != 0 {
		n = k.ZeroIs
	}
	if f.OverflowInt(n) {
		return errors.New("too large")
	}
	f.SetInt(n)
	return nil
}

// SetHello sets the knob in cfg from its member in a trainer's hello: a number, or
// true or false.
func (k Knob) SetHello(cfg *Config, raw json.RawMessage) error {
	f := k.field(cfg)
	switch f.Kind() {
	case reflect.Bool:
		var b bool
		if err := json.Unmarshal(raw, &b); err != nil {
			return fmt.Errorf("%s: want true or false, not %.40s", k.Hello, raw)
		}
		f.SetBool(b != k.Invert != k.HelloNot)
		return nil
	case reflect.Uint64:
		var n uint64
		if err := json.Unmarshal(raw, &n); err != nil {
			return fmt.Errorf("%s: want a number from 0 to 2^64-1, not %.40s", k.Hello, raw)
		}
		f.SetUint(n)
		return nil
	}
	var n int64
	if err := json.Unmarshal(raw, &n); err != nil {
		return fmt.Errorf("%s: want a whole number, not %.40s", k.Hello, raw)
	}
	err := k.check(n)
	if err == nil {
		err = k.setInt(f, n)
	}
	if err != nil {
		return fmt.Errorf("%s %d: %v", k.Hello, n, err)
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

// Setting returns a tuned knob's value in s (Tuned knobs' fields are Settings' too).
func (k Knob) Setting(s Settings) int64 {
	f := reflect.ValueOf(s).FieldByName(k.Field)
	if !k.Tuned || !f.IsValid() {
		panic("knob: " + k.Name + ": not in Settings")
	}
	return f.Int()
}
