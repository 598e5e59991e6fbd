package shardload

import "github.com/shardload/shardload/internal/pipeline"

// Stats are a loader's counters and where its time went. Stage times are summed over
// the goroutines that spend them, so with several workers they can exceed Elapsed.
type Stats = pipeline.Stats

// StreamStats are a stream's figures in a mix of streams (Stats.Streams).
type StreamStats = pipeline.StreamStats

// StageNames lists the stages of Stats.Stages in pipeline order.
var StageNames = pipeline.StageNames
