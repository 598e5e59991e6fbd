package shardload

import (
	"fmt"
	"time"

	"github.com/shardload/shardload/internal/mem"
	"github.com/shardload/shardload/internal/tune"
)

// DefaultMemory is the memory budget of a Config whose Memory is 0: 1 GiB for the
// loader's buffers (see Config.Memory).
const DefaultMemory = 1 << 30

// MemoryOverhead is what a loader process holds beyond its loaders' budgets, at the
// default fetch settings: Go's runtime and code, the index's reading buffers (its
// entries of the shards and the plan are in each loader's budget), the sources'
// clients and connection buffers, and the part buffers a remote backend keeps between reads
// (source.Fetcher.MaxFreeBytes, 64 MiB). Peak RSS stays within the budgets plus
// this (BENCHMARKS.md).
const MemoryOverhead = 160 << 20

// ErrMemory means a Config's settings need more memory than its budget
// (Config.Memory).
var ErrMemory = tune.ErrMemory

// tuneInterval is how often the tuner looks at the loader (a variable for tests).
var tuneInterval = 500 * time.Millisecond

// Settings are the settings of a loader that its tuner may change while it runs:
// none changes what the loader yields.
type Settings struct {
	Workers       int   `json:"workers"`
	ReadAhead     int   `json:"read_ahead"`
	QueueBytes    int64 `json:"queue_bytes"`
	FetchParallel int   `json:"fetch_parallel"`
	FetchPartSize int64 `json:"fetch_part_size"`
	// Changes counts the changes the tuner kept; Settled says its last round of
	// trials kept none.
	Changes int  `json:"changes"`
	Settled bool `json:"settled"`
}

func (s Settings) String() string {
	return fmt.Sprintf("workers %d, read-ahead %d, queue-bytes %s, fetch-parallel %d, fetch-part-size %s",
		s.Workers, s.ReadAhead, mem.FormatSize(s.QueueBytes), s.FetchParallel, mem.FormatSize(s.FetchPartSize))
}

// Tuner is a loader's autotuner, kept across loaders: give the loaders of a job's
// epochs the same Tuner (Config.Tuner) and each starts where the last one's settings
// ended. A Tuner used by one loader at a time is what it is for; its methods are
// safe for concurrent use.
type Tuner struct{ s tune.Shared }

// NewTuner returns a tuner with no settings yet: the first loader that uses it
// starts from its Config's.
func NewTuner() *Tuner { return &Tuner{} }

// Settings returns the settings the tuner kept last (while a change is on trial,
// those before it); zero before a loader used it.
func (t *Tuner) Settings() Settings {
	k, changes, settled, ok := t.s.Kept()
	if !ok {
		return Settings{}
	}
	return Settings{Workers: k.Workers, ReadAhead: k.ReadAhead, QueueBytes: k.QueueBytes, FetchParallel: k.FetchParallel,
		FetchPartSize: k.FetchPartSize, Changes: changes, Settled: settled}
}

// knobs returns cfg's settings of the tuner's knobs.
func (cfg Config) knobs() tune.Knobs {
	return tune.Knobs{Workers: cfg.Workers, ReadAhead: cfg.ReadAhead, QueueBytes: cfg.QueueBytes,
		FetchParallel: cfg.FetchParallel, FetchPartSize: cfg.FetchPartSize}
}

// budget returns the memory model of cfg (with defaults) over shards of shape d.
func (cfg Config) budget(d tune.Shape) tune.Budget {
	return tune.Budget{Memory: cfg.Memory, Slabs: cfg.Slabs, SlabBytes: cfg.SlabBytes, ShuffleBytes: cfg.ShuffleBytes,
		OpenShards: cfg.OpenShards, Shape: d, Pins: cfg.pins}
}

// autotune runs the loader's tuner until l.done is closed, then closes l.tuned.
func (l *Loader) autotune(remote bool) {
	defer close(l.tuned)
	c := &l.p.C
	l.tuner.s.Run(tune.Loop{
		Interval: tuneInterval,
		// The order yields a window's samples once most of them are in: the rate is
		// judged over two windows at least.
		MinSamples: int64(2 * max(l.order.Window, l.cfg.BatchSize)),
		Read: func() tune.Counts {
			return tune.Counts{Samples: c.Samples.Load(), Batches: c.Batches.Load(), Wait: c.Wait.Load(), Fetch: c.Fetch.Load()}
		},
		Apply: func(k tune.Knobs) { l.p.SetKnobs(fetchKnobs(k, remote)) },
		Kept: func(k0 tune.Knobs, rate float64) {
			// Once per logger: a loader process serves many ranks and epochs, whose
			// settings the metrics (shardload_session_setting) and bench's report show.
			l.cfg.once("autotune", func() {
				l.cfg.Logf("shardload: rank %d: autotune kept %s: %.0f samples/s (the tuners' later changes are not logged: see the shardload_session_setting metrics, or bench's autotune line)", l.cfg.Rank, k0, rate)
			})
		},
	}, l.done)
}

// fetchKnobs returns k with the remote reads' settings zeroed (the sources' own)
// when no shard is remote.
func fetchKnobs(k tune.Knobs, remote bool) tune.Knobs {
	if !remote {
		k.FetchParallel, k.FetchPartSize = 0, 0
	}
	return k
}
