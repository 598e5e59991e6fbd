package plan_test

import (
	"fmt"

	"github.com/shardload/shardload/plan"
	"github.com/shardload/shardload/shard"
)

// A rank's plan holds its spans; its windows are made again, one at a time, as they
// are read.
func ExamplePlan_Windows() {
	shards := []shard.Info{
		{URL: "s3://bucket/train-000000.tar", Samples: 300},
		{URL: "s3://bucket/train-000001.tar", Samples: 300},
	}
	p, err := plan.New(shards, plan.Config{Seed: 1, Rank: 1, World: 2, Shuffle: true, Lanes: 2, Window: 100, BatchSize: 50})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Printf("%d samples in %d batches, %d spans, %d windows\n", p.Samples, p.Batches, len(p.Spans), p.WindowCount)
	held := 0
	for w := range p.Windows() {
		held += int(w.Held)
	}
	fmt.Println("samples held by the windows:", held)
	// Output:
	// 300 samples in 6 batches, 4 spans, 4 windows
	// samples held by the windows: 300
}
