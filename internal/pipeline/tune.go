package pipeline

import (
	"time"

	"github.com/shardload/shardload/internal/tune"
)

// Tune runs the tuner s over the pipeline until done is closed: each interval it
// hands s what the pipeline delivered (the rate judged over minSamples at least)
// and applies the knobs s proposes (the remote reads' settings only when remote);
// kept is told each setting kept, with its rate.
func (pl *Pipeline) Tune(s *tune.Shared, interval time.Duration, minSamples int64, remote bool, kept func(tune.Knobs, float64), done <-chan struct{}) {
	c := &pl.C
	s.Run(tune.Loop{
		Interval:   interval,
		MinSamples: minSamples,
		Read: func() tune.Counts {
			return tune.Counts{Samples: c.Samples.Load(), Batches: c.Batches.Load(), Wait: c.Wait.Load(), Fetch: c.Fetch.Load()}
		},
		Apply: func(k tune.Knobs) { pl.SetKnobs(FetchKnobs(k, remote)) },
		Kept:  kept,
	}, done)
}

// FetchKnobs returns k with the remote reads' settings zeroed (the sources' own)
// when no shard is remote.
func FetchKnobs(k tune.Knobs, remote bool) tune.Knobs {
	if !remote {
		k.FetchParallel, k.FetchPartSize = 0, 0
	}
	return k
}
