package main

import (
	"slices"

	"github.com/shardload/shardload/shard"
)

// stats are an order's figures (see the package comment).
type stats struct {
	disp       [4]int // vs S: p50, p90, p99, max
	stage      [3]int // in the shuffle stage: p50, p99, max
	blockMean  float64
	blockMin   int
	batchMean  float64
	same       float64
	neighbours float64
	spreadMid  float64 // outputs holding the middle 90% of a shard's samples, mean over shards
	spreadAll  float64 // outputs from a shard's first sample to its last, mean over shards
}

func measure(o order, infos []shard.Info, perm []int, p params) stats {
	var st stats
	// Position in S of every shard's first sample.
	start := make([]int, len(infos))
	pos := 0
	for _, i := range perm {
		start[i] = pos
		pos += infos[i].Samples
	}
	disp := make([]int, len(o.out))
	stage := make([]int, len(o.out))
	for n, s := range o.out {
		disp[n] = abs(n - (start[s.shard] + s.index))
		stage[n] = abs(n - o.stage[n])
	}
	slices.Sort(disp)
	slices.Sort(stage)
	st.disp = [4]int{quantile(disp, 0.5), quantile(disp, 0.9), quantile(disp, 0.99), quantile(disp, 1)}
	st.stage = [3]int{quantile(stage, 0.5), quantile(stage, 0.99), quantile(stage, 1)}

	st.blockMean, st.blockMin = distinct(o.out, p.block, len(infos))
	st.batchMean, _ = distinct(o.out, p.batch, len(infos))

	var same, neighbours int
	for n := 1; n < len(o.out); n++ {
		a, b := o.out[n-1], o.out[n]
		if a.shard == b.shard {
			same++
			if abs(a.index-b.index) == 1 {
				neighbours++
			}
		}
	}
	if pairs := len(o.out) - 1; pairs > 0 {
		st.same = float64(same) / float64(pairs)
		st.neighbours = float64(neighbours) / float64(pairs)
	}

	// Where each shard's samples come out, in order.
	at := make([][]int, len(infos))
	for n, s := range o.out {
		at[s.shard] = append(at[s.shard], n)
	}
	var mid, all, nonEmpty int
	for _, ns := range at {
		if len(ns) > 0 {
			mid += quantile(ns, 0.95) - quantile(ns, 0.05) + 1
			all += ns[len(ns)-1] - ns[0] + 1
			nonEmpty++
		}
	}
	if nonEmpty > 0 {
		st.spreadMid = float64(mid) / float64(nonEmpty)
		st.spreadAll = float64(all) / float64(nonEmpty)
	}
	return st
}

// distinct returns the mean and the least number of distinct shards in the full
// blocks of size consecutive samples of out (0, 0 with none).
func distinct(out []sample, size, shards int) (mean float64, least int) {
	seen := make([]int, shards) // block number + 1 that last saw the shard
	blocks, sum := 0, 0
	for b := 0; (b+1)*size <= len(out); b++ {
		n := 0
		for _, s := range out[b*size : (b+1)*size] {
			if seen[s.shard] != b+1 {
				seen[s.shard] = b + 1
				n++
			}
		}
		if blocks == 0 || n < least {
			least = n
		}
		blocks++
		sum += n
	}
	if blocks == 0 {
		return 0, 0
	}
	return float64(sum) / float64(blocks), least
}

// quantile returns the q-quantile of sorted by the nearest rank (0 when empty).
func quantile(sorted []int, q float64) int {
	if len(sorted) == 0 {
		return 0
	}
	i := int(q*float64(len(sorted))+0.5) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

func abs(x int) int {
	if x < 0 {
		return -x
	}
	return x
}
