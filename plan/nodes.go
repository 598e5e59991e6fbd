package plan

import (
	"sort"

	"github.com/shardload/shardload/shard"
)

// Shards that keep their nodes (Config.RanksPerNode).
//
// The ranks of a job sit on nodes of RanksPerNode consecutive ranks (torchrun's
// numbering: rank r on node r/RanksPerNode), and a node's cache holds what the node
// read. The epoch's order is then made so that each node reads, epoch after epoch,
// the same samples of the same shards, and so that the rank split (contiguous parts
// of floor(total/World) samples) gives each node exactly its own:
//
//  1. The shards are put in one arrangement per Seed, the same in every epoch (a
//     permutation of their samples, shard after shard).
//  2. The arrangement is cut into one group per node at the samples where the
//     split's nodes start: node k's group is the samples of ranks [k*R, (k+1)*R)
//     (R = RanksPerNode), (k+1)*R*floor(total/World) - k*R*floor(total/World)
//     samples; the last group also holds the samples no rank reads (Plan.Dropped).
//     A shard cut between two groups gives each its run of samples: a job has at
//     most one such shard per node boundary.
//  3. Each group is ordered as an Order of its own (its shards shuffled per Seed,
//     Epoch and group, cut into Lanes lanes, windows of Window samples permuted,
//     warm-up windows first), and the epoch's order is the groups' orders, one after
//     the other. A group of fewer than two shards a lane, on a node of several
//     ranks, has each shard cut in two at a point drawn per epoch first
//     (splitEntries), so that its ranks do not read the same parts of the same
//     shards every epoch.
//
// So a node's ranks read, every epoch, the samples of their node's group, shuffled
// anew within the node each epoch: across its lanes and windows, and across its ranks
// (which take other parts of the group's order each epoch). A sample stays on its
// node: it meets, in one window, only samples of the node's shards.
//
// The order then depends on the job's layout (World and RanksPerNode) as well as on
// the dataset, seed and epoch. The layout of an epoch is that of its first run: a
// state records it (Run.RanksPerNode), and a run that resumes the epoch on another
// layout reads what is left of the same order, split among its own ranks by the rank
// split as any resume is, so every sample is read once; the epochs after it are
// ordered for its own layout. A node count of one (World <= RanksPerNode), an
// unshuffled epoch (already read in the same place each epoch: its shards in order,
// cut into contiguous parts), a mix of streams and counts estimated from the
// shards' sizes keep the order of Order.

// nodeRand offsets the random stream of the arrangement of the shards among the
// nodes from the other streams of an epoch (EpochRand).
const nodeRand = 1 << 42

// nodeLayout returns the ranks per node by which cfg's epoch keeps shards on nodes,
// and 0 when it does not: the layout of the epoch's first run (its world size and
// ranks per node), or cfg's at the start of the epoch.
func nodeLayout(shards []shard.Info, cfg Config) (world, perNode int) {
	world, perNode = max(cfg.World, 1), cfg.RanksPerNode
	if len(cfg.Runs) > 0 {
		world, perNode = cfg.Runs[0].World, cfg.Runs[0].RanksPerNode
	}
	if !cfg.Shuffle || cfg.Mix != nil || perNode < 1 || world <= perNode || shard.Estimated(shards) > 0 {
		return world, 0
	}
	return world, perNode
}

// nodeOrderOf returns the node order of shards under order, for a job of world ranks
// with perNode to a node (newNodeOrder): the one another plan of these shards holds,
// when one does (shared.go).
func nodeOrderOf(shards []shard.Info, order *Order, world, perNode int) (*nodeOrder, error) {
	build := func() (*nodeOrder, error) {
		return newNodeOrder(shards, order.Len(), order.Config(), world, perNode), nil
	}
	k, ok := keyOf(shards, order.Config(), world, perNode)
	if !ok {
		return build()
	}
	return nodeOrders.get(k, func(no *nodeOrder) bool { return no.of(shards) }, build)
}

// entry is a group's run of a shard's samples: samples [skip, skip+n) of shard.
type entry struct {
	shard, skip, n int
}

// nodeOrder is the order of an epoch whose shards keep their nodes: one Order per
// node's group, one after the other.
type nodeOrder struct {
	total int64
	at    []int64   // at[k]: the position of group k's first sample; at[groups] = total
	win   []int64   // win[k]: the number of group k's first window; win[groups]: the windows
	subs  []*Order  // each group's order, of its entries
	ents  [][]entry // each group's entries, which its order's shard indices name
	lanes int
}

// newNodeOrder returns the order of shards' samples (total in all) under ocfg (with
// defaults applied, shuffled) for a job of world ranks, perNode to a node.
func newNodeOrder(shards []shard.Info, total int64, ocfg OrderConfig, world, perNode int) *nodeOrder {
	nodes := (world + perNode - 1) / perNode
	per := total / int64(world)
	no := &nodeOrder{total: total, lanes: ocfg.Lanes, at: make([]int64, nodes+1), win: make([]int64, nodes+1)}
	for k := 1; k < nodes; k++ {
		no.at[k] = int64(min(k*perNode, world)) * per
	}
	no.at[nodes] = total
	arr := make([]int32, len(shards))
	for i := range arr {
		arr[i] = int32(i)
	}
	EpochRand(ocfg.Seed, 0, nodeRand).Shuffle(len(arr), func(i, j int) { arr[i], arr[j] = arr[j], arr[i] })
	i, used := 0, 0 // the arrangement's shard being cut, and its samples given to groups
	for k := range nodes {
		var ents []entry
		for need := no.at[k+1] - no.at[k]; need > 0; {
			s := int(arr[i])
			take := int(min(int64(shards[s].Samples-used), need))
			if take > 0 {
				ents = append(ents, entry{shard: s, skip: used, n: take})
			}
			used += take
			need -= int64(take)
			if used == shards[s].Samples {
				i, used = i+1, 0
			}
		}
		cfg := ocfg
		cfg.Seed = groupSeed(ocfg.Seed, k)
		if perNode > 1 && len(ents) < 2*cfg.Lanes {
			ents = splitEntries(ents, EpochRand(cfg.Seed, cfg.Epoch, nodeSplitRand))
		}
		sub := newOrder(len(ents), func(e int) int64 { return int64(ents[e].n) }, no.at[k+1]-no.at[k], cfg)
		no.subs = append(no.subs, sub)
		no.ents = append(no.ents, ents)
		no.win[k+1] = no.win[k] + sub.Windows()
	}
	return no
}

// nodeSplitRand offsets the random stream of a group's split points (splitEntries)
// from the other streams of an epoch (EpochRand).
const nodeSplitRand = nodeRand + 1

// splitEntries cuts each of a group's runs of two samples or more in two at a point
// drawn per epoch: a group of fewer than two shards a lane would otherwise be read
// with each lane one shard, which a node of several ranks splits at the same places
// every epoch (a rank reading the same part of the same shards each epoch); cut
// anew, the parts fall in other lanes and places, for two requests a shard instead
// of one (each a range, which a node cache not holding the shard serves from the
// store while it fetches the shard behind it).
func splitEntries(ents []entry, rng interface{ IntN(int) int }) []entry {
	out := make([]entry, 0, 2*len(ents))
	for _, e := range ents {
		if e.n < 2 {
			out = append(out, e)
			continue
		}
		u := 1 + rng.IntN(e.n-1)
		out = append(out, entry{shard: e.shard, skip: e.skip, n: u}, entry{shard: e.shard, skip: e.skip + u, n: e.n - u})
	}
	return out
}

// groupSeed derives the seed of a node's group's order from the job's.
func groupSeed(seed uint64, k int) uint64 {
	return seed ^ (uint64(k)+1)*0xbf58476d1ce4e5b9
}

// Len returns the samples of the epoch.
func (no *nodeOrder) Len() int64 { return no.total }

func (no *nodeOrder) laneCount() int { return no.lanes }

// groupAt returns the group holding position n.
func (no *nodeOrder) groupAt(n int64) int {
	return sort.Search(len(no.subs)-1, func(k int) bool { return no.at[k+1] > n })
}

// groupOf returns the group holding window j.
func (no *nodeOrder) groupOf(j int64) int {
	return sort.Search(len(no.subs)-1, func(k int) bool { return no.win[k+1] > j })
}

// window returns the window holding position n: its number and its first and end
// positions.
func (no *nodeOrder) window(n int64) (j, start, end int64) {
	k := no.groupAt(n)
	j, start, end = no.subs[k].window(n - no.at[k])
	return no.win[k] + j, no.at[k] + start, no.at[k] + end
}

// bounds returns window j's first and end positions.
func (no *nodeOrder) bounds(j int64) (start, end int64) {
	k := no.groupOf(j)
	start, end = no.subs[k].bounds(j - no.win[k])
	return no.at[k] + start, no.at[k] + end
}

// Perm returns window j's permutation: its group's order's.
func (no *nodeOrder) Perm(j int64, size int) []int32 {
	k := no.groupOf(j)
	return no.subs[k].Perm(j-no.win[k], size)
}

// pieces appends window j's items: its group's order's, whose shards are the group's
// entries.
func (no *nodeOrder) pieces(j int64, dst []piece) []piece {
	k := no.groupOf(j)
	n := len(dst)
	dst = no.subs[k].pieces(j-no.win[k], dst)
	for i := n; i < len(dst); i++ {
		dst[i].ents = no.ents[k]
	}
	return dst
}

// bytes is about what no holds: its groups' orders and entries.
func (no *nodeOrder) bytes() int64 {
	var n int64
	for k, sub := range no.subs {
		n += int64(len(sub.perm))*12 + int64(len(no.ents[k]))*24
	}
	return n
}

// NodeShards returns, for each node of a job of world ranks with perNode to a node
// (node k holds ranks [k*perNode, (k+1)*perNode)), the samples its ranks read of
// each shard in the plans of cfg's epoch (cfg.World, Rank and RanksPerNode are set
// for each rank): reads[k][s]. It reads no data; it is for measuring what stays on a
// node from epoch to epoch.
func NodeShards(shards []shard.Info, cfg Config, perNode int) ([][]int64, error) {
	world := max(cfg.World, 1)
	perNode = max(perNode, 1)
	nodes := (world + perNode - 1) / perNode
	reads := make([][]int64, nodes)
	for rank := range world {
		c := cfg
		c.Rank = rank
		p, err := New(shards, c)
		if err != nil {
			return nil, err
		}
		k := rank / perNode
		if reads[k] == nil {
			reads[k] = make([]int64, len(shards))
		}
		for w := range p.Windows() {
			for _, f := range w.Feeds {
				reads[k][p.Spans[f.Span].Shard] += int64(f.Count)
			}
		}
	}
	return reads, nil
}
