// Command shufflestat measures how well an epoch's samples are shuffled: the order
// plan.Order gives (lanes of the shuffled shard sequence, windows permuted whole)
// against the order the loader gave before it (open shards picked at random feeding
// a shuffle buffer), at the same memory budget. It reads no data: both orders are
// computed on sample IDs for a dataset of equal shards.
//
// Usage:
//
//	go run ./tools/shufflestat [-preset all|images|tokens|large]
//	go run ./tools/shufflestat -shards N -samples N -bytes N
//	go run ./tools/shufflestat -world 8 -ranks-per-node 2 -epochs 3
//
// Presets: images (32 shards x 300 samples of 110 KB, the image dataset of the
// pipeline benchmark), tokens (64 x 4000 of 8 KB) and large (16 x 10000 of 20 KB).
// -shards, -samples and -bytes give one dataset of that shape instead.
//
// Both orders are one rank's (world 1) of the same seed and epoch:
//
//   - new: plan.NewOrder with Lanes = -lanes and Window = half of the samples the
//     buffer holds (min(-buffer, -shuffle-bytes / -bytes)), as the loader sets them;
//     the loader holds two windows.
//   - old: the mixer before plan.Order: the shards shuffled by the same
//     plan.EpochRand(seed, epoch, 0), -open of them open at once (the next opened
//     when one ends), the shard giving the next sample picked with
//     rng.IntN(len(open)), each sample pushed into a shuffle buffer of -buffer items
//     (filling from 100, the old ShuffleInitial, growing by one per item out) and
//     -shuffle-bytes bytes, a random item out whenever it is full, drained at the
//     end; rng is plan.EpochRand(seed, epoch, 1), shared by the picks and the
//     buffer.
//
// It prints a markdown table, one row per order per dataset. The columns:
//
//   - held: the most samples held by the shuffle stage (old: the buffer; new: two
//     consecutive windows), and their bytes (MB, 10^6 bytes);
//   - disp. vs S: |output position - position in S|, S being the samples of the
//     shuffled shards one after the other: median / p90 / p99 / max. The new order
//     reads Lanes regions of S side by side, so its samples move by up to most of
//     an epoch here by construction; this says how far the order is from S, not how
//     random it is;
//   - disp. in stage: how far the shuffle stage moves a sample: old, |output
//     position - position in which it entered the buffer|; new, |output position -
//     its position in the same order with Window 1 (the lanes interleaved, nothing
//     permuted)|: median / p99 / max;
//   - shards/1000: distinct shards in each block of -block consecutive outputs
//     (full blocks): mean (min);
//   - shards/batch: distinct shards in each full batch of -batch outputs: mean;
//   - same shard: the fraction of adjacent output pairs from one shard;
//   - neighbours: the fraction of adjacent output pairs that are neighbouring
//     samples of one shard (sample indices differing by one, either way);
//   - shard spread: over how many outputs a shard's samples come out: from the 5th to
//     the 95th percentile of their positions / from the first to the last, mean over
//     shards.
//
// With -world above 1 it also prints the job table: a job of -world ranks,
// -ranks-per-node to a node, each rank's part of -epochs epochs as plan.New gives it
// (the rank split, batches of -batch with DropLast), under the global reshuffle
// (one order for any layout) and with shards kept on nodes
// (plan.Config.RanksPerNode). Its columns:
//
//   - shards/rank batch: distinct shards in a rank's batch, mean;
//   - shards/global batch: distinct shards in one step's batches of all ranks;
//   - same shard: adjacent samples of a rank from one shard;
//   - same rank / same node next epoch: the samples read by the same rank, or on
//     the same node, in the next epoch;
//   - step corr.: the correlation of a sample's step in one epoch with its step in
//     the next (a shard is read from its start to its end, so its samples come at
//     about the same place of a rank's part each epoch, under either order);
//   - batch pairs again: of the pairs of samples in one rank's batch, those that
//     were in one rank's batch the epoch before;
//   - shards a node reads: the fraction of the dataset's shards a node reads any
//     sample of in an epoch, mean over nodes; of those, the fraction it read the
//     epoch before too (what a node cache of its share holds).
//
// It lives under tools/ because it is a measuring tool for this repository's
// benchmarks, not part of the shardload command line.
package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"

	"github.com/shardload/shardload/plan"
	"github.com/shardload/shardload/shard"
)

// dataset is a dataset of equal shards.
type dataset struct {
	name    string
	shards  int
	samples int   // per shard
	bytes   int64 // per sample
}

var presets = []dataset{
	{"images", 32, 300, 110_000},
	{"tokens", 64, 4000, 8_000},
	{"large", 16, 10000, 20_000},
}

// params are the loader's settings the orders depend on.
type params struct {
	seed         uint64
	epoch        int
	open         int   // OpenShards of the old mixer
	lanes        int   // OpenShards of the new order: its lanes
	buffer       int   // ShuffleBuffer
	shuffleBytes int64 // ShuffleBytes
	batch        int
	block        int
	world        int // the job table's ranks (-world above 1)
	perNode      int // and ranks per node
	epochs       int // and epochs
}

// sample is one sample of the dataset.
type sample struct{ shard, index int }

// order is one epoch's order and what the shuffle stage did to it.
type order struct {
	out   []sample
	stage []int // stage[n]: the position out[n] had before the shuffle stage
	held  int   // the most samples the shuffle stage held
	note  string
}

func main() {
	var p params
	preset := flag.String("preset", "all", "dataset: all, or one of "+presetNames())
	nShards := flag.Int("shards", 0, "shards of a custom dataset (with -samples and -bytes; replaces -preset)")
	nSamples := flag.Int("samples", 0, "samples per shard of a custom dataset")
	nBytes := flag.Int64("bytes", 0, "bytes per sample of a custom dataset")
	flag.Uint64Var(&p.seed, "seed", 0, "seed of the epoch's order")
	flag.IntVar(&p.epoch, "epoch", 0, "epoch")
	flag.IntVar(&p.open, "open", 4, "the old mixer's open shards (OpenShards; its default was 4)")
	flag.IntVar(&p.lanes, "lanes", 8, "the new order's lanes (OpenShards; its default is 8, with queues half as deep, so the two defaults hold the same memory)")
	flag.IntVar(&p.buffer, "buffer", 1000, "shuffle buffer samples (ShuffleBuffer)")
	flag.Int64Var(&p.shuffleBytes, "shuffle-bytes", 64<<20, "shuffle buffer bytes (ShuffleBytes)")
	flag.IntVar(&p.batch, "batch", 32, "batch size, for the distinct shards per batch")
	flag.IntVar(&p.block, "block", 1000, "outputs per block, for the distinct shards per block")
	flag.IntVar(&p.world, "world", 1, "ranks of a job: above 1, also the job table (the global reshuffle against shards kept on nodes)")
	flag.IntVar(&p.perNode, "ranks-per-node", 2, "the job table's ranks per node")
	flag.IntVar(&p.epochs, "epochs", 3, "the job table's epochs, from -epoch")
	flag.Parse()
	if flag.NArg() != 0 || p.open < 1 || p.lanes < 1 || p.buffer < 1 || p.batch < 1 || p.block < 1 || p.world < 1 || p.perNode < 1 || p.epochs < 2 {
		flag.Usage()
		os.Exit(2)
	}
	var sets []dataset
	switch {
	case *nShards != 0 || *nSamples != 0 || *nBytes != 0:
		if *nShards < 1 || *nSamples < 1 || *nBytes < 1 {
			fmt.Fprintln(os.Stderr, "shufflestat: -shards, -samples and -bytes must all be positive")
			os.Exit(2)
		}
		sets = []dataset{{"custom", *nShards, *nSamples, *nBytes}}
	case *preset == "all":
		sets = presets
	default:
		i := slices.IndexFunc(presets, func(d dataset) bool { return d.name == *preset })
		if i < 0 {
			fmt.Fprintf(os.Stderr, "shufflestat: unknown preset %q (want all, %s)\n", *preset, presetNames())
			os.Exit(2)
		}
		sets = presets[i : i+1]
	}
	if err := run(os.Stdout, sets, p); err != nil {
		fmt.Fprintln(os.Stderr, "shufflestat:", err)
		os.Exit(1)
	}
	if p.world > 1 {
		if err := runJobs(os.Stdout, sets, p); err != nil {
			fmt.Fprintln(os.Stderr, "shufflestat:", err)
			os.Exit(1)
		}
	}
}

func presetNames() string {
	var names []string
	for _, d := range presets {
		names = append(names, d.name)
	}
	return strings.Join(names, ", ")
}

func run(w io.Writer, sets []dataset, p params) error {
	fmt.Fprintf(w, "| dataset | order | held: samples (MB) | disp. vs S: p50 / p90 / p99 / max | disp. in stage: p50 / p99 / max | shards/%d: mean (min) | shards/batch of %d | same shard | neighbours | shard spread: mid 90%% / all |\n", p.block, p.batch)
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|---|")
	for _, d := range sets {
		infos := d.infos()
		perm := shardPerm(len(infos), p.seed, p.epoch)
		old := oldOrder(infos, perm, d.bytes, p)
		nw, err := newOrder(infos, d.bytes, p)
		if err != nil {
			return err
		}
		name := fmt.Sprintf("%s: %d x %d x %s", d.name, d.shards, d.samples, kb(d.bytes))
		for _, o := range []order{old, nw} {
			s := measure(o, infos, perm, p)
			fmt.Fprintf(w, "| %s | %s | %d (%.0f) | %d / %d / %d / %d | %d / %d / %d | %.1f (%d) | %.2f | %.3f | %.4f | %.0f / %.0f |\n",
				name, o.note, o.held, float64(int64(o.held)*d.bytes)/1e6,
				s.disp[0], s.disp[1], s.disp[2], s.disp[3], s.stage[0], s.stage[1], s.stage[2],
				s.blockMean, s.blockMin, s.batchMean, s.same, s.neighbours, s.spreadMid, s.spreadAll)
		}
	}
	return nil
}

func kb(b int64) string {
	if b%1000 == 0 {
		return fmt.Sprintf("%d KB", b/1000)
	}
	return fmt.Sprintf("%d B", b)
}

func (d dataset) infos() []shard.Info {
	infos := make([]shard.Info, d.shards)
	for i := range infos {
		infos[i] = shard.Info{
			URL:     fmt.Sprintf("shard-%06d.tar", i),
			Samples: d.samples,
			Size:    int64(d.samples) * d.bytes,
		}
	}
	return infos
}

// shardPerm returns the shuffled shard order of an epoch: shard indices as the old
// plan and plan.NewOrder shuffle them.
func shardPerm(n int, seed uint64, epoch int) []int {
	perm := make([]int, n)
	for i := range perm {
		perm[i] = i
	}
	plan.EpochRand(seed, epoch, 0).Shuffle(n, func(i, j int) { perm[i], perm[j] = perm[j], perm[i] })
	return perm
}

// window returns the new order's window as the loader sets it: half of the samples
// the shuffle budget holds at the mean sample size.
func window(p params, bytesPerSample int64) int {
	w := int64(p.buffer)
	w = min(w, max(1, p.shuffleBytes/max(1, bytesPerSample)))
	return int(max(1, w/2))
}

// newOrder returns the order of plan.NewOrder under the loader's settings.
func newOrder(infos []shard.Info, bytesPerSample int64, p params) (order, error) {
	win := window(p, bytesPerSample)
	cfg := plan.OrderConfig{Seed: p.seed, Epoch: p.epoch, Shuffle: true, Lanes: p.lanes, Window: win}
	o, err := plan.NewOrder(infos, cfg)
	if err != nil {
		return order{}, err
	}
	out, sizes := windows(o)
	// Before the shuffle stage: the same lanes, interleaved in the same proportions,
	// with nothing permuted.
	cfg.Window = 1
	ref, err := plan.NewOrder(infos, cfg)
	if err != nil {
		return order{}, err
	}
	before, _ := windows(ref)
	pos := positions(infos, before)
	r := order{out: out, stage: make([]int, len(out)), note: fmt.Sprintf("new (lanes %d, window %d)", p.lanes, win)}
	for n, s := range out {
		r.stage[n] = pos[s.shard][s.index]
	}
	for j := range sizes {
		held := sizes[j]
		if j+1 < len(sizes) {
			held += sizes[j+1]
		}
		r.held = max(r.held, held)
	}
	return r, nil
}

// windows returns o's samples in order, window by window (as o.At gives them), and
// the windows' sizes.
func windows(o *plan.Order) ([]sample, []int) {
	out := make([]sample, 0, o.Len())
	var sizes []int
	for j := range o.Windows() {
		size := int(o.WindowStart(j+1) - o.WindowStart(j))
		sizes = append(sizes, size)
		p := o.Perm(j, size)
		for q := range size {
			if p != nil {
				q = int(p[q])
			}
			s, i := o.Item(j, q)
			out = append(out, sample{s, i})
		}
	}
	return out, sizes
}

// positions returns the position of every sample in order: pos[shard][index].
func positions(infos []shard.Info, order []sample) [][]int {
	pos := make([][]int, len(infos))
	for i, s := range infos {
		pos[i] = make([]int, s.Samples)
	}
	for n, s := range order {
		pos[s.shard][s.index] = n
	}
	return pos
}

// oldOrder returns the order the mixer gave before plan.Order, for one rank of a
// world of 1: the shards in perm's order, p.open of them open, each sample pushed
// into the shuffle buffer.
func oldOrder(infos []shard.Info, perm []int, bytesPerSample int64, p params) order {
	type slot struct{ shard, next, n int }
	rng := plan.EpochRand(p.seed, p.epoch, 1) // 1 + rank
	buf := newShuffler(rng, p.buffer, p.shuffleBytes)
	r := order{note: fmt.Sprintf("old (open %d, buffer %d)", p.open, p.buffer)}
	pushed := 0
	var open []*slot
	next := 0
	emit := func() {
		v := buf.pop()
		r.out = append(r.out, v.s)
		r.stage = append(r.stage, v.in)
	}
	for {
		for len(open) < p.open && next < len(perm) {
			// The old plan gave a world of 1 every shard with samples, whole.
			if n := infos[perm[next]].Samples; n > 0 {
				open = append(open, &slot{shard: perm[next], n: n})
			}
			next++
		}
		if len(open) == 0 {
			break
		}
		i := rng.IntN(len(open))
		s := open[i]
		if s.next == s.n {
			// The pick that finds a shard's end closes it.
			open = slices.Delete(open, i, i+1)
			continue
		}
		buf.push(entry{sample{s.shard, s.next}, pushed}, bytesPerSample)
		s.next++
		pushed++
		r.held = max(r.held, len(buf.items))
		for buf.full() {
			emit()
		}
	}
	for len(buf.items) > 0 {
		emit()
	}
	return r
}

// entry is a sample in the buffer and the position in which it went in.
type entry struct {
	s  sample
	in int
}
