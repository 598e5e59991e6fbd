package shardload

import (
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/shardload/shardload/internal/pipeline"
	"github.com/shardload/shardload/internal/tune"
	"github.com/shardload/shardload/shard"
	"github.com/shardload/shardload/source"
)

// DefaultMemory is the memory budget of a Config whose Memory is 0: 1 GiB for the
// loader's buffers (see Config.Memory).
const DefaultMemory = 1 << 30

// MemoryOverhead is what a loader process holds beyond its loaders' budgets, at the
// default fetch settings: Go's runtime and code, the index, the sources' clients and
// connection buffers, and the part buffers a remote backend keeps between reads
// (source.Fetcher.MaxFreeBytes, 64 MiB). Peak RSS stays within the budgets plus
// this (BENCHMARKS.md).
const MemoryOverhead = 160 << 20

// tuneInterval is how often the tuner looks at the loader.
const tuneInterval = 500 * time.Millisecond

// Settings are the settings of a loader that its tuner may change while it runs:
// none changes what the loader yields.
type Settings struct {
	Workers       int   `json:"workers"`
	QueueBytes    int64 `json:"queue_bytes"`
	FetchParallel int   `json:"fetch_parallel"`
	FetchPartSize int64 `json:"fetch_part_size"`
	// Changes counts the changes the tuner kept; Settled says its last round of
	// trials kept none.
	Changes int  `json:"changes"`
	Settled bool `json:"settled"`
}

func (s Settings) String() string {
	return fmt.Sprintf("workers %d, queue-bytes %s, fetch-parallel %d, fetch-part-size %s", s.Workers, sizeString(s.QueueBytes), s.FetchParallel, sizeString(s.FetchPartSize))
}

// sizeString writes n in the largest binary unit that divides it.
func sizeString(n int64) string {
	for _, u := range []struct {
		s string
		n int64
	}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if n >= u.n && n%u.n == 0 {
			return fmt.Sprintf("%d%s", n/u.n, u.s)
		}
	}
	return fmt.Sprint(n)
}

// Tuner is a loader's autotuner, kept across loaders: give the loaders of a job's
// epochs the same Tuner (Config.Tuner) and each starts where the last one's settings
// ended. A Tuner used by one loader at a time is what it is for; its methods are
// safe for concurrent use.
type Tuner struct {
	mu  sync.Mutex
	t   *tune.Tuner
	acc tuneSpan // the interval so far
}

// NewTuner returns a tuner with no settings yet: the first loader that uses it
// starts from its Config's.
func NewTuner() *Tuner { return &Tuner{} }

// Settings returns the settings the tuner is at; zero before a loader used it.
func (t *Tuner) Settings() Settings {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.t == nil {
		return Settings{}
	}
	k := t.t.Knobs()
	return Settings{Workers: k.Workers, QueueBytes: k.QueueBytes, FetchParallel: k.FetchParallel, FetchPartSize: k.FetchPartSize,
		Changes: t.t.Changes(), Settled: t.t.Settled()}
}

// remote reports whether some shard is read from a remote store, where the fetch
// settings matter.
func remote(infos []shard.Info) bool {
	for _, s := range infos {
		if i := strings.Index(s.URL, "://"); i > 0 && s.URL[:i] != "file" {
			return true
		}
	}
	return false
}

// memoryOf returns the most bytes the loader's buffers hold with knobs k: the slab
// ring, the decoded samples (the open shards' queues, the shuffle windows and two
// batches being collated, plus an eighth for the buffers' size classes) and, for
// remote shards, the fetch parts of every open shard.
func (cfg Config) memoryOf(k tune.Knobs, remote bool) int64 {
	return int64(cfg.Slabs)*cfg.SlabBytes + cfg.sampleMemory(k) + fetchMemory(cfg.OpenShards, k, remote)
}

func (cfg Config) sampleMemory(k tune.Knobs) int64 {
	s := int64(cfg.OpenShards)*k.QueueBytes + cfg.ShuffleBytes + 2*cfg.SlabBytes
	return s + s/8
}

func fetchMemory(openShards int, k tune.Knobs, remote bool) int64 {
	if !remote || k.FetchParallel <= 1 {
		return 0 // one stream reads into the reader's buffers
	}
	return int64(openShards) * int64(k.FetchParallel) * k.FetchPartSize
}

// ErrMemory means a Config's settings need more memory than its budget
// (Config.Memory).
var ErrMemory = fmt.Errorf("shardload: memory budget too small")

// startKnobs returns the knobs a loader starts from: the tuner's (when it has some),
// else the config's; knobs the config does not pin are lowered until they fit the
// budget, or ErrMemory says what does not fit.
func (cfg Config) startKnobs(t *Tuner, remote bool) (tune.Knobs, tune.Pins, error) {
	pins := cfg.pins
	k := tune.Knobs{Workers: cfg.Workers, QueueBytes: cfg.QueueBytes, FetchParallel: cfg.FetchParallel, FetchPartSize: cfg.FetchPartSize}
	if t != nil {
		if s := t.Settings(); s.Workers > 0 {
			if !pins.Workers {
				k.Workers = min(s.Workers, cfg.OpenShards)
			}
			if !pins.QueueBytes {
				k.QueueBytes = s.QueueBytes
			}
			if !pins.FetchParallel {
				k.FetchParallel = s.FetchParallel
			}
			if !pins.FetchPartSize {
				k.FetchPartSize = s.FetchPartSize
			}
		}
	}
	budget := cfg.Memory
	for cfg.memoryOf(k, remote) > budget {
		switch {
		case !pins.FetchParallel && k.FetchParallel > 1 && remote:
			k.FetchParallel = 1
		case !pins.QueueBytes && k.QueueBytes > tune.MinQueueBytes:
			k.QueueBytes = max(k.QueueBytes/2, tune.MinQueueBytes)
		default:
			ring := int64(cfg.Slabs) * cfg.SlabBytes
			return k, pins, fmt.Errorf("%w: the budget is %s, the settings need %s: slabs %d x %s = %s, decoded samples %s (queues %d x %s, shuffle %s, two batches, size classes), fetch parts %s (%d open shards x %d x %s); raise Memory (--memory) or lower what the settings name",
				ErrMemory, sizeString(budget), sizeString(cfg.memoryOf(k, remote)), cfg.Slabs, sizeString(cfg.SlabBytes), sizeString(ring),
				sizeString(cfg.sampleMemory(k)), cfg.OpenShards, sizeString(k.QueueBytes), sizeString(cfg.ShuffleBytes),
				sizeString(fetchMemory(cfg.OpenShards, k, remote)), cfg.OpenShards, k.FetchParallel, sizeString(k.FetchPartSize))
		}
	}
	return k, pins, nil
}

// pipelineKnobs returns the pipeline's form of k.
func pipelineKnobs(k tune.Knobs, remote bool) pipeline.Knobs {
	pk := pipeline.Knobs{Workers: k.Workers, QueueBytes: k.QueueBytes}
	if remote {
		pk.Fetch = source.Tuning{PartSize: k.FetchPartSize, Parallel: k.FetchParallel}
	}
	return pk
}

// tuneSpan is what a loader did over part of an interval; a Tuner adds the parts of
// its loaders up, so that epochs shorter than an interval are judged together.
type tuneSpan struct {
	dt                            time.Duration
	samples, batches, wait, fetch int64
}

// autotune runs the loader's tuner until done is closed: every tuneInterval (or
// longer, until two batches came, across the loaders that share the Tuner) it gives
// the tuner what the loaders did and applies the settings it returns.
func (l *Loader) autotune(t *Tuner, remote bool, done <-chan struct{}) {
	tick := time.NewTicker(tuneInterval)
	defer tick.Stop()
	c := &l.p.C
	type snap struct {
		at                            time.Time
		samples, batches, wait, fetch int64
	}
	take := func() snap {
		return snap{time.Now(), c.Samples.Load(), c.Batches.Load(), c.Wait.Load(), c.Fetch.Load()}
	}
	prev := take()
	// add adds what the loader did since prev to the tuner's interval and, when that
	// is long enough, steps the tuner.
	add := func(step bool) {
		cur := take()
		t.mu.Lock()
		a := &t.acc
		a.dt += cur.at.Sub(prev.at)
		a.samples += cur.samples - prev.samples
		a.batches += cur.batches - prev.batches
		a.wait += cur.wait - prev.wait
		a.fetch += cur.fetch - prev.fetch
		prev = cur
		if !step || a.dt < tuneInterval || (a.batches < 2 && a.dt < 10*tuneInterval) {
			t.mu.Unlock()
			return
		}
		k0 := t.t.Knobs()
		k := t.t.Step(tune.Observation{
			Rate:       float64(a.samples) / a.dt.Seconds(),
			Bound:      float64(a.wait) >= 0.05*float64(a.dt),
			FetchShare: min(float64(a.fetch)/(float64(max(k0.Workers, 1))*float64(a.dt)), 1),
		})
		t.acc = tuneSpan{}
		t.mu.Unlock()
		if k != k0 {
			l.p.SetKnobs(pipelineKnobs(k, remote))
		}
	}
	for {
		select {
		case <-done:
			add(false)
			return
		case <-tick.C:
			add(true)
		}
	}
}
