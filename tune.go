package shardload

import (
	"errors"
	"fmt"
	"os"
	"path"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/shardload/shardload/decode"
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
	return fmt.Sprintf("workers %d, read-ahead %d, queue-bytes %s, fetch-parallel %d, fetch-part-size %s", s.Workers, s.ReadAhead, sizeString(s.QueueBytes), s.FetchParallel, sizeString(s.FetchPartSize))
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
	mu    sync.Mutex
	t     *tune.Tuner
	acc   tuneSpan // the interval so far
	steps int      // intervals judged
}

// NewTuner returns a tuner with no settings yet: the first loader that uses it
// starts from its Config's.
func NewTuner() *Tuner { return &Tuner{} }

// Settings returns the settings the tuner kept last (while a change is on trial,
// those before it); zero before a loader used it.
func (t *Tuner) Settings() Settings {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.t == nil {
		return Settings{}
	}
	k := t.t.Kept()
	return Settings{Workers: k.Workers, ReadAhead: k.ReadAhead, QueueBytes: k.QueueBytes, FetchParallel: k.FetchParallel, FetchPartSize: k.FetchPartSize,
		Changes: t.t.Changes(), Settled: t.t.Settled()}
}

// dataShape is what the memory a loader's knobs take depends on, from its shards.
type dataShape struct {
	remote     bool  // some shard is read from a remote store: the fetch settings matter
	maxShard   int64 // the largest shard's stored size; 0 when some size is unknown
	maxSamples int   // the most samples a shard holds
	compressed bool  // some shard is compressed as a whole (it inflates by an unknown ratio)
	decoded    int64 // bytes a sample's image fields decode to, beyond its stored bytes
}

func shapeOf(infos []shard.Info, fields []decode.Field) dataShape {
	var d dataShape
	for i := range fields {
		if fields[i].Kind == decode.KindImage {
			d.decoded += fields[i].RowBytes()
		}
	}
	known := true
	for _, s := range infos {
		if i := strings.Index(s.URL, "://"); i > 0 && s.URL[:i] != "file" {
			d.remote = true
		}
		if s.Size <= 0 {
			known = false
		}
		d.maxShard = max(d.maxShard, s.Size)
		d.maxSamples = max(d.maxSamples, s.Samples)
		switch strings.ToLower(path.Ext(s.URL)) {
		case ".gz", ".tgz", ".zst", ".zstd", ".bz2", ".xz", ".lz4":
			d.compressed = true
		}
	}
	if !known {
		d.maxShard = 0
	}
	return d
}

// queueCap is the most one open shard's queue holds with q: q, or less when every
// shard is small enough to be queued whole (its samples' bytes twice over, and a
// buffer of at least 4 KiB and some bookkeeping per sample, as the queue counts, and
// the decoded images).
func (d dataShape) queueCap(q int64) int64 {
	if d.maxShard == 0 || d.compressed {
		return q
	}
	return min(q, 2*d.maxShard+int64(d.maxSamples)*(8<<10+d.decoded))
}

// partsCap is the most part buffers one open shard's read holds with k: none when
// reads are local, read as one stream, or every shard fits in one part.
func (d dataShape) partsCap(k tune.Knobs) int64 {
	if !d.remote || k.FetchParallel <= 1 || (d.maxShard > 0 && d.maxShard <= k.FetchPartSize) {
		return 0
	}
	parts := int64(k.FetchParallel)
	if d.maxShard > 0 {
		parts = min(parts, (d.maxShard+k.FetchPartSize-1)/k.FetchPartSize)
	}
	return parts * k.FetchPartSize
}

// memoryOf returns the most bytes the loader's buffers hold with knobs k: the slab
// ring, the decoded samples (the open shards' queues, the shuffle windows and two
// batches being collated, plus an eighth for the buffers' size classes) and the
// remote reads' parts of every open shard.
func (cfg Config) memoryOf(k tune.Knobs, d dataShape) int64 {
	return int64(cfg.Slabs)*cfg.SlabBytes + cfg.sampleMemory(k, d) + cfg.fetchMemory(k, d)
}

func (cfg Config) sampleMemory(k tune.Knobs, d dataShape) int64 {
	s := int64(cfg.OpenShards+k.ReadAhead)*d.queueCap(k.QueueBytes) + cfg.ShuffleBytes + 2*cfg.SlabBytes
	return s + s/8
}

func (cfg Config) fetchMemory(k tune.Knobs, d dataShape) int64 {
	return int64(cfg.OpenShards+k.ReadAhead) * d.partsCap(k)
}

// ErrMemory means a Config's settings need more memory than its budget
// (Config.Memory).
var ErrMemory = errors.New("shardload: memory budget too small")

// startKnobs returns the knobs a loader starts from: the tuner's (when it has some),
// else the config's; knobs the config does not pin are lowered until they fit the
// budget, or ErrMemory says what does not fit.
func (cfg Config) startKnobs(t *Tuner, d dataShape) (tune.Knobs, tune.Pins, error) {
	pins := cfg.pins
	k := tune.Knobs{Workers: cfg.Workers, ReadAhead: cfg.ReadAhead, QueueBytes: cfg.QueueBytes, FetchParallel: cfg.FetchParallel, FetchPartSize: cfg.FetchPartSize}
	if t != nil {
		if s := t.Settings(); s.Workers > 0 {
			if !pins.Pinned(tune.ReadAhead) {
				k.ReadAhead = s.ReadAhead
			}
			if !pins.Pinned(tune.Workers) {
				k.Workers = min(s.Workers, cfg.OpenShards+k.ReadAhead)
			}
			if !pins.Pinned(tune.QueueBytes) {
				k.QueueBytes = s.QueueBytes
			}
			if !pins.Pinned(tune.FetchParallel) {
				k.FetchParallel = s.FetchParallel
			}
			if !pins.Pinned(tune.FetchPartSize) {
				k.FetchPartSize = s.FetchPartSize
			}
		}
	}
	budget := cfg.Memory
	for cfg.memoryOf(k, d) > budget {
		switch {
		case !pins.Pinned(tune.ReadAhead) && k.ReadAhead > 0:
			k.ReadAhead = 0
			if !pins.Pinned(tune.Workers) {
				k.Workers = min(k.Workers, cfg.OpenShards)
			}
		case !pins.Pinned(tune.FetchParallel) && d.partsCap(k) > 0:
			k.FetchParallel = 1
		case !pins.Pinned(tune.QueueBytes) && k.QueueBytes > tune.MinQueueBytes:
			k.QueueBytes = max(k.QueueBytes/2, tune.MinQueueBytes)
		default:
			ring := int64(cfg.Slabs) * cfg.SlabBytes
			return k, pins, fmt.Errorf("%w: the budget is %s, the settings need %s: slabs %d x %s = %s, decoded samples %s (queues %d x %s, shuffle %s, two batches, size classes), fetch parts %s (%d open shards x %d x %s); raise Memory (--memory) or lower what the settings name",
				ErrMemory, sizeString(budget), sizeString(cfg.memoryOf(k, d)), cfg.Slabs, sizeString(cfg.SlabBytes), sizeString(ring),
				sizeString(cfg.sampleMemory(k, d)), cfg.OpenShards+k.ReadAhead, sizeString(k.QueueBytes), sizeString(cfg.ShuffleBytes),
				sizeString(cfg.fetchMemory(k, d)), cfg.OpenShards+k.ReadAhead, k.FetchParallel, sizeString(k.FetchPartSize))
		}
	}
	return k, pins, nil
}

// autotuneSaid: a tuner of this process has logged a change it kept.
var autotuneSaid atomic.Bool

// fetchTuning returns the remote reads' settings of k: none when no shard is remote.
func fetchTuning(k tune.Knobs, remote bool) source.Tuning {
	if !remote {
		return source.Tuning{}
	}
	return source.Tuning{PartSize: k.FetchPartSize, Parallel: k.FetchParallel}
}

// cpuTimes returns the machine's idle and total CPU time so far, in clock ticks,
// from /proc/stat; ok is false where there is none.
func cpuTimes() (idle, total uint64, ok bool) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0, false
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 5 || f[0] != "cpu" {
		return 0, 0, false
	}
	for i, v := range f[1:] {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return 0, 0, false
		}
		total += n
		if i == 3 || i == 4 { // idle, iowait
			idle += n
		}
	}
	return idle, total, true
}

// tuneSpan is what a loader did over part of an interval; a Tuner adds the parts of
// its loaders up, so that epochs shorter than an interval are judged together.
type tuneSpan struct {
	dt                            time.Duration
	samples, batches, wait, fetch int64
	idle, cpu                     uint64 // the machine's idle and total CPU ticks
}

// autotune runs the loader's tuner until done is closed: every tuneInterval (or
// longer, until two windows of samples came, across the loaders that share the
// Tuner) it gives the tuner what the loaders did and applies the settings it
// returns.
func (l *Loader) autotune(t *Tuner, remote bool, done <-chan struct{}) {
	// The order yields a window's samples once most of them are in: the rate is
	// judged over two windows at least.
	minSamples := int64(2 * max(l.order.Window, l.cfg.BatchSize))
	tick := time.NewTicker(tuneInterval)
	defer tick.Stop()
	c := &l.p.C
	type snap struct {
		at                            time.Time
		samples, batches, wait, fetch int64
		idle, cpu                     uint64
	}
	take := func() snap {
		s := snap{at: time.Now(), samples: c.Samples.Load(), batches: c.Batches.Load(), wait: c.Wait.Load(), fetch: c.Fetch.Load()}
		s.idle, s.cpu, _ = cpuTimes()
		return s
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
		if cur.cpu >= prev.cpu && cur.idle >= prev.idle {
			a.idle += cur.idle - prev.idle
			a.cpu += cur.cpu - prev.cpu
		}
		prev = cur
		if !step || a.dt < tuneInterval || (a.samples < minSamples && a.dt < 4*tuneInterval) {
			t.mu.Unlock()
			return
		}
		k0, kept := t.t.Knobs(), t.t.Changes()
		rate := float64(a.samples) / a.dt.Seconds()
		k := t.t.Step(tune.Observation{
			Rate:       rate,
			Bound:      float64(a.wait) >= 0.05*float64(a.dt),
			FetchShare: min(float64(a.fetch)/(float64(max(k0.Workers, 1))*float64(a.dt)), 1),
			Saturated:  a.cpu > 0 && float64(a.idle) < tune.BusyIdle*float64(a.cpu),
		})
		t.acc = tuneSpan{}
		t.steps++
		keptNow := t.t.Changes() > kept
		t.mu.Unlock()
		if keptNow && !autotuneSaid.Swap(true) {
			// Once per process: a loader process serves many ranks and epochs, whose
			// settings the metrics (shardload_session_setting) and bench's report show.
			l.cfg.Logf("shardload: rank %d: autotune kept %s: %.0f samples/s (the tuners' later changes are not logged: see the shardload_session_setting metrics, or bench's autotune line)", l.cfg.Rank, k0, rate)
		}
		if k != k0 {
			l.p.SetKnobs(k.Workers, k.ReadAhead, k.QueueBytes, fetchTuning(k, remote))
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
