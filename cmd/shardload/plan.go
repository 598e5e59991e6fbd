package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"runtime"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/spf13/pflag"

	"github.com/shardload/shardload"
	"github.com/shardload/shardload/cache"
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
	cachePolicy     string
	nodeAffinity    bool
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
	memory          byteSize
}

func (o *planOptions) register(fs *pflag.FlagSet) {
	fs.StringArrayVar(&o.streams, "stream", nil, "instead of --index, a stream of a mix, repeatable: its index and weight=W, repeat=R or choose=N, e.g. --stream 'web/shardload.index weight=0.7' (see bench --stream)")
	fs.Int64Var(&o.epochSamples, "epoch-samples", 0, "samples in each epoch of a mix of streams (0: what the streams give)")
	fs.StringVar(&o.batching, "batching", "random", "how a mix's batches are made: random, stratified or per_stream")
	fs.StringVar(&o.index, "index", "", "the dataset's index (a path or URL, from \"shardload index\"); without it, the synthetic dataset of --shards")
	fs.IntVar(&o.shards, "shards", 0, "synthetic dataset: number of shards")
	o.memory = shardload.DefaultMemory
	fs.Var(&o.memory, "memory", "each rank's --memory: bounds the windows a rank's plan may span, as the loader's does")
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
	fs.StringVar(&o.cachePolicy, "cache-policy", cache.DefaultPolicy.String(), "the cache policy of cache_hit_rate and store_bytes_per_node: order or lru (cache_policies has both)")
	fs.BoolVar(&o.nodeAffinity, "node-affinity", true, "with more than one node, plan each node keeping its shards from epoch to epoch, as the loader does (--node-affinity=false: the global reshuffle, every epoch dealing the shards to nodes afresh)")
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
	if _, err := cache.ParsePolicy(o.cachePolicy); err != nil {
		bad = append(bad, fmt.Sprintf("--cache-policy %q: want order or lru", o.cachePolicy))
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

func runPlan(ctx context.Context, o planOptions) (*planReport, error) {
	if err := o.check(); err != nil {
		return nil, err
	}
	start := time.Now()
	rep := &planReport{Nodes: o.nodes, RanksPerNode: o.ranksPerNode, World: o.nodes * o.ranksPerNode, BatchSize: o.batchSize}
	var infos []shard.Info
	var mix *plan.Mix
	var streams []shardload.Stream
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
			streams = append(streams, shardload.Stream{Shards: got, Weight: st.Weight, Repeat: st.Repeat, Choose: st.Choose})
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

	// Each rank is planned by the loader's own planning (shardload.PlanOf), from the
	// counts read here: the settings Open takes, with its defaults.
	cfg := shardload.Config{Seed: o.seed, World: rep.World, NoShuffle: o.noShuffle, BatchSize: o.batchSize, DropLast: o.dropLast,
		ReadGap: int64(o.readGap), OpenShards: o.openShards, ShuffleBuffer: o.shuffleBuffer, ShuffleBytes: int64(o.shuffleBytes),
		Memory: int64(o.memory), Sources: reg, Logf: func(string, ...any) {}, RanksPerNode: o.ranksPerNode, NoNodeAffinity: !o.nodeAffinity}
	if mix != nil {
		cfg.Streams, cfg.EpochSamples, cfg.Batching = streams, o.epochSamples, mix.Batching
	} else {
		cfg.Shards = infos
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
				p, err := shardload.PlanOf(ctx, c)
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

	// The cache: each planned node's reads over the epochs through a simulated disk
	// tier, under each policy (plancache.go).
	rep.CacheBytes = int64(o.cacheBytes)
	rep.CachePolicy = o.cachePolicy
	rep.NodeAffinity = o.nodeAffinity && o.nodes > 1 && !o.noShuffle && mix == nil
	if o.cacheBytes > 0 {
		figs, err := modelCache(ctx, cfg, infos, nodes, locals, o.ranksPerNode, o.epochs, int64(o.cacheBytes))
		if err != nil {
			return nil, err
		}
		rep.CachePolicies = map[string]cacheFigures{}
		for p, f := range figs {
			rep.CachePolicies[p.String()] = f
		}
		f := rep.CachePolicies[o.cachePolicy]
		rep.CacheHitRate, rep.CacheHitRateMean, rep.StoreBytesPerNode = f.HitRate, f.HitRateMean, f.StoreBytesPerNode
	} else {
		for range o.epochs {
			rep.CacheHitRate = append(rep.CacheHitRate, 0)
			rep.StoreBytesPerNode = append(rep.StoreBytesPerNode, rep.BytesPerNode)
		}
	}

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
		"cache: the disk tier of each planned node simulated over the epochs (its ranks' plans of each epoch, as the loader plans them: with more than one node, each node keeps its shards from epoch to epoch unless --node-affinity=false): each rank's shards in its plan's order, spaced evenly over the epoch and merged by that time; a miss of a shard a rank reads whole fetches it (its data and about 512 bytes of meta file count against --cache-bytes), one of a part of a shard the node reads whole that epoch fetches it too (the cache fetches the shard behind the range read, for the node's other reads), one of a part the node alone reads reads that part around the cache; order evicts by the next read this epoch (what the ranks announce as the epoch opens) and reads through a shard needed after everything held, lru evicts the least recently used; the hit rate is the share of the shards' bytes read served by the cache",
		fmt.Sprintf("first batch: the index object fetched by each node (a HEAD and a GET a node, all on its one key, served at the prefix's limit, then the object at --node-bandwidth; none for a local index) + index load + a rank's plan (median, measured here) + --first-byte %s + the first batch's windows' bytes at the rank's share of --node-bandwidth %s/s (+ the time a prefix over its limit takes to drain the epoch's first requests)", o.firstByte, formatBytes(int64(o.nodeBandwidth))),
	}
	rep.ComputeSeconds = time.Since(start).Seconds()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	rep.ComputePeakHeapByte = int64(ms.HeapSys)
	return rep, nil
}
