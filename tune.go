package shardload

import (
	"fmt"
	"time"

	"github.com/shardload/shardload/internal/tune"
	"github.com/shardload/shardload/mem"
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
