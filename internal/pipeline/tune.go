package pipeline

import (
	"time"

	"github.com/shardload/shardload/internal/tune"
)

// Tune runs the tuner Params.Tuned over the pipeline until done is closed: each
// interval it hands the tuner what the pipeline delivered (the rate judged over
// minSamples at least) and applies the knobs it proposes (the remote reads' settings
// only when Params.Remote). The first setting kept is logged, once per logger.
func (pl *Pipeline) Tune(interval time.Duration, minSamples int64, done <-chan struct{}) {
	c, p := &pl.C, &pl.p
	p.Tuned.Run(tune.Loop{
		Interval:   interval,
		MinSamples: minSamples,
		Read: func() tune.Counts {
			return tune.Counts{Samples: c.Samples.Load(), Batches: c.Batches.Load(), Wait: c.Wait.Load(), Fetch: c.Fetch.Load()}
		},
		Apply: func(k tune.Knobs) { pl.SetKnobs(FetchKnobs(k, p.Remote)) },
		Kept: func(k0 tune.Knobs, rate float64) {
			// Once per logger: a loader process serves many ranks and epochs, whose
			// settings the metrics (shardload_session_setting) and bench's report show.
			pl.once("autotune", func() {
				p.Logf("shardload: rank %d: autotune kept %s: %.0f samples/s (the tuners' later changes are not logged: see the shardload_session_setting metrics, or bench's autotune line)", p.Rank, k0, rate)
			})
		},
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
