package shardload

// The loader's scalar settings as one table: each Knob names a field of Config with
// its flag name, default, limits and help. The command line's flags and environment
// variables, the settings a trainer's hello may give (serve), the metrics' setting
// labels and Config.Validate's limits are all made from it, so that adding a setting
// is one Knob and the code that uses its Config field.

import (
	"fmt"

	"github.com/shardload/shardload/knob"
	"github.com/shardload/shardload/mem"
	"github.com/shardload/shardload/plan"
	"github.com/shardload/shardload/shard"
	"github.com/shardload/shardload/source"
	"github.com/shardload/shardload/wire"
)

// A Knob is one of Config's scalar settings: its name (the command line's
// --NAME flag and SHARDLOAD_NAME environment variable; with dashes as underscores,
// its label in the metrics), the Config field it sets, its default, its limits and its
// help text (package knob sets, checks and prints it).
type Knob = knob.Knob

// Knobs are Config's scalar settings, in the order the command line lists them.
var Knobs = []Knob{
	{Name: "batch-size", Field: "BatchSize", Default: DefaultBatchSize, Min: 1, PerRank: true, Help: "samples per batch"},
	{Name: "drop-last", Field: "DropLast", PerRank: true, Help: "drop the last batch of an epoch when it is not full"},
	{Name: "seed", Field: "Seed", PerRank: true, Help: "seed of the shard order and the shuffle"},
	{Name: "epoch", Field: "Epoch", PerRank: true, Help: "first epoch (seeds the order with --seed)"},
	{Name: "rank", Field: "Rank", PerRank: true, Help: "this rank, in [0, --world)"},
	{Name: "world", Field: "World", Default: 1, Min: 1, PerRank: true, Help: "number of ranks; each gets the same number of batches"},
	{Name: "ranks-per-node", Field: "RanksPerNode", Auto: "$LOCAL_WORLD_SIZE (torchrun's), else 0", Max: plan.MaxWorld, PerRank: true, Hello: "ranks_per_node",
		Help: "ranks on each node (rank r on node r/N): a shuffled epoch keeps each node on the same shards every epoch, reshuffled within the node, so that the nodes' caches add up (0: one order for any layout)"},
	{Name: "node-affinity", Field: "NoNodeAffinity", Default: 1, Invert: true, Hello: "node_affinity",
		Help: "with --ranks-per-node, keep each node on its shards from epoch to epoch (--node-affinity=false: every epoch reshuffles the shards across all nodes)"},
	{Name: "no-shuffle", Field: "NoShuffle", Hello: "shuffle", HelloNot: true, Help: "read shards and samples in order (--shuffle-bytes then goes to the open shards' queues, to decode the next shards ahead)"},
	{Name: "shuffle-buffer", Field: "ShuffleBuffer", Default: DefaultShuffleBuffer, Min: 1, Max: 1 << 24, Hello: "shuffle_buffer",
		Help: "samples the shuffle holds: the order permutes windows of half as many, from --open-shards regions of the shuffled shards, and the loader holds two"},
	{Name: "shuffle-bytes", Field: "ShuffleBytes", Default: DefaultShuffleBytes, Min: 1, Bytes: true, Hello: "shuffle_bytes",
		Help: "bytes the shuffle may hold: fewer samples per window when the dataset's mean sample size calls for it"},
	{Name: "open-shards", Field: "OpenShards", Default: DefaultOpenShards, Min: 1, Max: 1 << 12, Hello: "open_shards",
		Help: "lanes of the shuffled shard list read side by side and mixed in each window: shards read at once"},
	{Name: "workers", Field: "Workers", Auto: "one per open shard (--open-shards + --read-ahead), from any source; then tuned", Min: 1, Tuned: true,
		Help: "shards fetched, inflated and decoded at the same moment (given: the tuner leaves it)"},
	{Name: "read-gap", Field: "ReadGap", Auto: "the source's request cost: 64KiB for local files, 1MiB for object stores and HTTP", Bytes: true, Hello: "read_gap", ZeroIs: -1,
		Help: "a rank reads the samples it wants of a window it shares with another rank (or of a resumed window) with one request per run of them, and two runs of a shard with one request when the samples between them take at most this much (0: one request per run)"},
	{Name: "queue-bytes", Field: "QueueBytes", Default: DefaultQueueBytes, Min: 1, Bytes: true, Tuned: true,
		Help: "decoded bytes waiting per open shard (given: the tuner leaves it)"},
	{Name: "read-ahead", Field: "ReadAhead", Auto: "0, then tuned", Tuned: true,
		Help: "shards opened beyond --open-shards, ahead of the order, to hide a store's latency per request (does not change the order; given: the tuner leaves it)"},
	{Name: "memory", Field: "Memory", Default: DefaultMemory, Min: 1, Bytes: true,
		Help: fmt.Sprintf("budget of the loader's buffers: slabs, decoded samples (queues, shuffle windows, batches), remote reads' parts and decompressors, and of the shards' index entries and the plan; settings left to their defaults are lowered to fit, the tuner never exceeds it (the process holds about %s more)", mem.FormatSize(MemoryOverhead))},
	{Name: "autotune", Field: "NoAutotune", Default: 1, Invert: true,
		Help: "tune --workers, --read-ahead, --queue-bytes, --fetch-parallel and --fetch-part-size while running, within --memory, from the rate delivered (those given are left alone; --autotune=false keeps the defaults)"},
	{Name: "slabs", Field: "Slabs", Default: DefaultSlabs, Min: 1, Max: wire.MaxFDs, Hello: "slabs", Help: "pinned batch slabs in the ring (batches ready or in use at once)"},
	{Name: "slab-size", Field: "SlabBytes", Auto: "sized from the batch", Min: 1, Bytes: true, Hello: "slab_bytes",
		Help: "bytes per slab (by default: exact for images, labels and npy fields with a shape, from the dataset's mean sample size for the others); a batch that does not fit grows its slab within --max-slab-size and --memory"},
	{Name: "max-slab-size", Field: "MaxSlabBytes", Default: DefaultMaxSlabBytes, Min: 1, Bytes: true,
		Help: "largest a slab may be, given or grown to hold a batch; a batch larger fails with the size it needs"},
	{Name: "slab-reads", Field: "SlabReads",
		Help: "read the members of raw, text and json fields straight into their rows of the batch's slab where the index gives their sizes and a slab is free before they are read, instead of into sample memory and then copied at collate (the batches are the same bytes; on the machines measured it saved no CPU, see BENCHMARKS.md)"},
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

// KnobNamed returns the knob of a name or label, and whether there is one.
func KnobNamed(name string) (Knob, bool) {
	for _, k := range Knobs {
		if k.Name == name || k.Label() == name {
			return k, true
		}
	}
	return Knob{}, false
}
