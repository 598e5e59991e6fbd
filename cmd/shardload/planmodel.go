package main

// The model of a job that plan computes from: index memory and load, ranks, prefixes.

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"strings"
	"time"
	"unsafe"

	"github.com/shardload/shardload/index"
	"github.com/shardload/shardload/plan"
	"github.com/shardload/shardload/shard"
	"github.com/shardload/shardload/source"
)

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
		offsets += 8*int64(len(infos[s].Offsets)) + infos[s].Members.Bytes()
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
