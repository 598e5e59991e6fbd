package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"runtime"
	"sort"
	"strings"
	"sync"
	"time"
	"unsafe"

	"github.com/spf13/pflag"

	"github.com/shardload/shardload"
	"github.com/shardload/shardload/index"
	"github.com/shardload/shardload/plan"
	"github.com/shardload/shardload/shard"
	"github.com/shardload/shardload/source"
	"github.com/shardload/shardload/source/all"
)

var planCommand = command{
	name:  "plan",
	short: "what a job will cost, before it runs: batches, bytes, requests, GET rates, index memory, cache hits",
	args:  "",
	summary: `Compute, without reading any shard, what a job of --nodes nodes of --ranks-per-node
ranks will cost: batches per rank, bytes and requests per node per epoch, GET requests
per second per key prefix at the epoch's start and on average, the index's memory and
load time in each process, the node cache's hit rate across epochs, and the time to
the first batch. The dataset is an index (--index, from "shardload index") or a
synthetic description (--shards, --samples-per-shard, --sample-bytes, --prefixes).

The plans are the loader's own (the order and each rank's part of it, with the same
settings): the ranks of --sample-nodes nodes, spread over the job, are planned in
full, and per-node figures are their mean (exact when every node is planned); the
batches per rank are exact. Figures that need a model say so, with the model and its
inputs (latency, bandwidth, a store's GET limit per prefix) printed beside them.`,
	setup: func(fs *pflag.FlagSet) func(context.Context, []string, io.Writer, io.Writer) error {
		var o planOptions
		o.register(fs)
		return func(ctx context.Context, args []string, stdout, stderr io.Writer) error {
			if len(args) > 0 {
				return fmt.Errorf("%w: plan takes no URLs: give --index, or --shards and the synthetic dataset's flags", errUsage)
			}
			o.prefixesGiven = fs.Changed("prefixes")
			rep, err := runPlan(ctx, o)
			if err != nil {
				return err
			}
			if o.json {
				return json.NewEncoder(stdout).Encode(rep)
			}
			return rep.write(stdout)
		}
	},
}

// planOptions are plan's flags.
type planOptions struct {
	index           string
	shards          int
	samplesPerShard int
	sampleBytes     byteSize
	prefixes        int
	prefixesGiven   bool // --prefixes was given: a synthetic dataset's alone
	nodes           int
	ranksPerNode    int
	batchSize       int
	epochs          int
	stepTime        time.Duration
	cacheBytes      byteSize
	seed            uint64
	noShuffle       bool
	dropLast        bool
	openShards      int
	shuffleBuffer   int
	shuffleBytes    byteSize
	readGap         byteSize
	partSize        byteSize
	parallel        int
	sampleNodes     int
	firstByte       time.Duration
	nodeBandwidth   byteSize
	prefixLimit     float64
	json            bool
	streams         []string // --stream: a mix of indexes
	epochSamples    int64
	batching        string
}

func (o *planOptions) register(fs *pflag.FlagSet) {
	fs.StringArrayVar(&o.streams, "stream", nil, "instead of --index, a stream of a mix, repeatable: its index and weight=W, repeat=R or choose=N, e.g. --stream 'web/shardload.index weight=0.7' (see bench --stream)")
	fs.Int64Var(&o.epochSamples, "epoch-samples", 0, "samples in each epoch of a mix of streams (0: what the streams give)")
	fs.StringVar(&o.batching, "batching", "random", "how a mix's batches are made: random, stratified or per_stream")
	fs.StringVar(&o.index, "index", "", "the dataset's index (a path or URL, from \"shardload index\"); without it, the synthetic dataset of --shards")
	fs.IntVar(&o.shards, "shards", 0, "synthetic dataset: number of shards")
	fs.IntVar(&o.samplesPerShard, "samples-per-shard", 1000, "synthetic dataset: samples per shard")
	o.sampleBytes = 100 << 10
	fs.Var(&o.sampleBytes, "sample-bytes", "synthetic dataset: stored bytes per sample, tar headers included")
	fs.IntVar(&o.prefixes, "prefixes", 1, fmt.Sprintf("synthetic dataset: hashed key prefixes the shards are spread over (S3 scales GET requests per prefix), as gen --prefixes writes them (at most %d); an index's prefixes are its URLs' directories", shard.MaxHashPrefixes))
	fs.IntVar(&o.nodes, "nodes", 1, "nodes of the job")
	fs.IntVar(&o.ranksPerNode, "ranks-per-node", 8, "ranks (trainer processes, GPUs) per node")
	fs.IntVar(&o.batchSize, "batch-size", 32, "samples per batch")
	fs.IntVar(&o.epochs, "epochs", 1, "epochs, for the cache's hit rate across them")
	fs.DurationVar(&o.stepTime, "step-time", 100*time.Millisecond, "the trainer's step: an epoch lasts batches per rank times this (the mean GET rate)")
	fs.Var(&o.cacheBytes, "cache-bytes", "the node cache's disk budget (0: no cache)")
	fs.Uint64Var(&o.seed, "seed", 0, "the order's seed")
	fs.BoolVar(&o.noShuffle, "no-shuffle", false, "plan without shuffling")
	fs.BoolVar(&o.dropLast, "drop-last", false, "drop each rank's last partial batch")
	fs.IntVar(&o.openShards, "open-shards", shardload.DefaultOpenShards, "lanes of the order: shards each rank reads side by side")
	fs.IntVar(&o.shuffleBuffer, "shuffle-buffer", shardload.DefaultShuffleBuffer, "samples the shuffle holds (windows of half as many)")
	o.shuffleBytes = shardload.DefaultShuffleBytes
	fs.Var(&o.shuffleBytes, "shuffle-bytes", "bytes the shuffle holds")
	fs.Var(&o.readGap, "read-gap", "samples between two wanted runs of a shard read and dropped when they take at most this (0: the source's request cost, as the loader's default)")
	o.partSize = source.DefaultPartSize
	fs.Var(&o.partSize, "fetch-part-size", "remote objects are read as ranged parts of this size (one GET each)")
	fs.IntVar(&o.parallel, "fetch-parallel", source.DefaultParallel, "ranged parts in flight per shard")
	fs.IntVar(&o.sampleNodes, "sample-nodes", 0, "nodes whose ranks are planned in full, spread over the job (all of them when fewer; 0: up to 8, fewer where each rank's plan is large: about 25 million shards and samples planned in all)")
	fs.DurationVar(&o.firstByte, "first-byte", 50*time.Millisecond, "model: a request's time to first byte")
	o.nodeBandwidth = 1250 << 20
	fs.Var(&o.nodeBandwidth, "node-bandwidth", "model: bytes per second a node reads from the store, shared by its ranks")
	fs.Float64Var(&o.prefixLimit, "prefix-get-limit", 5500, "model: GET requests per second a prefix serves before the store answers 503 SlowDown (S3: 5,500)")
	fs.BoolVar(&o.json, "json", false, "print one JSON object instead of the report")
}

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

	CacheBytes          int64     `json:"cache_bytes"`
	CacheHitRate        []float64 `json:"cache_hit_rate"` // per epoch, across epochs
	CacheHitRateMean    float64   `json:"cache_hit_rate_mean"`
	StoreBytesPerNode   []int64   `json:"store_bytes_per_node"` // per epoch, with the cache
	FirstBatchSeconds   float64   `json:"first_batch_seconds"`
	FirstBatchBytes     int64     `json:"first_batch_bytes_per_rank"`
	FirstBatchRequests  int64     `json:"first_batch_requests_per_rank"`
	Method              string    `json:"method"`
	PlannedNodes        []int     `json:"planned_nodes"`
	Assumptions         []string  `json:"assumptions"`
	ComputeSeconds      float64   `json:"compute_seconds"`
	ComputePeakHeapByte int64     `json:"compute_heap_bytes"`
}

// planCheck refuses flags out of range.
func (o planOptions) check() error {
	var bad []string
	if o.index == "" && o.shards <= 0 && len(o.streams) == 0 {
		bad = append(bad, "give --index (or --stream), or --shards N for a synthetic dataset")
	}
	if o.index != "" && o.shards > 0 {
		bad = append(bad, "--index and --shards: give one")
	}
	if o.prefixesGiven && (o.index != "" || len(o.streams) > 0) {
		bad = append(bad, "--prefixes describes a synthetic dataset: an index's shards are in the key prefixes their URLs name")
	}
	if o.prefixes > shard.MaxHashPrefixes {
		bad = append(bad, fmt.Sprintf("--prefixes %d: at most %d", o.prefixes, shard.MaxHashPrefixes))
	}
	if o.index == "" && (o.samplesPerShard <= 0 || o.sampleBytes <= 0) {
		bad = append(bad, "--samples-per-shard and --sample-bytes must be more than 0")
	}
	for _, f := range []struct {
		name string
		v    int
	}{{"--nodes", o.nodes}, {"--ranks-per-node", o.ranksPerNode}, {"--batch-size", o.batchSize}, {"--epochs", o.epochs},
		{"--prefixes", o.prefixes}, {"--open-shards", o.openShards}, {"--shuffle-buffer", o.shuffleBuffer},
		{"--fetch-parallel", o.parallel}} {
		if f.v < 1 {
			bad = append(bad, fmt.Sprintf("%s %d: want at least 1", f.name, f.v))
		}
	}
	if o.sampleNodes < 0 {
		bad = append(bad, fmt.Sprintf("--sample-nodes %d: want 0 (auto) or more", o.sampleNodes))
	}
	if o.nodes > 0 && o.ranksPerNode > 0 && int64(o.nodes)*int64(o.ranksPerNode) > plan.MaxWorld {
		bad = append(bad, fmt.Sprintf("--nodes x --ranks-per-node: at most %d ranks", plan.MaxWorld))
	}
	if o.partSize <= 0 || o.shuffleBytes <= 0 || o.nodeBandwidth <= 0 || o.cacheBytes < 0 || o.readGap < 0 || o.stepTime < 0 || o.firstByte < 0 || !(o.prefixLimit > 0) {
		bad = append(bad, "sizes, times and limits must not be negative (--fetch-part-size, --shuffle-bytes, --node-bandwidth and --prefix-get-limit more than 0)")
	}
	if len(bad) > 0 {
		return fmt.Errorf("%w: %s", errUsage, strings.Join(bad, "; "))
	}
	return nil
}

// synthetic returns the shards of the synthetic dataset: --shards shards of
// --samples-per-shard samples of --sample-bytes each (rounded up to tar blocks), with their offsets (one slice
// shared by every shard: a real index holds one per shard, counted as such), spread
// over --prefixes hashed key prefixes as gen --prefixes writes them (each in the
// directory shard.HashPrefix gives its name; directly in the bucket for one).
func (o planOptions) synthetic() []shard.Info {
	stride := (int64(o.sampleBytes) + 511) / 512 * 512 // tar members end on 512-byte blocks
	offs := make([]int64, o.samplesPerShard)
	for i := range offs {
		offs[i] = int64(i) * stride
	}
	size := int64(o.samplesPerShard)*stride + 1024 // the tar's end blocks
	infos := make([]shard.Info, o.shards)
	for i := range infos {
		name := fmt.Sprintf("train-%07d.tar", i)
		if o.prefixes > 1 {
			name = shard.HashPrefix(name, o.prefixes) + "/" + name
		}
		infos[i] = shard.Info{URL: "s3://bucket/" + name, Version: `"0123456789abcdef0123456789abcdef"`,
			Size: size, Samples: o.samplesPerShard, Offsets: offs}
	}
	return infos
}

// indexMemory returns the bytes the entries of infos take in a process that read
// them (index.Read: a shard.Info each, its strings and its offsets).
func indexMemory(infos []shard.Info) int64 {
	var n int64
	for _, in := range infos {
		n += int64(unsafe.Sizeof(in)) + int64(len(in.URL)+len(in.Version)) + 8*int64(in.Samples)
	}
	return n
}

// indexModel is what a loader's process holds and reads of the dataset's index: of
// an addressable one (index.WriteAddressable) the start and the counts of every
// shard (index.Lookup.Quick), then the blocks holding the offsets of the shards its
// plan reads (index.Plan); one of an earlier format, whole.
type indexModel struct {
	addressable bool
	layout      index.Layout
	entries     int64 // every shard's entry without its offsets
}

// entryBytes is the memory of one shard's entry without its offsets: its
// shard.Info, the strings of its URL and version, and its ordinal in the index (an
// int32) until its offsets are read.
func entryBytes(in shard.Info) int64 {
	return int64(unsafe.Sizeof(in)) + int64(len(in.URL)+len(in.Version)) + 4
}

// newIndexModel models the index of infos: the one at path as it is (its table
// read: its parts' sizes exact), or for a synthetic dataset or a mix (path "") the
// addressable index "shardload index" writes, its compression measured on a
// sample of the shards, as measureIndexLoad does, and its blocks laid out as
// index.WriteAddressable lays out the shards.
func newIndexModel(ctx context.Context, reg *source.Registry, path string, infos []shard.Info, synthetic bool) (indexModel, error) {
	m := indexModel{addressable: true}
	for _, in := range infos {
		m.entries += entryBytes(in)
	}
	if path != "" {
		body, err := reg.Open(ctx, path)
		if err != nil {
			return m, err
		}
		defer body.Close()
		l, ok, err := index.ReadLayout(body, path)
		m.addressable, m.layout = ok, l
		return m, err
	}
	sample := planSample(infos, synthetic)
	n := len(sample)
	var buf bytes.Buffer
	if err := index.WriteAddressable(&buf, sample); err != nil {
		return m, err
	}
	sl, _, err := index.ReadLayout(&buf, "plan")
	if err != nil {
		return m, err
	}
	var raw, packed int64
	for k, first := range sl.First {
		raw += index.RawBlockBytes(sample, first, blockEnd(sl.First, k, n))
		packed += sl.Blocks[k]
	}
	ratio := float64(packed) / float64(max(raw, 1))
	first := index.BlockStarts(infos)
	m.layout = index.Layout{First: first, Counts: sl.Counts * int64(len(infos)) / int64(max(n, 1)),
		Head: sl.Head + 16*int64(len(first)-len(sl.First))} // 16 bytes a block in the table
	for k, f := range first {
		m.layout.Blocks = append(m.layout.Blocks, int64(float64(index.RawBlockBytes(infos, f, blockEnd(first, k, len(infos))))*ratio))
	}
	return m, nil
}

// blockEnd returns the shard after the last of block k of a layout whose blocks
// start at first, of n shards.
func blockEnd(first []int, k, n int) int {
	if k+1 < len(first) {
		return first[k+1]
	}
	return n
}

// partShards returns the shards that p reads in part, whose offsets a loader reads
// from the index and holds (index.Plan): a shard p reads whole needs none.
func partShards(p *plan.Plan, infos []shard.Info) []int {
	var part []int
	for s, in := range p.InPart(infos) {
		if in {
			part = append(part, s)
		}
	}
	return part
}

// rank returns what the process of a rank whose plan reads shards in part (shards)
// holds and reads of the index: the bytes of those shards' offsets, and the bytes
// and GETs of its reads of the index object when it reads it itself.
func (m indexModel) rank(infos []shard.Info, shards []int, file int64) (offsets, read, gets int64) {
	if !m.addressable {
		return 0, file, 1
	}
	blocks := map[int]bool{}
	for _, s := range shards {
		if infos[s].Version == "" {
			continue // no offsets read for an entry without a version
		}
		offsets += 8 * int64(len(infos[s].Offsets))
		blocks[m.layout.Block(s)] = true
	}
	read = m.layout.Head + m.layout.Counts
	for k := range blocks {
		read += m.layout.Blocks[k]
	}
	return offsets, read, 1 + int64(len(blocks))
}

// measureIndexLoad writes a sample of infos (a synthetic dataset's, planSample) as
// the index "shardload index" writes (addressable, zstd) and returns the bytes of the
// whole index and the CPU seconds a loader's process takes to load it before it
// plans (lazyLoadSeconds), both scaled from the sample by the shards.
func measureIndexLoad(ctx context.Context, infos []shard.Info) (fileBytes int64, seconds float64, err error) {
	sample := planSample(infos, true)
	var buf bytes.Buffer
	if err := index.WriteAddressable(&buf, sample); err != nil {
		return 0, 0, err
	}
	if seconds, err = lazyLoadSeconds(ctx, buf.Bytes(), sample); err != nil {
		return 0, 0, err
	}
	scale := float64(len(infos)) / float64(len(sample))
	return int64(float64(buf.Len()) * scale), seconds * scale, nil
}

// planSample returns up to 20,000 of infos, spread over them. With jitter (a
// synthetic dataset, whose samples all take --sample-bytes) each sample of the
// sample's shards takes 0.9 to 1.1 times that, in whole tar blocks, as real samples
// vary: their offsets then compress as a real index's do, not as an arithmetic
// sequence.
func planSample(infos []shard.Info, jitter bool) []shard.Info {
	n := min(len(infos), 20000)
	sample := make([]shard.Info, n)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range sample {
		in := infos[i*len(infos)/n]
		if jitter && len(in.Offsets) > 1 {
			stride := in.Offsets[1] - in.Offsets[0]
			offs := make([]int64, len(in.Offsets))
			for k := 1; k < len(offs); k++ {
				offs[k] = offs[k-1] + (stride*int64(90+rng.IntN(21))/100+511)/512*512
			}
			in.Offsets, in.Size = offs, offs[len(offs)-1]+stride+1024
		}
		sample[i] = in
	}
	return sample
}

// planBudget is about the shards and samples plan plans in all, by default.
const planBudget = 25e6

// plannedNodes returns k nodes of n spread over the job: all when k >= n, else the
// first, the last and evenly spaced ones between.
func plannedNodes(n, k int) []int {
	if k >= n {
		out := make([]int, n)
		for i := range out {
			out[i] = i
		}
		return out
	}
	out := make([]int, 0, k)
	for i := range k {
		node := i * (n - 1) / max(k-1, 1)
		if len(out) == 0 || out[len(out)-1] != node {
			out = append(out, node)
		}
	}
	return out
}

// nodeCost is what the ranks of one node read in an epoch.
type nodeCost struct {
	bytes, requests, single, spans, start int64
	shards                                map[int]bool
	firstBytes, firstRequests             int64 // the most of its ranks
	planSeconds                           []float64
	batches, samples, dropped             int
	// The index: its ranks' offsets in memory (the most of them), and their reads of
	// the index object, summed.
	indexOffsets, indexRead, indexGets int64
}

// readPlanIndex reads the index at path (a path or URL): its shards, the bytes read
// and the seconds a loader's process takes to load it (an addressable index's
// counts alone, as Lookup.Quick reads them: lazyLoadSeconds; an index of an earlier
// format read whole).
func readPlanIndex(ctx context.Context, reg *source.Registry, path string) ([]shard.Info, int64, float64, error) {
	body, err := reg.Open(ctx, path)
	if err != nil {
		return nil, 0, 0, err
	}
	data, err := io.ReadAll(body)
	body.Close()
	if err != nil {
		return nil, 0, 0, err
	}
	t0 := time.Now()
	infos, err := index.Read(bytes.NewReader(data), path)
	secs := time.Since(t0).Seconds()
	if err == nil && len(infos) == 0 {
		err = fmt.Errorf("the index %s has no shards", path)
	}
	if err != nil {
		return nil, 0, 0, err
	}
	if _, ok, _ := index.ReadLayout(bytes.NewReader(data), path); ok {
		if secs, err = lazyLoadSeconds(ctx, data, infos); err != nil {
			return nil, 0, 0, err
		}
	}
	return infos, int64(len(data)), secs, nil
}

// memIndex serves one index object from memory, and the Stat of the shards it
// holds as it holds them, for lazyLoadSeconds: the lookup reads no shard.
type memIndex struct {
	data   []byte
	shards map[string]shard.Info
}

func (m memIndex) Stat(_ context.Context, url string) (source.Info, error) {
	if source.Scheme(url) == "planindex" {
		return source.Info{URL: url, Size: int64(len(m.data)), Version: "1"}, nil
	}
	in, ok := m.shards[url]
	if !ok {
		return source.Info{}, fmt.Errorf("%w: %s", source.ErrNotFound, url)
	}
	return source.Info{URL: url, Size: in.Size, Version: in.Version}, nil
}

func (m memIndex) Open(_ context.Context, url string) (io.ReadCloser, error) {
	if source.Scheme(url) != "planindex" {
		return nil, fmt.Errorf("plan reads no shard: %s", url)
	}
	return io.NopCloser(bytes.NewReader(m.data)), nil
}

// lazyLoadSeconds returns the CPU seconds a loader's process takes to read the
// addressable index data of infos as it does before it plans (index.Lookup.Quick
// with LazyOffsets: its counts, the entries trusted, as a loader trusts more than a
// thousand remote ones): the least of three reads, collections aside.
func lazyLoadSeconds(ctx context.Context, data []byte, infos []shard.Info) (float64, error) {
	m := memIndex{data: data, shards: make(map[string]shard.Info, len(infos))}
	reg := &source.Registry{}
	reg.Register("planindex", m)
	urls := make([]string, len(infos))
	for i, in := range infos {
		urls[i] = in.URL
		m.shards[in.URL] = in
		reg.Register(source.Scheme(in.URL), m)
	}
	lk := index.Lookup{Sources: reg, Index: "planindex://index", NoBeside: true, LazyOffsets: true, CheckUpTo: 1}
	best := math.Inf(1)
	for range 3 {
		t0 := cpuTime()
		if _, err := lk.Quick(ctx, urls, 1); err != nil {
			return 0, fmt.Errorf("reading the index as a loader does: %w", err)
		}
		best = min(best, (cpuTime() - t0).Seconds())
	}
	return best, nil
}

func runPlan(ctx context.Context, o planOptions) (*planReport, error) {
	if err := o.check(); err != nil {
		return nil, err
	}
	start := time.Now()
	rep := &planReport{Nodes: o.nodes, RanksPerNode: o.ranksPerNode, World: o.nodes * o.ranksPerNode, BatchSize: o.batchSize}
	var infos []shard.Info
	var mix *plan.Mix
	reg := &source.Registry{}
	all.RegisterDefaults(reg, source.FetchOptions{})
	if len(o.streams) > 0 {
		if o.index != "" {
			return nil, fmt.Errorf("%w: give --index or --stream, not both", errUsage)
		}
		mix = &plan.Mix{Samples: o.epochSamples}
		var err error
		if mix.Batching, err = plan.ParseBatching(o.batching); err != nil {
			return nil, fmt.Errorf("%w: --batching: %v", errUsage, err)
		}
		for _, spec := range o.streams {
			st, err := parseStream(spec)
			if err != nil || len(st.URLs) != 1 {
				return nil, fmt.Errorf("%w: --stream %q: want an index and weight=W, repeat=R or choose=N (%v)", errUsage, spec, err)
			}
			got, n, secs, err := readPlanIndex(ctx, reg, st.URLs[0])
			if err != nil {
				return nil, err
			}
			mix.Streams = append(mix.Streams, plan.Stream{First: len(infos), Count: len(got), Weight: st.Weight, Repeat: st.Repeat, Choose: st.Choose})
			infos = append(infos, got...)
			rep.IndexFileBytes += n
			rep.IndexLoadSeconds += secs
		}
		rep.IndexLoad = "measured: this process read the streams' indexes as a loader does (an addressable one's counts)"
	}
	if mix != nil {
		if o.readGap == 0 {
			o.readGap = byteSize(source.RequestCostOf(reg, infos[0].URL))
		}
	} else if o.index != "" {
		var err error
		if infos, rep.IndexFileBytes, rep.IndexLoadSeconds, err = readPlanIndex(ctx, reg, o.index); err != nil {
			return nil, err
		}
		rep.IndexLoad = "measured: this process read the index as a loader does (an addressable one's counts)"
		if o.readGap == 0 {
			o.readGap = byteSize(source.RequestCostOf(reg, infos[0].URL))
		}
	} else {
		infos = o.synthetic()
		var err error
		if rep.IndexFileBytes, rep.IndexLoadSeconds, err = measureIndexLoad(ctx, infos); err != nil {
			return nil, err
		}
		rep.IndexLoad = "extrapolated from reading, as a loader does, the index of a sample of the shards (their samples' sizes varied by a tenth) here"
		if o.readGap == 0 {
			o.readGap = source.RemoteRequestCost
		}
	}
	rep.Shards = len(infos)
	rep.Prefixes, rep.PrefixBusiestShare = keyPrefixes(infos)
	for _, in := range infos {
		rep.Samples += int64(in.Samples)
		rep.DatasetBytes += in.Size
	}
	rep.IndexBytesWhole = indexMemory(infos)
	im, err := newIndexModel(ctx, reg, o.index, infos, o.index == "" && mix == nil)
	if err != nil {
		return nil, err
	}
	rep.IndexAddressable = im.addressable
	if mix != nil {
		n, err := mix.Len(infos, o.batchSize)
		if err != nil {
			return nil, err
		}
		rep.Samples = n // the mixed epoch's
	}

	cfg := plan.Config{Seed: o.seed, World: rep.World, Shuffle: !o.noShuffle, BatchSize: o.batchSize, DropLast: o.dropLast, GapBytes: int64(o.readGap), Mix: mix}
	if cfg.Shuffle {
		cfg.Lanes, cfg.Window = o.openShards, plan.WindowSize(o.shuffleBuffer, int64(o.shuffleBytes), infos)
	}
	// Local files are read a span at a time, whole: one request each.
	partSize := int64(o.partSize)
	if source.Scheme(infos[0].URL) == "file" {
		partSize = math.MaxInt64
	}
	k := o.sampleNodes
	if k == 0 {
		// A rank's plan costs about its order (a shuffle of every shard) and its part
		// of the samples: as many nodes as a budget of both allows, 1 to 8.
		perRank := float64(len(infos)) + float64(rep.Samples)/float64(rep.World)
		k = int(min(8, max(1, planBudget/(perRank*float64(o.ranksPerNode)))))
	}
	// A node whose ranks' plans alone are over the budget has some of its ranks
	// planned, spread over them, and its figures scaled to all.
	locals := plannedNodes(o.ranksPerNode, o.ranksPerNode)
	if o.sampleNodes == 0 {
		perRank := float64(len(infos)) + float64(rep.Samples)/float64(rep.World)
		locals = plannedNodes(o.ranksPerNode, int(min(float64(o.ranksPerNode), max(2, planBudget/perRank))))
	}
	nodes := plannedNodes(o.nodes, k)
	rep.PlannedNodes = nodes
	costs := make([]nodeCost, len(nodes))
	// The ranks of the planned nodes, a few at once: each plan builds the epoch's
	// order (a few bytes per shard) and the rank's part.
	type job struct{ node, local int }
	jobs := make(chan job)
	errs := make(chan error, 1)
	var mu sync.Mutex
	var wg sync.WaitGroup
	workers := max(1, min(runtime.GOMAXPROCS(0), 4))
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range jobs {
				c := cfg
				c.Rank = nodes[j.node]*o.ranksPerNode + j.local
				t0 := time.Now()
				p, err := plan.New(infos, c)
				secs := time.Since(t0).Seconds()
				if err != nil {
					select {
					case errs <- err:
					default:
					}
					continue
				}
				rc := plan.CostOf(&p, infos, o.batchSize, partSize, o.parallel, o.openShards)
				mu.Lock()
				nc := &costs[j.node]
				if nc.shards == nil {
					nc.shards = map[int]bool{}
				}
				nc.bytes += rc.Bytes
				nc.requests += rc.Requests
				nc.single += rc.SingleRequests
				nc.spans += int64(rc.Spans)
				nc.start += rc.StartRequests
				for _, s := range rc.Shards {
					nc.shards[s] = true
				}
				nc.firstBytes = max(nc.firstBytes, rc.FirstBatchBytes)
				nc.firstRequests = max(nc.firstRequests, rc.FirstBatchRequests)
				nc.planSeconds = append(nc.planSeconds, secs)
				offs, read, gets := im.rank(infos, partShards(&p, infos), rep.IndexFileBytes)
				nc.indexOffsets = max(nc.indexOffsets, offs)
				nc.indexRead += read
				nc.indexGets += gets
				nc.batches, nc.samples, nc.dropped = p.Batches, p.Samples, p.Dropped
				mu.Unlock()
			}
		}()
	}
feed:
	for n := range nodes {
		for _, r := range locals {
			select {
			case jobs <- job{n, r}:
			case <-ctx.Done():
				break feed
			}
		}
	}
	close(jobs)
	wg.Wait()
	select {
	case err := <-errs:
		return nil, err
	default:
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}

	// Per node: the mean of the planned nodes.
	var planSecs []float64
	rep.BytesPerNodeMin, rep.RequestsPerNodeMin = math.MaxInt64, math.MaxInt64
	var shardsPerNode, starts, indexOffsets, indexRead, indexGets int64
	for _, nc := range costs {
		indexOffsets = max(indexOffsets, nc.indexOffsets)
		indexRead += nc.indexRead
		indexGets += nc.indexGets
		rep.BytesPerNode += nc.bytes
		rep.BytesPerNodeMin = min(rep.BytesPerNodeMin, nc.bytes)
		rep.BytesPerNodeMax = max(rep.BytesPerNodeMax, nc.bytes)
		rep.RequestsPerNode += nc.requests
		rep.RequestsPerNodeMin = min(rep.RequestsPerNodeMin, nc.requests)
		rep.RequestsPerNodeMax = max(rep.RequestsPerNodeMax, nc.requests)
		rep.SingleRequestsPerNode += nc.single
		rep.SpansPerNode += nc.spans
		shardsPerNode += int64(len(nc.shards))
		starts += nc.start
		rep.FirstBatchBytes = max(rep.FirstBatchBytes, nc.firstBytes)
		rep.FirstBatchRequests = max(rep.FirstBatchRequests, nc.firstRequests)
		planSecs = append(planSecs, nc.planSeconds...)
		rep.BatchesPerRank, rep.SamplesPerRank, rep.DroppedPerEpoch = nc.batches, nc.samples, nc.dropped
	}
	planned := int64(len(costs))
	ranks := planned * int64(len(locals))
	rep.IndexBytesPerProcess = rep.IndexBytesWhole
	if im.addressable {
		rep.IndexBytesPerProcess = im.entries + indexOffsets
	}
	rep.IndexReadBytesPerProcess = indexRead / ranks
	rep.IndexGetsPerProcess = float64(indexGets) / float64(ranks)
	rep.IndexReadBytesPerNode, rep.IndexGetsPerNodeAtStart = rep.IndexFileBytes, 1
	if im.addressable {
		rep.IndexReadBytesPerNode = im.layout.Size()
	}
	// Scaled from the ranks planned of each node to all of them.
	scale := func(n int64) int64 { return n * int64(o.ranksPerNode) / int64(len(locals)) }
	rep.BytesPerNode = scale(rep.BytesPerNode / planned)
	rep.BytesPerNodeMin, rep.BytesPerNodeMax = scale(rep.BytesPerNodeMin), scale(rep.BytesPerNodeMax)
	rep.RequestsPerNode = scale(rep.RequestsPerNode / planned)
	rep.RequestsPerNodeMin, rep.RequestsPerNodeMax = scale(rep.RequestsPerNodeMin), scale(rep.RequestsPerNodeMax)
	rep.SingleRequestsPerNode = scale(rep.SingleRequestsPerNode / planned)
	rep.SpansPerNode = scale(rep.SpansPerNode / planned)
	rep.ShardsPerNode = min(scale(shardsPerNode/planned), int64(len(infos)))
	starts = scale(starts)
	rep.BytesPerJob = rep.BytesPerNode * int64(o.nodes)
	rep.RequestsPerJob = rep.RequestsPerNode * int64(o.nodes)
	rep.StartRequestsPerJob = starts * int64(o.nodes) / planned
	if rep.DatasetBytes > 0 {
		rep.ReadAmplification = float64(rep.BytesPerJob) / float64(rep.DatasetBytes)
	}
	sort.Float64s(planSecs)
	rep.PlanSecondsPerRank = planSecs[len(planSecs)/2]
	switch {
	case len(locals) < o.ranksPerNode:
		rep.Method = fmt.Sprintf("sampled: %d of the %d ranks of each of %d of the %d nodes planned in full (a rank's plan is large), their figures scaled to the node's ranks; the job's are the mean times %d; batches per rank are exact",
			len(locals), o.ranksPerNode, len(nodes), o.nodes, o.nodes)
	case len(nodes) == o.nodes:
		rep.Method = fmt.Sprintf("exact: every rank of the %d nodes planned", o.nodes)
	default:
		rep.Method = fmt.Sprintf("sampled: the %d ranks of each of %d of the %d nodes planned in full; per-node figures are their mean (min and max beside the bytes and requests), the job's are the mean times %d; batches per rank are exact",
			o.ranksPerNode, len(nodes), o.nodes, o.nodes)
	}

	// Request rates: the epoch's first requests arrive within about a first-byte
	// time of each other; after that, the epoch's requests spread over its length.
	rep.EpochSeconds = float64(rep.BatchesPerRank) * o.stepTime.Seconds()
	window := max(o.firstByte.Seconds(), 1)
	rep.PeakGetRateOnePrefix = float64(rep.StartRequestsPerJob) / window
	rep.PeakGetRatePerPrefix = rep.PeakGetRateOnePrefix * rep.PrefixBusiestShare
	rep.StartSpreadSeconds = source.StartSpreadWindow(rep.World).Seconds()
	rep.PeakGetRatePerPrefixSpread = float64(rep.StartRequestsPerJob) / (window + rep.StartSpreadSeconds) * rep.PrefixBusiestShare
	if rep.EpochSeconds > 0 {
		rep.MeanGetRateOnePrefix = float64(rep.RequestsPerJob) / rep.EpochSeconds
		rep.MeanGetRatePerPrefix = rep.MeanGetRateOnePrefix * rep.PrefixBusiestShare
	}
	rep.OverPrefixLimit = rep.PeakGetRatePerPrefix > o.prefixLimit || rep.MeanGetRatePerPrefix > o.prefixLimit
	rep.PrefixesNeeded = int(math.Ceil(max(rep.PeakGetRateOnePrefix, rep.MeanGetRateOnePrefix, 1) / o.prefixLimit))

	// The cache: each epoch reshuffles which shards a node reads; the node reads a
	// fraction f of the shards, and its LRU holds the last cache/(f x dataset)
	// epochs' worth of them: a shard is a hit when one of those epochs read it on
	// this node, with a chance of at most the cache's share of the dataset.
	rep.CacheBytes = int64(o.cacheBytes)
	f := float64(rep.ShardsPerNode) / float64(max(rep.Shards, 1))
	nodeShardBytes := f * float64(rep.DatasetBytes)
	held := 0.0 // epochs of the node's reads the cache holds
	if nodeShardBytes > 0 {
		held = float64(o.cacheBytes) / nodeShardBytes
	}
	var sum float64
	for e := range o.epochs {
		hit := 0.0
		if o.cacheBytes > 0 && e > 0 {
			// The shards read in the epochs the cache holds, and never more than
			// the cache's share of the dataset.
			hit = min(float64(o.cacheBytes)/float64(max(rep.DatasetBytes, 1)), 1-math.Pow(1-f, min(float64(e), held)))
		}
		rep.CacheHitRate = append(rep.CacheHitRate, hit)
		sum += hit
		if o.cacheBytes > 0 {
			rep.StoreBytesPerNode = append(rep.StoreBytesPerNode, int64(nodeShardBytes*(1-hit)))
		} else {
			rep.StoreBytesPerNode = append(rep.StoreBytesPerNode, rep.BytesPerNode)
		}
	}
	rep.CacheHitRateMean = sum / float64(o.epochs)

	// Time to the first batch: the index read, the plan, then the first windows'
	// spans read at the rank's share of the node's bandwidth, after a first byte;
	// requests over a prefix's limit wait for it to drain them.
	perRank := float64(o.nodeBandwidth) / float64(o.ranksPerNode)
	if o.index == "" || source.Scheme(o.index) != "file" {
		key := 2 * float64(o.nodes) / o.prefixLimit // every node's HEAD and GET, arriving within a second
		rep.IndexFetchSeconds = 2*o.firstByte.Seconds() + float64(rep.IndexReadBytesPerNode)/float64(o.nodeBandwidth) + max(key-1, 0)
	}
	rep.FirstBatchSeconds = rep.IndexFetchSeconds + rep.IndexLoadSeconds + rep.PlanSecondsPerRank + o.firstByte.Seconds() + float64(rep.FirstBatchBytes)/perRank
	if over := rep.PeakGetRatePerPrefix * window / o.prefixLimit; over > 1 {
		rep.FirstBatchSeconds += over - 1
	}
	rep.Assumptions = []string{
		fmt.Sprintf("requests: each span (a run of a shard's samples a rank reads) as ranged GETs of --fetch-part-size %s, %d in flight (the fetcher's parallel parts; a fast store read as one stream after the first part takes requests_per_node_per_epoch_single_stream); local files one read a span", formatBytes(int64(o.partSize)), o.parallel),
		fmt.Sprintf("epoch start: every rank opens its first %d spans (--open-shards) at once; they arrive within max(--first-byte, 1s), and with the ranks' start spread within %.2fs more (derived from the rank, up to %v); over a prefix's limit, the process's adaptive rate limit paces them instead of letting them fail and retry", o.openShards, source.StartSpreadWindow(o.nodes*o.ranksPerNode).Seconds(), source.MaxStartSpread),
		fmt.Sprintf("prefixes: a shard's key prefix is its URL's directory (a synthetic dataset's: shard.HashPrefix of its name over --prefixes, as gen --prefixes writes it); requests fall on a prefix in proportion to its shards, the busiest of the %d holding %.2f%% of them; a store serves %.0f GET/s per prefix (--prefix-get-limit)", rep.Prefixes, 100*rep.PrefixBusiestShare, o.prefixLimit),
		fmt.Sprintf("steady state: the epoch's requests spread over batches per rank x --step-time %s", o.stepTime),
		"index: an addressable index (shardload index) is read lazily: every process holds every shard's entry without its offsets (shard.Info, URL, version, its ordinal) and the offsets (8 bytes a sample) of the shards its plan reads in part (none for a shard read whole), after reading the index's counts and the blocks of those shards' offsets; an index of an earlier format is held whole (index_bytes_per_process_whole). With the node's index store or cache (the default) a node GETs the index object once, whole, and its ranks read it there",
		"cache: whole shards, LRU per node; an epoch's shards fall on nodes independently of the epoch before (the order is reshuffled per epoch); a hit rate of at most --cache-bytes over the dataset",
		fmt.Sprintf("first batch: the index object fetched by each node (a HEAD and a GET a node, all on its one key, served at the prefix's limit, then the object at --node-bandwidth; none for a local index) + index load + a rank's plan (median, measured here) + --first-byte %s + the first batch's windows' bytes at the rank's share of --node-bandwidth %s/s (+ the time a prefix over its limit takes to drain the epoch's first requests)", o.firstByte, formatBytes(int64(o.nodeBandwidth))),
	}
	rep.ComputeSeconds = time.Since(start).Seconds()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	rep.ComputePeakHeapByte = int64(ms.HeapSys)
	return rep, nil
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
		fmt.Fprintf(&b, "  node cache of %s: hit rate by epoch", gb(r.CacheBytes))
		for i, h := range r.CacheHitRate {
			fmt.Fprintf(&b, " %.2f%% (%s from the store)", 100*h, gb(r.StoreBytesPerNode[i]))
		}
		fmt.Fprintf(&b, "; mean %.2f%%\n", 100*r.CacheHitRateMean)
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

// keyPrefixes returns how many key prefixes the shards are in, a prefix being the
// directory of a shard's URL (what precedes its name), and the share of the shards in
// the busiest.
func keyPrefixes(infos []shard.Info) (int, float64) {
	counts := map[string]int{}
	busiest := 0
	for _, in := range infos {
		dir := in.URL[:strings.LastIndexByte(in.URL, '/')+1]
		counts[dir]++
		busiest = max(busiest, counts[dir])
	}
	return len(counts), float64(busiest) / float64(max(len(infos), 1))
}
