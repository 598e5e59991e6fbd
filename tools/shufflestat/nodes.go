package main

// The job table (-world above 1): a job of -world ranks, -ranks-per-node to a node,
// read as plan.New splits it, under the global reshuffle (plan.Config.RanksPerNode 0:
// one order for any layout) and with shards kept on nodes (RanksPerNode set).

import (
	"fmt"
	"io"
	"math"

	"github.com/shardload/shardload/plan"
	"github.com/shardload/shardload/shard"
)

// jobEpoch is one epoch of a job: each rank's samples in the order it yields them.
type jobEpoch [][]sample

// readJob returns epoch's samples of every rank of a job of p.world ranks under
// perNode (0: the global reshuffle).
func readJob(infos []shard.Info, bytesPerSample int64, p params, epoch, perNode int) (jobEpoch, error) {
	job := make(jobEpoch, p.world)
	for rank := range p.world {
		pl, err := plan.New(infos, plan.Config{Seed: p.seed, Epoch: epoch, Rank: rank, World: p.world, Shuffle: true,
			Lanes: p.lanes, Window: window(p, bytesPerSample), BatchSize: p.batch, DropLast: true, RanksPerNode: perNode})
		if err != nil {
			return nil, err
		}
		job[rank] = yields(pl)
	}
	return job, nil
}

// yields returns what a loader of pl yields: each window's held samples, fed from
// its spans, in Emit's order.
func yields(pl plan.Plan) []sample {
	next := make([]int, len(pl.Spans))
	var out []sample
	for w := range pl.Windows() {
		held := make([]sample, w.Held)
		for _, f := range w.Feeds {
			sp := pl.Spans[f.Span]
			for k := range f.Count {
				if f.Slot >= 0 {
					held[f.Slot+k] = sample{sp.Shard, sp.Skip + next[f.Span]}
				}
				next[f.Span]++
			}
		}
		for _, i := range pl.Emit(w) {
			out = append(out, held[i])
		}
	}
	return out
}

// jobStats are a job's figures over its epochs (see the package comment).
type jobStats struct {
	rankBatch   float64 // distinct shards in a rank's batch, mean
	globalBatch float64 // distinct shards in a step's batches of all ranks together, mean
	same        float64 // adjacent samples of a rank from one shard
	sameRank    float64 // samples read by the same rank in the next epoch
	sameNode    float64 // samples read on the same node in the next epoch
	stepCorr    float64 // correlation of a sample's step in one epoch and the next
	coBatch     float64 // pairs of samples of a rank's batch in one batch again the next epoch
	nodeShards  float64 // shards a node reads any sample of, over the dataset's, mean over nodes
	keptShards  float64 // of those, the shards the node read in the epoch before, mean
}

// measureJob returns the figures of a job's epochs (two at least).
func measureJob(epochs []jobEpoch, infos []shard.Info, p params) jobStats {
	var st jobStats
	nodes := (p.world + p.perNode - 1) / p.perNode
	for e, job := range epochs {
		for _, out := range job {
			m, _ := distinct(out, p.batch, len(infos))
			st.rankBatch += m / float64(len(job)*len(epochs))
			var same int
			for n := 1; n < len(out); n++ {
				if out[n].shard == out[n-1].shard {
					same++
				}
			}
			st.same += float64(same) / float64(max(len(out)-1, 1)) / float64(len(job)*len(epochs))
		}
		steps := len(job[0]) / p.batch
		seen := make([]int, len(infos))
		var sum int
		for t := range steps {
			n := 0
			for _, out := range job {
				for _, s := range out[t*p.batch : (t+1)*p.batch] {
					if seen[s.shard] != t+1 {
						seen[s.shard] = t + 1
						n++
					}
				}
			}
			sum += n
		}
		st.globalBatch += float64(sum) / float64(max(steps, 1)) / float64(len(epochs))
		// Shards per node, and those the node read the epoch before.
		for k := range nodes {
			cur := nodeSet(job, k, p.perNode)
			st.nodeShards += float64(len(cur)) / float64(len(infos)) / float64(nodes*len(epochs))
			if e > 0 {
				prev := nodeSet(epochs[e-1], k, p.perNode)
				kept := 0
				for s := range cur {
					if prev[s] {
						kept++
					}
				}
				st.keptShards += float64(kept) / float64(max(len(cur), 1)) / float64(nodes*(len(epochs)-1))
			}
		}
	}
	for e := 1; e < len(epochs); e++ {
		a, b := where(epochs[e-1], infos, p), where(epochs[e], infos, p)
		var n, sameRank, sameNode int
		var sx, sy, sxx, syy, sxy float64
		pairs, again := 0, 0
		for i := range a {
			for j := range a[i] {
				x, y := a[i][j], b[i][j]
				if x.rank < 0 || y.rank < 0 {
					continue
				}
				n++
				if x.rank == y.rank {
					sameRank++
				}
				if x.rank/p.perNode == y.rank/p.perNode {
					sameNode++
				}
				fx, fy := float64(x.step), float64(y.step)
				sx, sy, sxx, syy, sxy = sx+fx, sy+fy, sxx+fx*fx, syy+fy*fy, sxy+fx*fy
			}
		}
		// Pairs of a rank's batch in epoch e that shared a rank's batch in e-1.
		for _, out := range epochs[e] {
			for t := 0; (t+1)*p.batch <= len(out); t++ {
				count := map[[2]int]int{}
				for _, s := range out[t*p.batch : (t+1)*p.batch] {
					if w := a[s.shard][s.index]; w.rank >= 0 {
						count[[2]int{w.rank, w.step}]++
					}
				}
				for _, c := range count {
					again += c * (c - 1) / 2
				}
				pairs += p.batch * (p.batch - 1) / 2
			}
		}
		fn := float64(n)
		st.sameRank += float64(sameRank) / fn / float64(len(epochs)-1)
		st.sameNode += float64(sameNode) / fn / float64(len(epochs)-1)
		cov := sxy/fn - sx/fn*sy/fn
		st.stepCorr += cov / math.Sqrt((sxx/fn-sx/fn*sx/fn)*(syy/fn-sy/fn*sy/fn)) / float64(len(epochs)-1)
		st.coBatch += float64(again) / float64(max(pairs, 1)) / float64(len(epochs)-1)
	}
	return st
}

// place is where a sample was read: the rank and the step (batch); rank -1: by none.
type place struct{ rank, step int }

// where returns each sample's place in a job's epoch: [shard][index].
func where(job jobEpoch, infos []shard.Info, p params) [][]place {
	out := make([][]place, len(infos))
	for i, s := range infos {
		out[i] = make([]place, s.Samples)
		for j := range out[i] {
			out[i][j].rank = -1
		}
	}
	for r, o := range job {
		for n, s := range o {
			out[s.shard][s.index] = place{r, n / p.batch}
		}
	}
	return out
}

// nodeSet returns the shards node k's ranks read in an epoch.
func nodeSet(job jobEpoch, k, perNode int) map[int]bool {
	set := map[int]bool{}
	for r := k * perNode; r < min((k+1)*perNode, len(job)); r++ {
		for _, s := range job[r] {
			set[s.shard] = true
		}
	}
	return set
}

// runJobs prints the job table: per dataset, the global reshuffle and the order that
// keeps shards on nodes, over p.epochs epochs from p.epoch.
func runJobs(w io.Writer, sets []dataset, p params) error {
	nodes := (p.world + p.perNode - 1) / p.perNode
	fmt.Fprintf(w, "\nA job of %d ranks, %d a node (%d nodes), epochs %d to %d, batches of %d a rank:\n\n", p.world, p.perNode, nodes, p.epoch, p.epoch+p.epochs-1, p.batch)
	fmt.Fprintf(w, "| dataset | order | shards/rank batch | shards/global batch | same shard | same rank next epoch | same node next epoch | step corr. next epoch | batch pairs again | shards a node reads | of those, read by it the epoch before |\n")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|---|---|")
	for _, d := range sets {
		infos := d.infos()
		name := fmt.Sprintf("%s: %d x %d x %s", d.name, d.shards, d.samples, kb(d.bytes))
		for _, perNode := range []int{0, p.perNode} {
			var epochs []jobEpoch
			for e := p.epoch; e < p.epoch+p.epochs; e++ {
				job, err := readJob(infos, d.bytes, p, e, perNode)
				if err != nil {
					return err
				}
				epochs = append(epochs, job)
			}
			s := measureJob(epochs, infos, p)
			note := "global reshuffle"
			if perNode > 0 {
				note = "shards kept on nodes"
			}
			fmt.Fprintf(w, "| %s | %s | %.2f | %.1f | %.3f | %.3f | %.3f | %+.3f | %.4f | %.3f | %.3f |\n",
				name, note, s.rankBatch, s.globalBatch, s.same, s.sameRank, s.sameNode, s.stepCorr, s.coBatch, s.nodeShards, s.keptShards)
		}
	}
	return nil
}
