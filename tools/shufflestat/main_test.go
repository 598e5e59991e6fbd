package main

import (
	"bytes"
	"slices"
	"strings"
	"testing"

	"github.com/shardload/shardload/plan"
	"github.com/shardload/shardload/shard"
)

func defaults() params {
	return params{seed: 7, epoch: 2, open: 4, buffer: 1000, shuffleBytes: 64 << 20, batch: 32, block: 1000}
}

// sequence returns S: the shards in perm's order, their samples in order.
func sequence(infos []shard.Info, perm []int) []sample {
	var s []sample
	for _, i := range perm {
		for j := range infos[i].Samples {
			s = append(s, sample{i, j})
		}
	}
	return s
}

// uneven is a dataset of unequal shards, one of them empty.
func uneven() []shard.Info {
	var infos []shard.Info
	for i, n := range []int{300, 17, 0, 1200, 5, 640, 300, 88, 1, 999} {
		infos = append(infos, shard.Info{URL: strings.Repeat("x", i+1), Samples: n})
	}
	return infos
}

func TestOldWithoutBufferIsS(t *testing.T) {
	p := defaults()
	p.open, p.buffer = 1, 1
	infos := uneven()
	perm := shardPerm(len(infos), p.seed, p.epoch)
	o := oldOrder(infos, perm, 1000, p)
	want := sequence(infos, perm)
	if !slices.Equal(o.out, want) {
		t.Fatalf("old order with 1 open shard and a 1-item buffer is not S")
	}
	if o.held != 1 {
		t.Errorf("held %d samples, want 1", o.held)
	}
	for n, in := range o.stage {
		if in != n {
			t.Fatalf("sample %d went in at %d", n, in)
		}
	}
}

func TestNewWithoutWindowIsS(t *testing.T) {
	p := defaults()
	p.lanes, p.buffer = 1, 2 // one lane, window 1
	infos := uneven()
	perm := shardPerm(len(infos), p.seed, p.epoch)
	o, err := newOrder(infos, 1000, p)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(o.out, sequence(infos, perm)) {
		t.Fatalf("new order with 1 lane and window 1 is not S")
	}
}

// Both orders hold every sample once; the windows read in order are the order At
// gives.
func TestOrdersArePermutations(t *testing.T) {
	p := defaults()
	infos := uneven()
	perm := shardPerm(len(infos), p.seed, p.epoch)
	old := oldOrder(infos, perm, 110_000, p)
	nw, err := newOrder(infos, 110_000, p)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range []order{old, nw} {
		seen := positions(infos, nil)
		for i := range seen {
			for j := range seen[i] {
				seen[i][j] = -1
			}
		}
		for n, s := range o.out {
			if seen[s.shard][s.index] >= 0 {
				t.Fatalf("%s: shard %d sample %d at %d and %d", o.note, s.shard, s.index, seen[s.shard][s.index], n)
			}
			seen[s.shard][s.index] = n
		}
		if len(o.out) != len(sequence(infos, perm)) {
			t.Fatalf("%s: %d samples, want %d", o.note, len(o.out), len(sequence(infos, perm)))
		}
	}
	so, err := plan.NewOrder(infos, plan.OrderConfig{Seed: p.seed, Epoch: p.epoch, Shuffle: true, Lanes: p.lanes, Window: window(p, 110_000)})
	if err != nil {
		t.Fatal(err)
	}
	for n, s := range nw.out {
		if i, j := so.At(int64(n)); i != s.shard || j != s.index {
			t.Fatalf("position %d: windows give %v, At gives shard %d sample %d", n, s, i, j)
		}
	}
	if old.held != 611 || nw.held > 612 {
		t.Errorf("held: old %d, new %d; want 611 and at most 612 samples of 110 KB in 64 MiB", old.held, nw.held)
	}
}

func TestRun(t *testing.T) {
	var b bytes.Buffer
	if err := run(&b, []dataset{{"tiny", 5, 70, 1000}}, defaults()); err != nil {
		t.Fatal(err)
	}
	if lines := strings.Count(b.String(), "\n"); lines != 4 {
		t.Errorf("%d lines, want a header, a rule and 2 rows:\n%s", lines, b.String())
	}
}
