package plan_test

import (
	"testing"

	"github.com/shardload/shardload/plan"
	"github.com/shardload/shardload/shard"
)

// A span's bytes run from its first sample's offset to the next span's, or to the
// shard's end; without offsets from the shard's start, in proportion of samples.
func TestSpanRange(t *testing.T) {
	shards := []shard.Info{
		{Samples: 4, Size: 5120, Offsets: []int64{0, 1024, 2048, 3072}},
		{Samples: 4, Size: 4000},
	}
	for _, tc := range []struct {
		sp       plan.Span
		off, end int64
	}{
		{plan.Span{Shard: 0, Skip: 0, Take: 4}, 0, 5120},
		{plan.Span{Shard: 0, Skip: 1, Take: 2}, 1024, 3072},
		{plan.Span{Shard: 0, Skip: 2, Take: 2}, 2048, 5120},
		{plan.Span{Shard: 1, Skip: 0, Take: 2}, 0, 2000},
		{plan.Span{Shard: 1, Skip: 2, Take: 2}, 0, 4000},
	} {
		if off, end := plan.SpanRange(shards, tc.sp); off != tc.off || end != tc.end {
			t.Errorf("%+v: [%d, %d), want [%d, %d)", tc.sp, off, end, tc.off, tc.end)
		}
	}
	if plan.PartRequests(0, 8) != 1 || plan.PartRequests(8, 8) != 1 || plan.PartRequests(9, 8) != 2 {
		t.Error("PartRequests")
	}
}

// The cost of a single rank's plan over every shard is every shard's bytes, one span
// each when it reads them in order.
func TestCostOf(t *testing.T) {
	var shards []shard.Info
	for i := range 10 {
		offs := make([]int64, 8)
		for j := range offs {
			offs[j] = int64(j) * 512
		}
		shards = append(shards, shard.Info{URL: string(rune('a' + i)), Samples: 8, Size: 8*512 + 1024, Offsets: offs})
	}
	p, err := plan.New(shards, plan.Config{BatchSize: 4})
	if err != nil {
		t.Fatal(err)
	}
	c := plan.CostOf(&p, shards, 4, 1<<20, 4, 2)
	if c.Bytes != 10*(8*512+1024) || c.Spans != 10 || c.Requests != 10 || len(c.Shards) != 10 || c.StartRequests != 2 {
		t.Errorf("cost %+v", c)
	}
	if c.FirstBatchBytes <= 0 || c.FirstBatchBytes > c.Bytes {
		t.Errorf("first batch bytes %d of %d", c.FirstBatchBytes, c.Bytes)
	}
}
