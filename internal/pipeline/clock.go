package pipeline

// The clock of the stage times.

import (
	"sync/atomic"
	"time"
)

// clockBase anchors mono.
var clockBase = time.Now()

// mono returns a monotonic timestamp for stage times: one clock read, where time.Now
// takes two (wall and monotonic). The producers and the mixer take several per
// sample.
func mono() time.Duration { return time.Since(clockBase) }

func add(c *atomic.Int64, d time.Duration) { c.Add(int64(d)) }
