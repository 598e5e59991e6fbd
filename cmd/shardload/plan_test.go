package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/spf13/pflag"

	"github.com/shardload/shardload"
	"github.com/shardload/shardload/index"
	"github.com/shardload/shardload/internal/shardgen"
	"github.com/shardload/shardload/plan"
	"github.com/shardload/shardload/shard"
	"github.com/shardload/shardload/source"
)

// planCounter serves local files and counts the reads of shards (opens of any
// kind: a whole shard, a range, a range of one version).
type planCounter struct {
	source.File
	reads atomic.Int64
}

func (c *planCounter) count(url string) {
	if strings.HasSuffix(url, ".tar") {
		c.reads.Add(1)
	}
}

func (c *planCounter) Open(ctx context.Context, url string) (io.ReadCloser, error) {
	c.count(url)
	return c.File.Open(ctx, url)
}

func (c *planCounter) OpenRange(ctx context.Context, url string, off, n int64) (io.ReadCloser, error) {
	c.count(url)
	return c.File.OpenRange(ctx, url, off, n)
}

func (c *planCounter) OpenVersion(ctx context.Context, url, version string, off, n int64) (io.ReadCloser, error) {
	c.count(url)
	return c.File.OpenVersion(ctx, url, version, off, n)
}

func planJSON(t *testing.T, args ...string) planReport {
	t.Helper()
	code, stdout, stderr := runCLI(t, append([]string{"plan", "--json"}, args...)...)
	if code != 0 {
		t.Fatalf("plan %v: exit %d: %s", args, code, stderr)
	}
	var rep planReport
	if err := json.Unmarshal([]byte(stdout), &rep); err != nil {
		t.Fatalf("plan --json: %v: %s", err, stdout)
	}
	return rep
}

func within(got, want, frac float64) bool { return math.Abs(got-want) <= frac*math.Abs(want) }

// plan's bytes and requests per node agree with those of real bench runs of every
// rank of a small job (2 nodes of 2 ranks) over an indexed dataset, within 10%: the
// bytes and requests bench reports (the source serves those, and the reads of a
// shard's first bytes that tell its compression).
func TestPlanMatchesBench(t *testing.T) {
	dir := t.TempDir()
	spec := shardgen.Spec{Shards: 24, Samples: []int{40, 25, 33}, Seed: 4}
	if _, err := shardgen.Generate(dir, spec); err != nil {
		t.Fatal(err)
	}
	pattern := dir + "/" + spec.Pattern()
	idx := filepath.Join(t.TempDir(), "ds.index")
	if code, _, stderr := runCLI(t, "index", "--no-index-store", "--output", idx, pattern); code != 0 {
		t.Fatalf("index: exit %d: %s", code, stderr)
	}
	const nodes, perNode, batch = 2, 2, 8
	job := []string{"--batch-size", strconv.Itoa(batch), "--read-gap", "16KiB", "--seed", "5"}
	rep := planJSON(t, append([]string{"--index", idx, "--nodes", strconv.Itoa(nodes), "--ranks-per-node", strconv.Itoa(perNode)}, job...)...)
	if rep.IndexFetchSeconds != 0 {
		t.Errorf("a local index takes %.3fs to fetch, want none", rep.IndexFetchSeconds)
	}
	if !strings.HasPrefix(rep.Method, "exact") {
		t.Errorf("method %q, want exact for a job of 2 nodes", rep.Method)
	}

	var bytes, requests [nodes]int64
	var batches int64
	for rank := range nodes * perNode {
		var lf loaderFlags
		fs := pflag.NewFlagSet("bench", pflag.ContinueOnError)
		lf.register(fs, true)
		args := append([]string{"--index", idx, "--world", strconv.Itoa(nodes * perNode), "--rank", strconv.Itoa(rank), "--ranks-per-node", strconv.Itoa(perNode), "--no-index-store", "--autotune=false"}, job...)
		if err := fs.Parse(append(args, pattern)); err != nil {
			t.Fatal(err)
		}
		cfg, err := lf.config(fs.Args(), io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		src := &planCounter{}
		reg := &source.Registry{}
		reg.Register("file", src)
		cfg.Sources = reg
		res, err := bench(context.Background(), cfg, 1, 0, 0, false, 0, nil)
		if err != nil {
			t.Fatal(err)
		}
		if res.Estimated {
			t.Fatal("bench planned from estimates: the index was not used")
		}
		bytes[rank/perNode] += res.BytesIn
		requests[rank/perNode] += res.Requests
		if res.Requests == 0 || src.reads.Load() < res.Requests {
			t.Errorf("rank %d: bench reports %d requests, the source served %d", rank, res.Requests, src.reads.Load())
		}
		batches = res.Batches
	}
	if batches != int64(rep.BatchesPerRank) {
		t.Errorf("bench ran %d batches per rank, plan says %d", batches, rep.BatchesPerRank)
	}
	meanBytes := float64(bytes[0]+bytes[1]) / nodes
	meanReqs := float64(requests[0]+requests[1]) / nodes
	t.Logf("per node: bench %v bytes, %v requests; plan %d bytes (%d to %d), %d requests",
		bytes, requests, rep.BytesPerNode, rep.BytesPerNodeMin, rep.BytesPerNodeMax, rep.RequestsPerNode)
	if !within(float64(rep.BytesPerNode), meanBytes, 0.1) {
		t.Errorf("bytes per node: plan %d, bench %.0f (more than 10%% apart)", rep.BytesPerNode, meanBytes)
	}
	if !within(float64(rep.RequestsPerNode), meanReqs, 0.1) {
		t.Errorf("requests per node: plan %d, bench %.0f (more than 10%% apart)", rep.RequestsPerNode, meanReqs)
	}
	lo, hi := min(bytes[0], bytes[1]), max(bytes[0], bytes[1])
	if !within(float64(rep.BytesPerNodeMin), float64(lo), 0.1) || !within(float64(rep.BytesPerNodeMax), float64(hi), 0.1) {
		t.Errorf("bytes per node from %d to %d, bench from %d to %d", rep.BytesPerNodeMin, rep.BytesPerNodeMax, lo, hi)
	}
	rlo, rhi := min(requests[0], requests[1]), max(requests[0], requests[1])
	if !within(float64(rep.RequestsPerNodeMin), float64(rlo), 0.1) || !within(float64(rep.RequestsPerNodeMax), float64(rhi), 0.1) {
		t.Errorf("requests per node from %d to %d, bench from %d to %d", rep.RequestsPerNodeMin, rep.RequestsPerNodeMax, rlo, rhi)
	}
}

// A synthetic job too large to plan every rank of samples some nodes and says so;
// its figures follow from the dataset and the job's shape.
func TestPlanSynthetic(t *testing.T) {
	const shards, samples, sampleBytes, nodes, perNode, batch = 20000, 10, 4096, 50, 4, 16
	rep := planJSON(t, "--shards", strconv.Itoa(shards), "--samples-per-shard", strconv.Itoa(samples), "--sample-bytes", strconv.Itoa(sampleBytes),
		"--nodes", strconv.Itoa(nodes), "--ranks-per-node", strconv.Itoa(perNode), "--batch-size", strconv.Itoa(batch),
		"--prefixes", "4", "--epochs", "3", "--cache-bytes", "1GB", "--sample-nodes", "3")
	world := nodes * perNode
	perRank := shards * samples / world
	if rep.BatchesPerRank != (perRank+batch-1)/batch || rep.SamplesPerRank != perRank || rep.World != world {
		t.Errorf("batches per rank %d, samples %d, world %d; want %d, %d, %d", rep.BatchesPerRank, rep.SamplesPerRank, rep.World, (perRank+batch-1)/batch, perRank, world)
	}
	if !strings.HasPrefix(rep.Method, "sampled") || len(rep.PlannedNodes) != 3 || rep.PlannedNodes[0] != 0 || rep.PlannedNodes[2] != nodes-1 {
		t.Errorf("method %q, planned nodes %v", rep.Method, rep.PlannedNodes)
	}
	// Every sample is read once: the job reads the dataset, a little more for the
	// gaps read and dropped, never less.
	if rep.ReadAmplification < 0.99 || rep.ReadAmplification > 1.2 {
		t.Errorf("the job reads %.3fx the dataset", rep.ReadAmplification)
	}
	if want := int64(shards) * (samples*sampleBytes + 1024); rep.DatasetBytes != want { // the tars' end blocks
		t.Errorf("dataset bytes %d, want %d", rep.DatasetBytes, want)
	}
	// Four hashed prefixes share the requests, the busiest a little over a quarter.
	if rep.StartRequestsPerJob < int64(world) || rep.Prefixes != 4 || rep.PrefixBusiestShare < 0.25 || rep.PrefixBusiestShare > 0.27 ||
		!within(rep.PeakGetRatePerPrefix, float64(rep.StartRequestsPerJob)*rep.PrefixBusiestShare, 0.01) {
		t.Errorf("start requests %d, peak rate per prefix %.0f, %d prefixes, the busiest %.3f", rep.StartRequestsPerJob, rep.PeakGetRatePerPrefix, rep.Prefixes, rep.PrefixBusiestShare)
	}
	// The index object reaches each node first (a HEAD and a GET, and its bytes),
	// before the index is loaded and the first batch read.
	if least := 0.1 + float64(rep.IndexReadBytesPerNode)/(1250<<20); rep.IndexFetchSeconds < least || rep.FirstBatchSeconds < rep.IndexFetchSeconds+rep.IndexLoadSeconds {
		t.Errorf("index fetched in %.3fs (want at least %.3fs), first batch %.3fs after %.3fs of index load", rep.IndexFetchSeconds, least, rep.FirstBatchSeconds, rep.IndexLoadSeconds)
	}
	// The index file is about what shardload index writes for such shards, whose
	// samples are never all of one size: here each 0.9-1.1 times --sample-bytes.
	rng := rand.New(rand.NewPCG(7, 7))
	real := make([]shard.Info, shards)
	for i := range real {
		offs := make([]int64, samples)
		for k := 1; k < samples; k++ {
			offs[k] = offs[k-1] + int64(sampleBytes*(90+rng.IntN(21))/100+511)/512*512
		}
		real[i] = shard.Info{URL: fmt.Sprintf("s3://bucket/%s/train-%07d.tar", shard.HashPrefix(fmt.Sprintf("train-%07d.tar", i), 4), i),
			Version: `"0123456789abcdef0123456789abcdef"`, Samples: samples, Offsets: offs, Size: offs[samples-1] + sampleBytes + 1024}
	}
	var idx bytes.Buffer
	if err := index.WriteAddressable(&idx, real); err != nil {
		t.Fatal(err)
	}
	if !within(float64(rep.IndexFileBytes), float64(idx.Len()), 0.2) {
		t.Errorf("index file %d bytes; shardload index writes %d for such shards", rep.IndexFileBytes, idx.Len())
	}
	// An index read whole holds every offset in each process; read as the loader
	// reads it, those of the rank's shards alone.
	if rep.IndexBytesWhole < int64(shards)*samples*8 || rep.IndexBytesPerProcess >= rep.IndexBytesWhole {
		t.Errorf("index bytes per process %d, whole %d: want the whole index's more than the offsets alone, and more than the lazy read's", rep.IndexBytesPerProcess, rep.IndexBytesWhole)
	}
	// The cache is cold in the first epoch, and (1 GB, more than the dataset) holds
	// the shards a node read since in the later ones: each node reads its own shards
	// every epoch.
	if !rep.NodeAffinity || rep.CachePolicy != "order" || len(rep.CachePolicies) != 2 {
		t.Errorf("node affinity %v, cache policy %q, figures of %d policies", rep.NodeAffinity, rep.CachePolicy, len(rep.CachePolicies))
	}
	// (The shards two ranks of a node each read a part of are read around the cache
	// while not cached: a few percent.)
	for name, f := range rep.CachePolicies {
		if len(f.HitRate) != 3 || f.HitRate[0] > 0.1 || f.HitRate[1] < 0.95 || f.HitRate[2] < f.HitRate[1] || f.StoreBytesPerNode[1] > f.StoreBytesPerNode[0]/10 {
			t.Errorf("%s: cache hit rate by epoch %v, store bytes %v", name, f.HitRate, f.StoreBytesPerNode)
		}
	}
	if !slices.Equal(rep.CacheHitRate, rep.CachePolicies["order"].HitRate) {
		t.Errorf("cache_hit_rate %v, the order policy's %v", rep.CacheHitRate, rep.CachePolicies["order"].HitRate)
	}
	if !(rep.FirstBatchSeconds > 0) || rep.FirstBatchBytes <= 0 {
		t.Errorf("first batch: %.3fs, %d bytes", rep.FirstBatchSeconds, rep.FirstBatchBytes)
	}
	// The JSON keys tools read.
	code, stdout, _ := runCLI(t, "plan", "--json", "--shards", "100", "--nodes", "2")
	for _, k := range []string{"batches_per_rank", "bytes_per_node_per_epoch", "requests_per_node_per_epoch", "peak_get_rate_per_prefix", "index_bytes_per_process", "first_batch_seconds"} {
		if code != 0 || !strings.Contains(stdout, `"`+k+`":`) {
			t.Errorf("plan --json (exit %d) lacks %q: %s", code, k, stdout)
		}
	}
}

func TestPlanUsageErrors(t *testing.T) {
	for _, args := range [][]string{
		{"plan"},
		{"plan", "--shards", "10", "--index", "x"},
		{"plan", "--shards", "10", "--nodes", "0"},
		{"plan", "--shards", "10", "--batch-size", "0"},
		{"plan", "--shards", "10", "some-url"},
	} {
		if code, _, stderr := runCLI(t, args...); code != 2 {
			t.Errorf("%v: exit %d, want 2: %s", args, code, stderr)
		}
	}
}

// plan of a mix of two indexed streams agrees with bench runs of every rank of a job
// of 1 node of 2 ranks reading the same mix, within 10% for bytes and requests, and
// on the batches.
func TestPlanOfStreams(t *testing.T) {
	dir := t.TempDir()
	var patterns, indexes []string
	for i, n := range []int{6, 18} {
		spec := shardgen.Spec{Shards: n, SamplesPerShard: 30, Seed: uint64(7 + i), Prefix: fmt.Sprintf("s%d", i)}
		if _, err := shardgen.Generate(dir, spec); err != nil {
			t.Fatal(err)
		}
		pattern := dir + "/" + spec.Pattern()
		idx := filepath.Join(t.TempDir(), "ds.index")
		if code, _, stderr := runCLI(t, "index", "--no-index-store", "--output", idx, pattern); code != 0 {
			t.Fatalf("index: exit %d: %s", code, stderr)
		}
		patterns, indexes = append(patterns, pattern), append(indexes, idx)
	}
	job := []string{"--batch-size", "8", "--read-gap", "16KiB", "--seed", "5", "--epoch-samples", "400"}
	rep := planJSON(t, append([]string{"--stream", indexes[0] + " weight=1", "--stream", indexes[1] + " weight=3", "--nodes", "1", "--ranks-per-node", "2"}, job...)...)
	var bytes, requests, batches int64
	for rank := range 2 {
		var lf loaderFlags
		fs := pflag.NewFlagSet("bench", pflag.ContinueOnError)
		lf.register(fs, true)
		args := append([]string{"--world", "2", "--rank", strconv.Itoa(rank), "--no-index-store", "--autotune=false",
			"--stream", patterns[0] + " weight=1", "--stream", patterns[1] + " weight=3"}, job...)
		if err := fs.Parse(args); err != nil {
			t.Fatal(err)
		}
		cfg, err := lf.config(fs.Args(), io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		for i := range cfg.Streams {
			cfg.Streams[i].Shards, err = shardload.Count(context.Background(), shardload.Config{URLs: cfg.Streams[i].URLs, Index: indexes[i], NoIndexStore: true})
			if err != nil {
				t.Fatal(err)
			}
		}
		res, err := bench(context.Background(), cfg, 1, 0, 0, false, 0, nil)
		if err != nil {
			t.Fatal(err)
		}
		if len(res.Streams) != 2 || res.Streams[0].Samples+res.Streams[1].Samples != res.Samples {
			t.Fatalf("rank %d: streams %+v of %d samples", rank, res.Streams, res.Samples)
		}
		bytes += res.BytesIn
		requests += res.Requests
		batches = res.Batches
	}
	t.Logf("plan %d bytes, %d requests; bench %d bytes, %d requests", rep.BytesPerNode, rep.RequestsPerNode, bytes, requests)
	if batches != int64(rep.BatchesPerRank) || rep.BatchesPerRank != 25 {
		t.Errorf("bench ran %d batches per rank, plan says %d (want 25: 400 samples, 2 ranks, batches of 8)", batches, rep.BatchesPerRank)
	}
	if !within(float64(rep.BytesPerNode), float64(bytes), 0.1) || !within(float64(rep.RequestsPerNode), float64(requests), 0.1) {
		t.Errorf("plan %d bytes and %d requests per node, bench %d and %d (more than 10%% apart)", rep.BytesPerNode, rep.RequestsPerNode, bytes, requests)
	}
}

// indexCounter serves local files and counts the bytes and the reads (opens of any
// kind) it serves; a stream gives at most 1 KiB a Read, as a network stream gives
// a little at a time, so that a reader that stops early reads little past its stop.
type indexCounter struct {
	source.File
	bytes, reads atomic.Int64
}

type countedBody struct {
	io.ReadCloser
	c *indexCounter
}

func (b countedBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p[:min(len(p), 1<<10)])
	b.c.bytes.Add(int64(n))
	return n, err
}

func (c *indexCounter) Open(ctx context.Context, url string) (io.ReadCloser, error) {
	return c.OpenRange(ctx, url, 0, -1)
}

func (c *indexCounter) OpenRange(ctx context.Context, url string, off, n int64) (io.ReadCloser, error) {
	c.reads.Add(1)
	body, err := c.File.OpenRange(ctx, url, off, n)
	if err != nil {
		return nil, err
	}
	return countedBody{body, c}, nil
}

// plan's model of what a process reads of an addressable index (its start and
// counts, then the blocks of its plan's shards' offsets) agrees within 10% with what
// index.Lookup.Quick and index.Plan read of a small synthetic index, for each rank
// plan plans; and so do its GETs. Its memory model counts every shard's entry and
// the offsets of a rank's shards alone: less than the whole index.
func TestPlanIndexReads(t *testing.T) {
	const shards, samples, world = 20000, 50, 1024
	infos := make([]shard.Info, shards)
	for i := range infos {
		in := shard.Info{URL: fmt.Sprintf("s3://bucket/train/train-%06d.tar", i), Samples: samples, Version: fmt.Sprintf(`"%032x"`, i*7919)}
		off := int64(0)
		for j := range samples {
			in.Offsets = append(in.Offsets, off)
			off += 512 * int64(1+(i*31+j*17)%300) // samples of varied sizes
		}
		in.Size = off + 1024
		infos[i] = in
	}
	path := filepath.Join(t.TempDir(), "ds.index")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := index.WriteAddressable(f, infos); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	rep := planJSON(t, "--index", path, "--nodes", fmt.Sprint(world), "--ranks-per-node", "1", "--batch-size", "8", "--seed", "5")
	if !rep.IndexAddressable {
		t.Fatal("plan did not take the index as addressable")
	}

	// Each planned rank as a loader reads the index, with plan's settings.
	cfg := plan.Config{Seed: 5, World: world, RanksPerNode: 1, Shuffle: true, BatchSize: 8, GapBytes: source.RemoteRequestCost,
		Lanes: shardload.DefaultOpenShards, Window: plan.WindowSize(shardload.DefaultShuffleBuffer, shardload.DefaultShuffleBytes, infos)}
	urls := make([]string, shards)
	for i, in := range infos {
		urls[i] = in.URL
	}
	var bytes, reads int64
	var held int64
	for _, rank := range rep.PlannedNodes {
		c := &indexCounter{}
		reg := &source.Registry{}
		reg.Register("file", c)
		lk := index.Lookup{Sources: reg, Index: path, NoBeside: true, LazyOffsets: true}
		q, err := lk.Quick(context.Background(), urls, world)
		if err != nil {
			t.Fatal(err)
		}
		got, _, err := index.Plan(context.Background(), q, func(in []shard.Info) (plan.Plan, error) {
			rc := cfg
			rc.Rank = rank
			return plan.New(in, rc)
		})
		if err != nil {
			t.Fatal(err)
		}
		if index.Deferred(q) == 0 {
			t.Fatal("the lookup read every offset: not the lazy reads plan models")
		}
		bytes += c.bytes.Load()
		reads += c.reads.Load()
		var offs int64
		for _, in := range got {
			offs += 8 * int64(len(in.Offsets))
		}
		held = max(held, offs)
	}
	n := int64(len(rep.PlannedNodes))
	t.Logf("per process: plan models %d bytes read in %.1f GETs, holding %d bytes (whole: %d); the ranks read %d bytes in %.1f reads, holding %d bytes of offsets",
		rep.IndexReadBytesPerProcess, rep.IndexGetsPerProcess, rep.IndexBytesPerProcess, rep.IndexBytesWhole, bytes/n, float64(reads)/float64(n), held)
	if !within(float64(rep.IndexReadBytesPerProcess), float64(bytes/n), 0.1) {
		t.Errorf("index bytes read per process: plan %d, the ranks %d (more than 10%% apart)", rep.IndexReadBytesPerProcess, bytes/n)
	}
	if !within(rep.IndexGetsPerProcess, float64(reads)/float64(n), 0.1) {
		t.Errorf("index GETs per process: plan %.2f, the ranks %.2f", rep.IndexGetsPerProcess, float64(reads)/float64(n))
	}
	if rep.IndexBytesPerProcess >= rep.IndexBytesWhole || rep.IndexBytesPerProcess < held {
		t.Errorf("index memory per process %d: want less than the whole index's %d, and at least the %d of a rank's offsets", rep.IndexBytesPerProcess, rep.IndexBytesWhole, held)
	}
	if rep.IndexGetsPerNodeAtStart != 1 || rep.IndexReadBytesPerNode != rep.IndexFileBytes {
		t.Errorf("per node: %d GETs of %d bytes, want 1 of the index's %d", rep.IndexGetsPerNodeAtStart, rep.IndexReadBytesPerNode, rep.IndexFileBytes)
	}
}
