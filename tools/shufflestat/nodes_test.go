package main

import (
	"testing"
)

// TestJobTable: a job's ranks yield every sample of an epoch once (but for DropLast's
// cut); with shards kept on nodes every sample stays on its node and a node reads
// the same shards each epoch, which the global reshuffle does not do.
func TestJobTable(t *testing.T) {
	p := defaults()
	p.lanes, p.world, p.perNode, p.epochs, p.batch = 4, 4, 2, 3, 16
	d := dataset{"t", 24, 200, 1000}
	infos := d.infos()
	figures := map[int]jobStats{}
	for _, perNode := range []int{0, 2} {
		var epochs []jobEpoch
		for e := range p.epochs {
			job, err := readJob(infos, d.bytes, p, e, perNode)
			if err != nil {
				t.Fatal(err)
			}
			seen := map[sample]int{}
			n := 0
			for _, out := range job {
				for _, s := range out {
					seen[s]++
					n++
				}
			}
			if len(seen) != n || n != 24*200/(4*16)*(4*16) {
				t.Fatalf("ranks per node %d epoch %d: %d samples, %d distinct", perNode, e, n, len(seen))
			}
			epochs = append(epochs, job)
		}
		figures[perNode] = measureJob(epochs, infos, p)
	}
	kept, global := figures[2], figures[0]
	if kept.sameNode != 1 || kept.keptShards != 1 {
		t.Fatalf("shards kept on nodes: %.3f of the samples on the same node, %.3f of the shards", kept.sameNode, kept.keptShards)
	}
	if global.sameNode > 0.75 || global.keptShards > 0.75 {
		t.Fatalf("global reshuffle: %.3f of the samples on the same node, %.3f of the shards", global.sameNode, global.keptShards)
	}
	if kept.sameRank > 0.75 {
		t.Fatalf("shards kept on nodes: %.3f of the samples on the same rank: the node's ranks do not reshuffle", kept.sameRank)
	}
}
