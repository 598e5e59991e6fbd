package main

// bench's result: its fields (the JSON of --json), the bottleneck and the text report.

import (
	"bufio"
	"fmt"
	"io"
	"sort"
	"time"

	"github.com/shardload/shardload"
	"github.com/shardload/shardload/cache"
	"github.com/shardload/shardload/device"
	"github.com/shardload/shardload/serve"
)

// benchResult is what bench reports; its JSON form is stable for scripts.
type benchResult struct {
	Samples         int64               `json:"samples"`
	Batches         int64               `json:"batches"`
	Epochs          int                 `json:"epochs"`
	BytesIn         int64               `json:"bytes_in"`
	Requests        int64               `json:"requests"` // reads of shards opened (spans of the plan, count checks)
	BytesDecomp     int64               `json:"bytes_decompressed"`
	BytesOut        int64               `json:"bytes_out"`
	BytesPlaced     int64               `json:"bytes_placed"`     // read straight into their slab rows (--slab-reads)
	Replaced        int64               `json:"batches_replaced"` // batches not as planned, collated from copies
	Seconds         float64             `json:"seconds"`
	EpochSeconds    []float64           `json:"epoch_seconds"`
	CountSeconds    float64             `json:"count_seconds"` // finding the shards' counts (an index, estimates or a count)
	Estimated       bool                `json:"estimated_counts"`
	ResumedAfter    int                 `json:"resumed_after_batches,omitempty"` // --resume-at: the batches the state had consumed
	PlanBatches     int                 `json:"plan_batches"`                    // the batches the first epoch's plan holds for the rank (after ResumedAfter)
	Order           string              `json:"order_fingerprint"`               // the first epoch's Order, the same on every rank of a job
	ReadBeforeFirst int64               `json:"read_before_first_batch_bytes"`   // bytes the process read (files and sockets) before the first batch`
	SamplesPerSec   float64             `json:"samples_per_sec"`
	MBPerSec        float64             `json:"mb_per_sec"`
	MBPerSecDecomp  float64             `json:"mb_per_sec_decompressed"`
	FirstBatch      float64             `json:"first_batch_seconds"`
	PeakRSS         int64               `json:"peak_rss_bytes"`
	ArenaFresh      int64               `json:"arena_fresh_bytes"`       // sample memory mapped new over the run (mostly the first epoch's)
	ArenaFreshSecs  float64             `json:"arena_fresh_seconds"`     // the time mapping and faulting it in took
	ArenaBasePages  bool                `json:"arena_base_pages"`        // huge pages faulted in too slowly: the later chunks took base pages
	CPUSeconds      float64             `json:"cpu_seconds"`             // user + system CPU time of the process over the run
	CPUPerSample    float64             `json:"cpu_seconds_per_sample"`  // CPUSeconds / Samples
	CPUPerGB        float64             `json:"cpu_seconds_per_gb"`      // CPUSeconds per 10^9 bytes read (BytesIn)
	ImageDecoder    string              `json:"image_decoder,omitempty"` // the JPEG decoder of image fields`
	StepSeconds     float64             `json:"step_seconds"`
	WaitFraction    float64             `json:"wait_fraction"`
	Skipped         int64               `json:"skipped"`
	Padded          int64               `json:"padded"`
	Trimmed         int64               `json:"trimmed"`
	Workers         int                 `json:"workers"`
	Stages          map[string]float64  `json:"stages"`
	Bottleneck      string              `json:"bottleneck"`
	MemoryBudget    int64               `json:"memory_budget_bytes"`
	MemoryOverhead  int64               `json:"memory_overhead_bytes"`
	Tuned           *shardload.Settings `json:"tuned,omitempty"` // where the tuner settled; nil with --autotune=false
	SlabsPageLocked bool                `json:"slabs_page_locked"`
	Device          deviceResult        `json:"device"`
	// Streams are each stream's figures in a mix of streams (--stream), in order.
	Streams []streamResult `json:"streams,omitempty"`
	// Cache is, per epoch, what the node's cache (--cache-dir, --cache-memory) served
	// the loader's reads: bytes from the store, from each tier; none when no read
	// went through a cache.
	Cache []cacheEpoch `json:"cache_epochs,omitempty"`
	// Hints is what the rank announced to the cache of the node (--cache-policy
	// order): none when no read went through a cache.
	Hints *hintReport `json:"hints,omitempty"`
	// RateLimit is, per endpoint the store throttled, what the process's request rate
	// limiter did (none when no store throttled).
	RateLimit      []rateLimitResult `json:"rate_limit,omitempty"`
	trainerSeconds float64
}

// cacheEpoch is what the cache served one epoch's reads (cache.Bytes): store_bytes
// read from the store for them (fetches into the cache, reads around it),
// memory_bytes and disk_bytes from the tiers, joined_bytes from fetches other reads
// had started; hit_rate is the share of the bytes the store did not send for them.
type cacheEpoch struct {
	Epoch int `json:"epoch"`
	cache.Bytes
	HitRate float64 `json:"hit_rate"`
}

// addCache adds an epoch's cache figures, unless nothing was read through a cache.
func (r *benchResult) addCache(epoch int, b cache.Bytes) {
	if b.Total() == 0 && len(r.Cache) == 0 {
		return
	}
	r.Cache = append(r.Cache, cacheEpoch{Epoch: epoch, Bytes: b, HitRate: b.HitRate()})
}

// hintReport is what the rank's hints to the node's cache cost: publishes, their
// entries, the bytes of the hint files written, the distinct shards announced over
// the epochs, and the wall time spent publishing on the trainer's goroutine (CPU,
// and waits for the hint file's write and rename); per shard and epoch, the bytes,
// and that wall time over the process's CPU time (cpu_share: an upper bound of the
// publishing's share of the CPU where it did not wait on the disk).
type hintReport struct {
	Publishes          int64   `json:"publishes"`
	Entries            int64   `json:"entries"`
	FileBytes          int64   `json:"file_bytes"`
	ShardEpochs        int64   `json:"shard_epochs"`
	Seconds            float64 `json:"seconds"`
	BytesPerShardEpoch float64 `json:"bytes_per_shard_epoch"`
	CPUShare           float64 `json:"cpu_share"`
}

// addHints records st, unless nothing was announced.
func (r *benchResult) addHints(st serve.HintStats) {
	if st.Publishes == 0 {
		return
	}
	h := &hintReport{Publishes: st.Publishes, Entries: st.Entries, FileBytes: st.FileBytes, ShardEpochs: st.ShardEpochs, Seconds: st.Time.Seconds()}
	if st.ShardEpochs > 0 {
		h.BytesPerShardEpoch = float64(st.FileBytes) / float64(st.ShardEpochs)
	}
	if r.CPUSeconds > 0 {
		h.CPUShare = h.Seconds / r.CPUSeconds
	}
	r.Hints = h
}

// streamResult is one stream's part of the report of a mix.
type streamResult struct {
	Samples int64 `json:"samples"`
	BytesIn int64 `json:"bytes_in"`
	Skipped int64 `json:"skipped"`
}

// deviceResult is the device-copy stage's part of the report.
type deviceResult struct {
	Kind        string  `json:"kind"`
	Name        string  `json:"name"`
	Placement   string  `json:"placement,omitempty"`
	Copies      int64   `json:"copies"`
	Bytes       int64   `json:"bytes"`
	CopySeconds float64 `json:"copy_seconds"`
	GBPerSec    float64 `json:"gb_per_sec"`
	WaitSeconds float64 `json:"wait_seconds"`
	// Overlap is the share of copy time the trainer did not wait for; Overlapped
	// says whether copies hid behind a --step-time step (at least 90% of it).
	Overlap    float64 `json:"overlap"`
	Overlapped bool    `json:"overlapped"`
	Verified   int64   `json:"verified_batches"`
}

func (d *deviceResult) add(l *shardload.Loader) {
	st := l.DeviceStats()
	d.Kind, d.Name = string(st.Kind), l.Device().String()
	d.Copies += st.Copies
	d.Bytes += st.Bytes
	d.CopySeconds += st.CopyTime.Seconds()
	d.WaitSeconds += st.WaitTime.Seconds()
}

func (d *deviceResult) finish(step time.Duration) {
	st := device.Stats{Bytes: d.Bytes, CopyTime: time.Duration(d.CopySeconds * float64(time.Second)),
		WaitTime: time.Duration(d.WaitSeconds * float64(time.Second))}
	d.GBPerSec, d.Overlap = st.GBPerSec(), st.Overlap()
	d.Overlapped = step > 0 && d.CopySeconds > 0 && d.Overlap >= 0.9
}

func (r *benchResult) add(st shardload.Stats) {
	r.BytesIn += st.BytesIn
	r.Requests += st.Requests
	r.BytesDecomp += st.BytesInflated
	r.BytesOut += st.BytesOut
	r.BytesPlaced += st.BytesPlaced
	r.Replaced += st.Replaced
	r.Skipped += st.Skipped
	r.Padded += st.Padded
	r.Trimmed += st.Trimmed
	r.Workers = st.Workers
	r.SlabsPageLocked = st.PageLocked
	for i, s := range st.Streams {
		if i == len(r.Streams) {
			r.Streams = append(r.Streams, streamResult{})
		}
		r.Streams[i].Samples += s.Samples
		r.Streams[i].BytesIn += s.BytesIn
		r.Streams[i].Skipped += s.Skipped
	}
	for k, v := range st.Stages {
		r.Stages[k] += v.Seconds()
	}
}

// bottleneck names, in one line, what limits the loader: nothing when the trainer
// barely waits, otherwise the stage busiest for the goroutines that run it.
func (r *benchResult) bottleneck() string {
	if r.StepSeconds > 0 && r.WaitFraction < 0.01 {
		return fmt.Sprintf("none: the trainer waited %.1f%% of its time; the loader keeps up with a %s step", 100*r.WaitFraction, time.Duration(r.StepSeconds*float64(time.Second)))
	}
	type load struct {
		stage string
		share float64
	}
	var loads []load
	for _, s := range []string{"fetch", "inflate", "split", "decode"} {
		loads = append(loads, load{s, r.Stages[s] / (r.Seconds * float64(r.Workers))})
	}
	for _, s := range []string{"shuffle", "collate"} {
		loads = append(loads, load{s, r.Stages[s] / r.Seconds})
	}
	sort.SliceStable(loads, func(i, j int) bool { return loads[i].share > loads[j].share })
	top := loads[0]
	who := fmt.Sprintf("%d workers'", r.Workers)
	if top.stage == "shuffle" || top.stage == "collate" {
		who = "the mixer's"
	}
	msg := fmt.Sprintf("%s: %.0f%% of %s time", top.stage, 100*top.share, who)
	if r.StepSeconds > 0 {
		msg = fmt.Sprintf("loader-bound, the trainer waited %.0f%% of its time; busiest stage %s", 100*r.WaitFraction, msg)
	}
	return msg
}

func (r *benchResult) report(w io.Writer) error {
	bw := bufio.NewWriter(w)
	fmt.Fprintf(bw, "bench: %d samples in %d batches (%d epoch(s)) in %.2fs", r.Samples, r.Batches, r.Epochs, r.Seconds)
	if r.CountSeconds > 0.005 {
		fmt.Fprintf(bw, ", after %.2fs finding the sample counts", r.CountSeconds)
	}
	if r.Estimated {
		fmt.Fprintf(bw, " (estimated from the shards' sizes: %d rows padded, %d samples trimmed)", r.Padded, r.Trimmed)
	}
	if len(r.EpochSeconds) > 1 {
		fmt.Fprintf(bw, "\n  epochs took")
		for _, s := range r.EpochSeconds {
			fmt.Fprintf(bw, " %.2fs", s)
		}
	}
	fmt.Fprintf(bw, "\n  %.0f samples/s, %.1f MB/s stored, %.1f MB/s decompressed, %.1f MB/s into slabs\n",
		r.SamplesPerSec, r.MBPerSec, r.MBPerSecDecomp, float64(r.BytesOut)/1e6/r.Seconds)
	if r.BytesPlaced > 0 {
		fmt.Fprintf(bw, "  %.0f%% of the bytes into slabs read straight into their rows\n", 100*float64(r.BytesPlaced)/float64(max(1, r.BytesOut)))
	}
	fmt.Fprintf(bw, "  CPU %.2fs (%.0f µs a sample, %.2f s a GB read)", r.CPUSeconds, 1e6*r.CPUPerSample, r.CPUPerGB)
	if r.ImageDecoder != "" {
		fmt.Fprintf(bw, "; images decoded by %s", r.ImageDecoder)
	}
	fmt.Fprintln(bw)
	fmt.Fprintf(bw, "  first batch after %.3fs (%.1f MB read before it); peak RSS %.0f MB (memory budget %.0f MB + %.0f MB for the process); slabs page-locked: %v\n",
		r.FirstBatch, float64(r.ReadBeforeFirst)/1e6, float64(r.PeakRSS)/1e6, float64(r.MemoryBudget)/1e6, float64(r.MemoryOverhead)/1e6, r.SlabsPageLocked)
	if r.ArenaFresh > 0 {
		pages := "huge pages"
		if r.ArenaBasePages {
			pages = "base pages after huge pages faulted in slowly"
		}
		fmt.Fprintf(bw, "  sample memory: %.0f MB mapped new, faulted in in %.3fs (%s)\n", float64(r.ArenaFresh)/1e6, r.ArenaFreshSecs, pages)
	}
	if r.Tuned != nil {
		state := "still trying changes"
		if r.Tuned.Settled {
			state = "settled"
		}
		fmt.Fprintf(bw, "  autotune: %s (%d changes kept, %s)\n", r.Tuned, r.Tuned.Changes, state)
	}
	for i, s := range r.Streams {
		fmt.Fprintf(bw, "  stream %d: %d samples (%.1f%%), %.1f MB read, %d skipped\n", i, s.Samples, 100*float64(s.Samples)/float64(max(r.Samples, 1)), float64(s.BytesIn)/1e6, s.Skipped)
	}
	fmt.Fprintf(bw, "  stages (seconds, summed over %d workers):", r.Workers)
	for _, s := range shardload.StageNames {
		fmt.Fprintf(bw, " %s %.2f", s, r.Stages[s])
	}
	fmt.Fprintln(bw)
	if r.Skipped > 0 || r.Padded > 0 {
		fmt.Fprintf(bw, "  skipped %d samples, padded %d rows\n", r.Skipped, r.Padded)
	}
	if r.StepSeconds > 0 {
		fmt.Fprintf(bw, "  trainer step %s: waited %.1f%% of its time (GPU busy %.1f%% as the loader sees it)\n",
			time.Duration(r.StepSeconds*float64(time.Second)), 100*r.WaitFraction, 100*(1-r.WaitFraction))
	}
	d := r.Device
	if d.Kind == string(device.CUDA) {
		fmt.Fprintf(bw, "  device %s: %d copies, %.1f MB in %.3fs of copy time: %.2f GB/s host to device",
			d.Name, d.Copies, float64(d.Bytes)/1e6, d.CopySeconds, d.GBPerSec)
		if r.StepSeconds > 0 {
			fmt.Fprintf(bw, "; trainer waited %.3fs for copies, %.0f%% of copy time overlapped the step (overlapped: %v)",
				d.WaitSeconds, 100*d.Overlap, d.Overlapped)
		}
		fmt.Fprintln(bw)
	} else {
		fmt.Fprintf(bw, "  device host: no copy; %d batches (%.1f MB) passed the stage in their pinned slabs, counting those prepared ahead of the trainer\n", d.Copies, float64(d.Bytes)/1e6)
	}
	if d.Verified > 0 {
		fmt.Fprintf(bw, "  verified: %d batches on the device equal their slabs\n", d.Verified)
	}
	if d.Placement != "" {
		fmt.Fprintf(bw, "  placement: %s\n", d.Placement)
	}
	for _, e := range r.Cache {
		fmt.Fprintf(bw, "  cache, epoch %d: %s\n", e.Epoch, e.Bytes)
	}
	if h := r.Hints; h != nil {
		fmt.Fprintf(bw, "  cache hints: %d publishes, %d entries, %d bytes written (%.0f a shard an epoch), %.4fs publishing (%.3f%% of the process's CPU time)\n",
			h.Publishes, h.Entries, h.FileBytes, h.BytesPerShardEpoch, h.Seconds, 100*h.CPUShare)
	}
	for _, e := range r.RateLimit {
		fmt.Fprintf(bw, "  %s\n", e)
	}
	fmt.Fprintf(bw, "  bottleneck: %s\n", r.Bottleneck)
	return bw.Flush()
}
