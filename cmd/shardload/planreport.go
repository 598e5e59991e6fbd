package main

// plan's report: its fields (the JSON of --json) and its text.

import (
	"fmt"
	"io"
	"math"
	"strings"
)

// planReport is what plan prints; its JSON form is for tools.
type planReport struct {
	Shards          int     `json:"shards"`
	Samples         int64   `json:"samples"`
	DatasetBytes    int64   `json:"dataset_bytes"`
	Nodes           int     `json:"nodes"`
	RanksPerNode    int     `json:"ranks_per_node"`
	World           int     `json:"world"`
	BatchSize       int     `json:"batch_size"`
	Prefixes        int     `json:"prefixes"` // the directories of the shards' URLs
	BatchesPerRank  int     `json:"batches_per_rank"`
	SamplesPerRank  int     `json:"samples_per_rank"`
	DroppedPerEpoch int     `json:"dropped_samples_per_epoch"`
	EpochSeconds    float64 `json:"epoch_seconds"` // batches per rank x step time

	BytesPerNode          int64   `json:"bytes_per_node_per_epoch"`
	BytesPerNodeMin       int64   `json:"bytes_per_node_per_epoch_min"`
	BytesPerNodeMax       int64   `json:"bytes_per_node_per_epoch_max"`
	RequestsPerNode       int64   `json:"requests_per_node_per_epoch"`
	RequestsPerNodeMin    int64   `json:"requests_per_node_per_epoch_min"`
	RequestsPerNodeMax    int64   `json:"requests_per_node_per_epoch_max"`
	SingleRequestsPerNode int64   `json:"requests_per_node_per_epoch_single_stream"`
	SpansPerNode          int64   `json:"spans_per_node_per_epoch"`
	ShardsPerNode         int64   `json:"shards_per_node_per_epoch"`
	BytesPerJob           int64   `json:"bytes_per_job_per_epoch"`
	RequestsPerJob        int64   `json:"requests_per_job_per_epoch"`
	ReadAmplification     float64 `json:"read_amplification"` // bytes per job per epoch / dataset bytes

	PeakGetRatePerPrefix float64 `json:"peak_get_rate_per_prefix"` // at the epoch's start
	// PeakGetRatePerPrefixSpread is the same with the ranks' start spread
	// (source.StartSpread) widening the window of the epoch's first requests.
	PeakGetRatePerPrefixSpread float64 `json:"peak_get_rate_per_prefix_spread"`
	StartSpreadSeconds         float64 `json:"start_spread_seconds"`
	MeanGetRatePerPrefix       float64 `json:"mean_get_rate_per_prefix"` // over the epoch
	StartRequestsPerJob        int64   `json:"start_requests_per_job"`
	OverPrefixLimit            bool    `json:"over_prefix_limit"`
	// The rates per prefix are the busiest prefix's: requests fall on a prefix in
	// proportion to its shards, and it holds this share of them (1/prefixes when
	// they are spread evenly). The rates of one prefix are those of the whole job,
	// the dataset before its keys are spread (the figures "before").
	PrefixBusiestShare   float64 `json:"prefix_busiest_share"`
	PeakGetRateOnePrefix float64 `json:"peak_get_rate_one_prefix"`
	MeanGetRateOnePrefix float64 `json:"mean_get_rate_one_prefix"`
	// PrefixesNeeded is the fewest prefixes, evenly spread, that keep both rates
	// under --prefix-get-limit.
	PrefixesNeeded int `json:"prefixes_needed"`

	// IndexBytesPerProcess is what a loader's process holds of the index after
	// planning: of an addressable index, every shard's entry without its offsets and
	// the offsets of the shards the rank's plan reads (the most of the planned ranks);
	// of an index of an earlier format, read whole, IndexBytesWhole.
	IndexBytesPerProcess int64 `json:"index_bytes_per_process"`
	IndexBytesWhole      int64 `json:"index_bytes_per_process_whole"` // every shard's entry with its offsets
	IndexAddressable     bool  `json:"index_addressable"`
	// IndexReadBytesPerProcess and IndexGetsPerProcess are what a process reads of
	// the index object when it reads it itself (no node index store, no node cache):
	// its start and counts, then the blocks of its plan's shards (the mean of the
	// planned ranks); an index of an earlier format whole, in one GET.
	IndexReadBytesPerProcess int64   `json:"index_read_bytes_per_process"`
	IndexGetsPerProcess      float64 `json:"index_gets_per_process"`
	// IndexReadBytesPerNode and IndexGetsPerNodeAtStart are what a node reads of it
	// from the store with its index store or cache (the loader's default): the whole
	// object, once, shared by its ranks.
	IndexReadBytesPerNode   int64 `json:"index_read_bytes_per_node"`
	IndexGetsPerNodeAtStart int64 `json:"index_gets_per_node_at_start"`

	// IndexFetchSeconds is the time a node takes to get the index object before its
	// ranks read it: a HEAD and a GET of the whole object, every node's on the
	// object's one key (over a prefix's limit, in their turn); 0 for a local index.
	IndexFetchSeconds float64 `json:"index_fetch_seconds"`

	IndexFileBytes     int64   `json:"index_file_bytes"`
	IndexLoadSeconds   float64 `json:"index_load_seconds"`
	IndexLoad          string  `json:"index_load_method"`
	PlanSecondsPerRank float64 `json:"plan_seconds_per_rank"`

	CacheBytes        int64     `json:"cache_bytes"`
	CacheHitRate      []float64 `json:"cache_hit_rate"` // per epoch, across epochs
	CacheHitRateMean  float64   `json:"cache_hit_rate_mean"`
	StoreBytesPerNode []int64   `json:"store_bytes_per_node"` // per epoch, with the cache
	// CachePolicy is the policy of the figures above (--cache-policy); CachePolicies
	// has each policy's, by name (order, lru), with a cache.
	CachePolicy   string                  `json:"cache_policy"`
	CachePolicies map[string]cacheFigures `json:"cache_policies,omitempty"`
	// NodeAffinity: each node keeps its shards from epoch to epoch (more than one
	// node, shuffled, not a mix, without --node-affinity=false).
	NodeAffinity        bool     `json:"node_affinity"`
	FirstBatchSeconds   float64  `json:"first_batch_seconds"`
	FirstBatchBytes     int64    `json:"first_batch_bytes_per_rank"`
	FirstBatchRequests  int64    `json:"first_batch_requests_per_rank"`
	Method              string   `json:"method"`
	PlannedNodes        []int    `json:"planned_nodes"`
	Assumptions         []string `json:"assumptions"`
	ComputeSeconds      float64  `json:"compute_seconds"`
	ComputePeakHeapByte int64    `json:"compute_heap_bytes"`
}

// planBytes formats n bytes in decimal units with three significant digits.
func planBytes(n int64) string {
	v := float64(n)
	for _, u := range []string{"B", "kB", "MB", "GB", "TB", "PB"} {
		if math.Abs(v) < 999.5 || u == "PB" {
			if u == "B" {
				return fmt.Sprintf("%d B", n)
			}
			return fmt.Sprintf("%.3g %s", v, u)
		}
		v /= 1000
	}
	return ""
}

func (r *planReport) write(w io.Writer) error {
	var b strings.Builder
	gb := planBytes
	fmt.Fprintf(&b, "plan: %d shards, %d samples, %s; %d nodes x %d ranks = %d ranks, batches of %d\n",
		r.Shards, r.Samples, gb(r.DatasetBytes), r.Nodes, r.RanksPerNode, r.World, r.BatchSize)
	fmt.Fprintf(&b, "  method: %s\n", r.Method)
	fmt.Fprintf(&b, "  per rank: %d batches (%d samples) an epoch; %d samples of the epoch read by no rank\n", r.BatchesPerRank, r.SamplesPerRank, r.DroppedPerEpoch)
	fmt.Fprintf(&b, "  per node and epoch: %s read (%s to %s over the planned nodes), %d requests (%d to %d; %d reading each span as one stream after its first part), %d spans of %d shards\n",
		gb(r.BytesPerNode), gb(r.BytesPerNodeMin), gb(r.BytesPerNodeMax), r.RequestsPerNode, r.RequestsPerNodeMin, r.RequestsPerNodeMax, r.SingleRequestsPerNode, r.SpansPerNode, r.ShardsPerNode)
	fmt.Fprintf(&b, "  per job and epoch: %s read (%.2fx the dataset), %d requests\n", gb(r.BytesPerJob), r.ReadAmplification, r.RequestsPerJob)
	prefixes := "one prefix"
	if r.Prefixes > 1 {
		prefixes = fmt.Sprintf("%d prefixes, the busiest", r.Prefixes)
	}
	fmt.Fprintf(&b, "  GET rate per prefix (%s): %.0f/s at the epoch's start (%d requests at once; %.0f/s with the ranks' start spread over %.2fs more), %.0f/s on average over an epoch of %.0fs",
		prefixes, r.PeakGetRatePerPrefix, r.StartRequestsPerJob, r.PeakGetRatePerPrefixSpread, r.StartSpreadSeconds, r.MeanGetRatePerPrefix, r.EpochSeconds)
	if r.OverPrefixLimit {
		fmt.Fprintf(&b, "; OVER the store's limit per prefix: expect 503 SlowDown (%d hashed prefixes or more: gen --prefixes, a {hash:P} pattern; or fewer --open-shards)", r.PrefixesNeeded)
	}
	if r.Prefixes > 1 {
		need := "one prefix keeps both under the limit"
		if r.PrefixesNeeded > 1 {
			need = fmt.Sprintf("%d prefixes or more keep both under the limit", r.PrefixesNeeded)
		}
		fmt.Fprintf(&b, "\n  prefixes, before and after: under one prefix %.0f/s at the epoch's start, %.0f/s on average; over %d prefixes %.0f/s and %.0f/s (the busiest, %.2f%% of the shards); %s",
			r.PeakGetRateOnePrefix, r.MeanGetRateOnePrefix, r.Prefixes, r.PeakGetRatePerPrefix, r.MeanGetRatePerPrefix, 100*r.PrefixBusiestShare, need)
	}
	fmt.Fprintf(&b, "\n  index: %s in memory in every process, %s as a file; %.2fs to load (%s)\n",
		gb(r.IndexBytesPerProcess), gb(r.IndexFileBytes), r.IndexLoadSeconds, r.IndexLoad)
	if r.IndexAddressable {
		fmt.Fprintf(&b, "  index reads: %s of it read whole by each node (%d GET at the start, shared by its ranks); a process reading it itself reads %s (%.1f GETs: counts and its plan's blocks) and holds %s, not the %s of every offset\n",
			gb(r.IndexReadBytesPerNode), r.IndexGetsPerNodeAtStart, gb(r.IndexReadBytesPerProcess), r.IndexGetsPerProcess, gb(r.IndexBytesPerProcess), gb(r.IndexBytesWhole))
	} else {
		fmt.Fprintf(&b, "  index reads: an index of an earlier format, read whole: by each node once (%d GET at the start) with its index store or cache, else by every process\n", r.IndexGetsPerNodeAtStart)
	}
	fmt.Fprintf(&b, "  a rank's plan: %.3fs (median, measured here)\n", r.PlanSecondsPerRank)
	if r.CacheBytes > 0 {
		affinity := "each node keeps its shards from epoch to epoch"
		switch {
		case r.Nodes == 1:
			affinity = "one node"
		case !r.NodeAffinity:
			affinity = "shards dealt to nodes afresh each epoch"
		}
		for _, name := range []string{"order", "lru"} {
			f, ok := r.CachePolicies[name]
			if !ok {
				continue
			}
			fmt.Fprintf(&b, "  node cache of %s, policy %s (%s): hit rate by epoch", gb(r.CacheBytes), name, affinity)
			for i, h := range f.HitRate {
				fmt.Fprintf(&b, " %.2f%% (%s from the store)", 100*h, gb(f.StoreBytesPerNode[i]))
			}
			fmt.Fprintf(&b, "; mean %.2f%%\n", 100*f.HitRateMean)
		}
	} else {
		fmt.Fprintf(&b, "  node cache: none (--cache-bytes)\n")
	}
	fmt.Fprintf(&b, "  first batch: %.2fs (%s and %d requests per rank before it; %.2fs of it getting the index object to the nodes)\n", r.FirstBatchSeconds, gb(r.FirstBatchBytes), r.FirstBatchRequests, r.IndexFetchSeconds)
	fmt.Fprintf(&b, "  assumptions:\n")
	for _, a := range r.Assumptions {
		fmt.Fprintf(&b, "    - %s\n", a)
	}
	fmt.Fprintf(&b, "  computed in %.1fs\n", r.ComputeSeconds)
	_, err := io.WriteString(w, b.String())
	return err
}
