package shardload

import (
	"context"
	"fmt"

	"github.com/shardload/shardload/plan"
	"github.com/shardload/shardload/shard"
)

// Stream is one dataset of a job that mixes several into each epoch (Config.Streams;
// see plan.Mix for the order it makes).
type Stream struct {
	// URLs are the stream's shard URLs or patterns (as Config.URLs); Shards, when
	// set, are its shards with their counts instead (as Config.Shards).
	URLs   []string     `json:"urls"`
	Shards []shard.Info `json:"-"`
	// Weight is the stream's share of an epoch's samples, relative to the other
	// streams' weights. Instead, Repeat (times its samples) or Choose (samples) set
	// its draws per epoch. With none of them, a stream gives all its samples once an
	// epoch. A stream drawn at fewer samples than it holds goes through them without
	// replacement across epochs.
	Weight float64 `json:"weight,omitempty"`
	Repeat float64 `json:"repeat,omitempty"`
	Choose int64   `json:"choose,omitempty"`
}

// mixOf returns the shards of cfg's streams, one stream after the other, counted
// exactly (a mix is planned from exact counts: see Count), and their mix.
func mixOf(ctx context.Context, cfg Config) ([]shard.Info, *plan.Mix, error) {
	m := &plan.Mix{Samples: cfg.EpochSamples, Batching: cfg.Batching}
	var infos []shard.Info
	for i, st := range cfg.Streams {
		c := cfg
		c.URLs, c.Shards, c.Streams = st.URLs, st.Shards, nil
		s, err := Count(ctx, c)
		if err != nil {
			return nil, nil, fmt.Errorf("stream %d: %w", i, err)
		}
		m.Streams = append(m.Streams, plan.Stream{First: len(infos), Count: len(s), Weight: st.Weight, Repeat: st.Repeat, Choose: st.Choose})
		infos = append(infos, s...)
	}
	return infos, m, nil
}
