package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/http/pprof"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/shardload/shardload"
	"github.com/shardload/shardload/cache"
	"github.com/shardload/shardload/serve"
	"github.com/shardload/shardload/source"
)

// statsFunc returns the sessions' counters and the totals of the ended ones, as
// serve.Server.Stats does.
type statsFunc func() ([]serve.SessionStats, shardload.Stats)

// serverMetrics renders the counters of a server's sessions (or of bench's loader)
// and of the cache as Prometheus metrics, read at each scrape: nothing on the
// loader's hot path.
type serverMetrics struct {
	stats   statsFunc
	cache   *cache.Cache        // nil without a cache
	limiter *source.RateLimiter // the process's request pacing (source.DefaultRateLimiter)

	sessions                                               *prometheus.Desc
	samples, batches, padded, skipped, skippedShards       *prometheus.Desc
	bytesRead, bytesInflated, bytesOut, stage, wait        *prometheus.Desc
	backpressure, trimmed, slabBytes                       *prometheus.Desc
	totalSamples, totalBatches, totalBytesRead, totalStage *prometheus.Desc
	cacheHits, cacheFetches, cacheEvictions, cacheBytes    *prometheus.Desc
	cacheEntries, cacheFailures                            *prometheus.Desc
	cacheServed, cacheStore, sessionCache                  *prometheus.Desc
	retries, resumes, budget, ringSlabs, ringInUse         *prometheus.Desc
	memory, knob, tunerChanges, queued                     *prometheus.Desc
	streamSamples, streamBytes, streamSkipped              *prometheus.Desc
	rateLimit, throttles, rateDecreases, rateWaits         *prometheus.Desc
	rateWaited, outages                                    *prometheus.Desc
}

func newServerMetrics(stats statsFunc, c *cache.Cache) *serverMetrics {
	sess := []string{"session", "rank"}
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc("shardload_"+name, help, labels, nil)
	}
	return &serverMetrics{
		stats: stats, cache: c, limiter: source.DefaultRateLimiter,
		sessions:      d("sessions", "Trainer sessions being served."),
		samples:       d("session_samples_total", "Samples a session's loader collated into batches (padding not counted).", sess...),
		batches:       d("session_batches_total", "Batches a session's loader collated.", sess...),
		padded:        d("session_padded_samples_total", "Rows repeating another sample to pad a batch (skipped samples, estimated counts).", sess...),
		skipped:       d("session_skipped_samples_total", "Samples the skip policy left out.", sess...),
		skippedShards: d("session_skipped_shards_total", "Shards (or their rests) the skip policy left out.", sess...),
		bytesRead:     d("session_read_bytes_total", "Bytes read from the sources, as stored.", sess...),
		bytesInflated: d("session_inflated_bytes_total", "Bytes of tar after whole-shard decompression.", sess...),
		bytesOut:      d("session_batch_bytes_total", "Bytes of the batches written into slabs.", sess...),
		stage:         d("session_stage_seconds_total", "Time spent per pipeline stage, summed over the goroutines that run it.", "session", "rank", "stage"),
		wait:          d("session_wait_seconds_total", "Time the session's trainer waited for a batch that was not ready: the loader behind (starvation), as the trainer measured it (protocol 4), else as the server saw it.", sess...),
		backpressure:  d("session_backpressure_seconds_total", "Time the session's loader waited for a slab while the trainer held every one: the loader ahead of the trainer.", sess...),
		trimmed:       d("session_left_out_samples_total", "Samples read past the planned batches of an epoch planned from estimated counts, and left out.", sess...),
		slabBytes:     d("session_slab_bytes", "The size of the session's largest slab (sized from the batch, grown when a batch needed more).", sess...),
		totalSamples:  d("samples_total", "Samples collated by all sessions, ended ones included."),
		totalBatches:  d("batches_total", "Batches collated by all sessions, ended ones included."),
		totalBytesRead: d("read_bytes_total",
			"Bytes read from the sources by all sessions, ended ones included."),
		totalStage:     d("stage_seconds_total", "Time spent per pipeline stage by all sessions, ended ones included.", "stage"),
		cacheHits:      d("cache_hits_total", "Opens served from a cache tier.", "tier"),
		cacheFetches:   d("cache_fetches_total", "Objects fetched from their source into the cache."),
		cacheEvictions: d("cache_evictions_total", "Entries evicted from either tier to make room."),
		cacheFailures:  d("cache_failures_total", "Cache fetches that failed, disk writes that failed, and cached entries found corrupt (a block's checksum did not match; fetched again).", "what"),
		cacheBytes:     d("cache_bytes", "Bytes a cache tier holds or has reserved.", "tier"),
		cacheEntries:   d("cache_entries", "Entries in a cache tier.", "tier"),
		cacheServed:    d("cache_served_bytes_total", "Bytes the cache served to the loaders' reads, by where they came from: memory and disk (its tiers), joined (a fetch into the cache another read had started), store (read from the store for the read itself: a fetch into the cache it started, or a read around the cache: admission declined, no room, a range of an object not cached, the disk not writable).", "from"),
		cacheStore:     d("cache_store_bytes_total", "Bytes the cache read from the store: fetch (objects fetched into the cache, once each however many reads they served), bypass (reads that went around the cache).", "how"),
		sessionCache:   d("session_cache_bytes_total", "Bytes the cache served to a session's reads, by where they came from: store, memory, disk, joined (as shardload_cache_served_bytes_total).", "session", "rank", "from"),
		retries:        d("fetch_retries_total", "Requests to a source tried again after a retryable failure."),
		resumes:        d("fetch_resumes_total", "Retried reads that went on at the byte offset they had reached."),
		outages:        d("fetch_outages_total", "Outages of a store's endpoint: stretches during which its requests failed in a way a retry may cure (throttling aside), from the first failure to the next success."),
		ringSlabs:      d("session_ring_slabs", "Slabs in a session's ring.", sess...),
		ringInUse:      d("session_ring_slabs_in_use", "Slabs of a session's ring holding a batch: being collated, ready, or with the trainer.", sess...),
		budget:         d("session_memory_budget_bytes", "What a session's buffers may hold: slabs, decoded samples (queues, shuffle windows, batches) and remote reads' parts (--memory).", sess...),
		queued:         d("session_queued_bytes", "Decoded samples waiting in a session's open shards' queues, in bytes (their buffers, as the queues count them).", sess...),
		memory:         d("session_memory_bytes", "What a session's buffers may hold at its settings in effect (the tuner's), within its budget.", sess...),
		knob:           d("session_setting", "A session's setting in effect, as its tuner left it: workers, read_ahead (shards), queue_bytes, fetch_parallel, fetch_part_size.", "session", "rank", "setting"),
		tunerChanges:   d("session_autotune_changes_total", "Setting changes a session's tuner kept.", sess...),
		streamSamples:  d("session_stream_samples_total", "Samples of each stream of a mix a session's loader collated into batches (label stream: its index in the mix).", "session", "rank", "stream"),
		streamBytes:    d("session_stream_read_bytes_total", "Bytes read of each stream of a mix, as stored.", "session", "rank", "stream"),
		streamSkipped:  d("session_stream_skipped_samples_total", "Samples of each stream of a mix the skip policy left out.", "session", "rank", "stream"),
		rateLimit:      d("request_rate_limit", "Requests per second the process's adaptive rate limiter lets go to an endpoint (a bucket of S3 or GCS, a host of HTTP): set by the store's throttling answers and --max-request-rate; only endpoints with a limit in force.", "endpoint"),
		throttles:      d("request_throttles_total", "Throttling answers an endpoint gave the process's requests (S3's 503 SlowDown, HTTP 429 and 503).", "endpoint"),
		rateDecreases:  d("request_rate_decreases_total", "Times an endpoint's throttling answers lowered its rate limit (once per round of them).", "endpoint"),
		rateWaits:      d("request_rate_waits_total", "Requests to an endpoint that waited for their turn under its rate limit.", "endpoint"),
		rateWaited:     d("request_rate_wait_seconds_total", "Time requests to an endpoint waited for their turn under its rate limit, summed over the requests.", "endpoint"),
	}
}

// Describe sends the metrics' descriptions.
func (m *serverMetrics) Describe(ch chan<- *prometheus.Desc) { prometheus.DescribeByCollect(m, ch) }

// Collect reads the server's and the cache's counters.
func (m *serverMetrics) Collect(ch chan<- prometheus.Metric) {
	c := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v, labels...)
	}
	g := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	sessions, total := m.stats()
	g(m.sessions, float64(len(sessions)))
	for _, s := range sessions {
		id, rank := strconv.FormatUint(s.ID, 10), strconv.Itoa(s.Rank)
		c(m.samples, float64(s.Samples), id, rank)
		c(m.batches, float64(s.Batches), id, rank)
		c(m.padded, float64(s.Padded), id, rank)
		c(m.skipped, float64(s.Skipped), id, rank)
		c(m.skippedShards, float64(s.SkippedShards), id, rank)
		c(m.bytesRead, float64(s.BytesIn), id, rank)
		c(m.bytesInflated, float64(s.BytesInflated), id, rank)
		c(m.bytesOut, float64(s.BytesOut), id, rank)
		for _, st := range shardload.StageNames {
			if st == "wait" || st == "backpressure" {
				continue
			}
			c(m.stage, s.Stages[st].Seconds(), id, rank, st)
		}
		c(m.wait, s.Stages["wait"].Seconds(), id, rank)
		c(m.backpressure, s.Stages["backpressure"].Seconds(), id, rank)
		c(m.trimmed, float64(s.Trimmed), id, rank)
		for i, st := range s.Streams {
			c(m.streamSamples, float64(st.Samples), id, rank, strconv.Itoa(i))
			c(m.streamBytes, float64(st.BytesIn), id, rank, strconv.Itoa(i))
			c(m.streamSkipped, float64(st.Skipped), id, rank, strconv.Itoa(i))
		}
		g(m.slabBytes, float64(s.SlabBytes), id, rank)
		g(m.budget, float64(s.MemoryBudget), id, rank)
		g(m.memory, float64(s.Memory), id, rank)
		g(m.queued, float64(s.Queued), id, rank)
		if k := s.Settings; k.Workers > 0 {
			for _, kn := range shardload.Knobs {
				if kn.Tuned {
					g(m.knob, float64(kn.Setting(k)), id, rank, kn.Label())
				}
			}
			c(m.tunerChanges, float64(k.Changes), id, rank)
		}
		if s.RingSlabs > 0 {
			g(m.ringSlabs, float64(s.RingSlabs), id, rank)
			g(m.ringInUse, float64(s.RingInUse), id, rank)
		}
		if m.cache != nil {
			for _, f := range bytesFrom(s.Cache) {
				c(m.sessionCache, float64(f.n), id, rank, f.from)
			}
		}
		total.Add(s.Stats)
	}
	c(m.totalSamples, float64(total.Samples))
	c(m.totalBatches, float64(total.Batches))
	c(m.totalBytesRead, float64(total.BytesIn))
	for _, st := range shardload.StageNames {
		c(m.totalStage, total.Stages[st].Seconds(), st)
	}
	retries, resumes := source.Retries()
	c(m.retries, float64(retries))
	c(m.resumes, float64(resumes))
	c(m.outages, float64(source.Outages()))
	for _, e := range m.limiter.Endpoints() {
		if !math.IsInf(e.Rate, 1) {
			g(m.rateLimit, e.Rate, e.Endpoint)
		}
		c(m.throttles, float64(e.Throttled), e.Endpoint)
		c(m.rateDecreases, float64(e.Decreases), e.Endpoint)
		c(m.rateWaits, float64(e.Waits), e.Endpoint)
		c(m.rateWaited, e.Waited.Seconds(), e.Endpoint)
	}
	if m.cache == nil {
		return
	}
	cs := m.cache.Stats()
	c(m.cacheHits, float64(cs.MemoryHits), "memory")
	c(m.cacheHits, float64(cs.DiskHits), "disk")
	c(m.cacheFetches, float64(cs.Fetches))
	c(m.cacheEvictions, float64(cs.Evicted))
	c(m.cacheFailures, float64(cs.Failed), "fetch")
	c(m.cacheFailures, float64(cs.WriteErrors), "disk_write")
	c(m.cacheFailures, float64(cs.Corrupt), "corrupt")
	g(m.cacheBytes, float64(cs.MemoryBytes), "memory")
	g(m.cacheBytes, float64(cs.DiskBytes), "disk")
	g(m.cacheEntries, float64(cs.MemoryEntries), "memory")
	g(m.cacheEntries, float64(cs.DiskEntries), "disk")
	for _, f := range bytesFrom(cs.Served()) {
		c(m.cacheServed, float64(f.n), f.from)
	}
	c(m.cacheStore, float64(cs.BytesFetched), "fetch")
	c(m.cacheStore, float64(cs.BytesBypassed), "bypass")
}

// byteCount is a count of bytes and the value of its label "from".
type byteCount struct {
	from string
	n    int64
}

// bytesFrom returns b's counts with their labels, in the order the metrics list them.
func bytesFrom(b cache.Bytes) []byteCount {
	return []byteCount{{"store", b.Store}, {"memory", b.Memory}, {"disk", b.Disk}, {"joined", b.Joined}}
}

// rateLimitResult is bench's report of the process's request rate limiter for one
// endpoint that throttled requests (source.EndpointStats).
type rateLimitResult struct {
	Endpoint    string  `json:"endpoint"`
	Rate        float64 `json:"rate"` // requests per second it allows at the end; 0: no limit in force
	Throttled   int64   `json:"throttled"`
	Decreases   int64   `json:"decreases"`
	Waits       int64   `json:"waits"`
	WaitSeconds float64 `json:"wait_seconds"`
}

// throttledEndpoints returns the figures of source.DefaultRateLimiter for the
// endpoints whose store throttled the process's requests.
func throttledEndpoints() []rateLimitResult {
	var out []rateLimitResult
	for _, e := range source.DefaultRateLimiter.Endpoints() {
		if e.Throttled == 0 {
			continue
		}
		r := rateLimitResult{Endpoint: e.Endpoint, Throttled: e.Throttled, Decreases: e.Decreases, Waits: e.Waits, WaitSeconds: e.Waited.Seconds()}
		if !math.IsInf(e.Rate, 1) {
			r.Rate = e.Rate
		}
		out = append(out, r)
	}
	return out
}

// String is the report's line.
func (r rateLimitResult) String() string {
	limit := "no limit in force now"
	if r.Rate > 0 {
		limit = fmt.Sprintf("now %.1f requests/s", r.Rate)
	}
	return fmt.Sprintf("rate limit %s: %d throttling answers, %d decreases of the rate (%s); %d requests waited %.2fs in all",
		r.Endpoint, r.Throttled, r.Decreases, limit, r.Waits, r.WaitSeconds)
}

// serveMetrics listens on addr and serves /metrics (the sessions', the cache's and
// the Go runtime's metrics) and, with withPprof, /debug/pprof, which only a loopback
// address may serve (profiles can hold URLs and credentials: --pprof-addr serves
// them elsewhere, explicitly). It returns the address it listens on and a function
// that stops it. Each of more adds its handlers to the listener's (serve's probes).
func serveMetrics(addr string, withPprof bool, stats statsFunc, c *cache.Cache, stderr io.Writer, more ...func(*http.ServeMux)) (string, func(), error) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(newServerMetrics(stats, c), collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorLog: nil}))
	for _, add := range more {
		add(mux)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", nil, fmt.Errorf("--metrics %s: %w", addr, err)
	}
	if withPprof {
		if !loopback(ln.Addr()) {
			ln.Close()
			return "", nil, fmt.Errorf("%w: --pprof serves Go's profiles (which can hold URLs and credentials) on the --metrics listener only when it is a loopback address, and %s is not (%s listens on every interface): give --metrics 127.0.0.1:PORT, or serve the profiles on an address of your choice with --pprof-addr", errUsage, addr, ln.Addr())
		}
		handlePprof(mux)
	}
	return serveHTTP(ln, mux, "metrics", stderr)
}

// servePprof listens on addr and serves Go's profiles at /debug/pprof: where the
// operator said, loopback or not.
func servePprof(addr string, stderr io.Writer) (string, func(), error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", nil, fmt.Errorf("--pprof-addr %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	handlePprof(mux)
	return serveHTTP(ln, mux, "pprof", stderr)
}

func handlePprof(mux *http.ServeMux) {
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
}

// loopback reports whether a listener's address is a loopback one.
func loopback(a net.Addr) bool {
	ta, ok := a.(*net.TCPAddr)
	return ok && ta.IP.IsLoopback()
}

// serveHTTP serves mux on ln until the function it returns is called.
func serveHTTP(ln net.Listener, mux *http.ServeMux, what string, stderr io.Writer) (string, func(), error) {
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		if err := hs.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			fmt.Fprintf(stderr, "shardload: %s: %v\n", what, err)
		}
	}()
	return ln.Addr().String(), func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		hs.Shutdown(ctx)
	}, nil
}

// benchStats is bench's loader as one session (id 0) for the metrics: the counters of
// its finished epochs and of the one running.
type benchStats struct {
	mu    sync.Mutex
	rank  int
	world int
	done  shardload.Stats
	cur   *shardload.Loader
	// What the cache served the finished epochs, and the tally of the one running.
	cacheDone cache.Bytes
	tally     *cache.Tally
	epoch     int
	start     time.Time
	budget    int64
	tuner     *shardload.Tuner
}

func (b *benchStats) open(l *shardload.Loader, epoch int, tally *cache.Tally) {
	if b == nil {
		return
	}
	b.mu.Lock()
	b.cur, b.epoch = l, epoch
	b.cacheDone = b.cacheDone.Add(b.tally.Bytes())
	b.tally = tally
	b.mu.Unlock()
}

func (b *benchStats) close(l *shardload.Loader) {
	if b == nil {
		return
	}
	b.mu.Lock()
	b.done.Add(l.Stats())
	if b.cur == l {
		b.cur = nil
	}
	b.mu.Unlock()
}

func (b *benchStats) stats() ([]serve.SessionStats, shardload.Stats) {
	b.mu.Lock()
	defer b.mu.Unlock()
	var st shardload.Stats
	st.Add(b.done)
	if b.cur != nil {
		st.Add(b.cur.Stats())
	}
	out := serve.SessionStats{Rank: b.rank, World: b.world, Epoch: b.epoch, Started: b.start, MemoryBudget: b.budget, Stats: st,
		Cache: b.cacheDone.Add(b.tally.Bytes())}
	if b.tuner != nil {
		out.Settings = b.tuner.Settings()
	}
	return []serve.SessionStats{out}, shardload.Stats{}
}
