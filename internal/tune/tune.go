// Package tune is the loader's autotuner: a hill climber over the settings that do
// not change what the loader yields (worker count, queue bytes per open shard, the
// fetch parts' parallelism and size). It sees one observation per interval (the
// samples the loader delivered per second, and whether the consumer waited for it)
// and tries one change at a time, keeping a change that raised the rate and undoing
// one that did not. It never proposes settings that Fits refuses (the memory budget).
//
// The package has no clock and no goroutine: the loader calls Step at the end of
// each interval, so that the tuner can be tested against a model of a pipeline.
package tune

import "fmt"

// Knobs are the settings the tuner changes: the one definition of them, which the
// pipeline reads as it goes and the loader reports.
type Knobs struct {
	// Workers is the most shards fetched, inflated and decoded at the same moment.
	Workers int `json:"workers"`
	// ReadAhead is the shards opened beyond the lanes, ahead of the order.
	ReadAhead int `json:"read_ahead"`
	// QueueBytes is the decoded bytes waiting per open shard.
	QueueBytes int64 `json:"queue_bytes"`
	// FetchParallel and FetchPartSize are the remote reads' parts in flight per
	// shard and their size.
	FetchParallel int   `json:"fetch_parallel"`
	FetchPartSize int64 `json:"fetch_part_size"`
}

func (k Knobs) String() string {
	return fmt.Sprintf("workers %d, read-ahead %d, queue %d KiB, fetch %d x %d KiB", k.Workers, k.ReadAhead, k.QueueBytes>>10, k.FetchParallel, k.FetchPartSize>>10)
}

// Knob names one of Knobs' settings.
type Knob uint8

// The knobs, in Knobs' order.
const (
	Workers Knob = iota
	ReadAhead
	QueueBytes
	FetchParallel
	FetchPartSize
	numKnobs
)

// Pins is the set of knobs the user set: the tuner leaves them alone.
type Pins uint8

// AllPins pins every knob.
const AllPins = Pins(1<<numKnobs - 1)

// Pinned reports whether k is in p.
func (p Pins) Pinned(k Knob) bool { return p&(1<<k) != 0 }

// With returns p with k in it when set.
func (p Pins) With(k Knob, set bool) Pins {
	if set {
		return p | 1<<k
	}
	return p
}

// Limits bound the knobs.
type Limits struct {
	// Lanes is the shards the order reads side by side: Workers is at most Lanes +
	// ReadAhead (more workers than open shards do nothing), and ReadAhead at most
	// MaxReadAhead times Lanes.
	Lanes int
	// Fetch says whether the fetch knobs matter (some shards are remote).
	Fetch bool
	// Fits reports whether k stays within the memory budget.
	Fits func(k Knobs) bool
}

// Bounds of the knobs. MinQueueBytes is the least a loader lowers a default queue
// to when it does not fit its budget; the others bound the tuner's rises.
const (
	MinQueueBytes = 256 << 10
	MaxQueueBytes = 256 << 20
	MaxPartSize   = 64 << 20
	MaxParallel   = 16
	MaxReadAhead  = 8 // times the lanes
)

// Observation is what the loader saw over one interval.
type Observation struct {
	// Rate is the samples the loader delivered per second.
	Rate float64
	// Bound says the consumer waited for the loader for a noticeable share of the
	// interval: the loader limited the rate, so its settings can raise it. When the
	// consumer did not wait, no setting would deliver more, and the tuner holds.
	Bound bool
	// FetchShare is the share of the workers' time spent waiting for the source: near
	// 1, the shards arrive slower than the workers decode them (more workers and
	// parts help); near 0, the workers' CPU time is what limits.
	FetchShare float64
	// Saturated says the machine's CPUs had little idle time (under BusyIdle). More
	// workers, read-ahead, parts or larger parts cannot raise the rate then (what
	// waits for the source waits for a busy CPU, such as a store on the same
	// machine): the tuner does not try them, only deeper queues and one stream
	// instead of parts.
	Saturated bool
}

// BusyIdle is the idle share of the machine's CPU time under which it counts as
// saturated (Observation.Saturated).
const BusyIdle = 0.15

// Gain is the rise in rate that a change must show to be kept.
const (
	Gain = 0.05
	// Sure is the ratio of rates past which one interval is enough to keep a change
	// (a noisy machine's intervals differ by less).
	Sure = 1.25
)

// move is a change of one knob: up (doubling; 4x for workers and read-ahead while
// the workers mostly wait), or, for the fetch parts only, down to one stream. Rounds
// never lower the other knobs (see round).
type move struct {
	knob int // 0 workers, 1 queue, 2 parallel, 3 part size, 4 read-ahead, 5 the jump (workers and read-ahead)
	up   bool
}

type phase int

const (
	base    phase = iota // measuring the current knobs
	settle               // a change was made: the next interval is not judged
	trial                // measuring the change
	confirm              // the change measured faster once: measuring it again
	hold                 // converged: waiting before the next round
)

// Tuner is the hill climber. It is not safe for concurrent use.
type Tuner struct {
	cur, prev Knobs
	factor    int // how far a round's concurrency moves go: 2, or 4 while the workers mostly wait
	pins      Pins
	lim       Limits

	phase     phase
	baseRate  float64
	moves     []move // the round's moves still to try
	tried     move
	kept      bool // a move was kept this round
	holdLeft  int  // intervals still to hold
	holdFor   int  // the next hold's length; doubles while rounds keep nothing
	heldRate  float64
	changes   int
	busy      bool    // the round's CPU was saturated: no concurrency moves
	trialRate float64 // the first measurement of a change being confirmed
}

// Hold lengths, in intervals.
const (
	firstHold = 8
	maxHold   = 64
)

// New returns a tuner starting at start.
func New(start Knobs, pins Pins, lim Limits) *Tuner {
	if lim.Fits == nil {
		lim.Fits = func(Knobs) bool { return true }
	}
	return &Tuner{cur: start, pins: pins, lim: lim, holdFor: firstHold, factor: 2}
}

// Restart continues the tuner in a new loader: from start, within lim. A trial the
// last loader left unjudged is dropped; a hold goes on.
func (t *Tuner) Restart(start Knobs, pins Pins, lim Limits) {
	if lim.Fits == nil {
		lim.Fits = func(Knobs) bool { return true }
	}
	t.cur, t.pins, t.lim = start, pins, lim
	if t.phase == settle || t.phase == trial || t.phase == confirm {
		t.phase = base
	}
}

// Knobs returns the current settings.
func (t *Tuner) Knobs() Knobs { return t.cur }

// Kept returns the settings the tuner last kept: Knobs, or while a change is on
// trial, the settings before it.
func (t *Tuner) Kept() Knobs {
	if t.phase == settle || t.phase == trial || t.phase == confirm {
		return t.prev
	}
	return t.cur
}

// Changes returns how many changes the tuner kept.
func (t *Tuner) Changes() int { return t.changes }

// Settled reports whether the tuner is holding: its last round kept nothing.
func (t *Tuner) Settled() bool { return t.phase == hold }

// Step takes the observation of the interval that just ended and returns the
// settings for the next one.
func (t *Tuner) Step(o Observation) Knobs {
	switch t.phase {
	case hold:
		t.holdLeft--
		// A rate that fell by a fifth while the loader limits is a new workload
		// (cache warm, another store): start a round at once.
		if o.Bound && t.heldRate > 0 && o.Rate < 0.8*t.heldRate {
			t.holdLeft = 0
		}
		if t.holdLeft > 0 {
			return t.cur
		}
		t.phase = base
		fallthrough
	case base:
		if !o.Bound {
			return t.cur // the consumer is the limit: nothing to gain
		}
		t.baseRate = o.Rate
		if t.moves == nil {
			t.moves = t.round(o.FetchShare)
			t.factor = 2
			if o.FetchShare >= 0.9 {
				t.factor = 4
			}
			t.busy = o.Saturated
			t.kept = false
		}
		t.next()
	case settle:
		t.phase = trial
	case trial, confirm:
		need := 1 + Gain
		if o.Bound && o.Rate >= need*t.baseRate && o.Rate < Sure*t.baseRate && t.phase == trial {
			// Faster once, by less than noise can explain away: measured again before
			// it is kept, so that one lucky interval on a noisy machine does not keep
			// a change.
			t.phase = confirm
			t.trialRate = o.Rate
			return t.cur
		}
		if t.phase == confirm && o.Bound {
			// Kept when the two intervals together are faster.
			o.Rate = (o.Rate + t.trialRate) / 2
		}
		if !o.Bound || o.Rate >= need*t.baseRate {
			// Kept: faster, or fast enough that the consumer no longer waits.
			t.changes++
			t.kept = true
			t.baseRate = o.Rate
			if !o.Bound {
				t.moves = nil
				t.rest(o.Rate)
				return t.cur
			}
			// The same move again first: a knob that helped may help more.
			t.moves = append([]move{t.tried}, t.moves...)
		} else {
			t.cur = t.prev
		}
		t.phase = base
		t.next()
	}
	return t.cur
}

// next makes the round's next move that can be made, or ends the round.
func (t *Tuner) next() {
	for len(t.moves) > 0 {
		m := t.moves[0]
		t.moves = t.moves[1:]
		if k, ok := t.apply(m); ok {
			t.prev, t.cur, t.tried = t.cur, k, m
			// More workers or read-ahead act at once; queues and parts only on the
			// shards opened next, so the interval after such a change is not judged.
			t.phase = settle
			if m.knob == 0 || m.knob == 4 || m.knob == 5 {
				t.phase = trial
			}
			return
		}
	}
	t.moves = nil
	if t.kept {
		// Something helped: another round at once, from the new settings.
		t.phase = base
		t.holdFor = firstHold
		return
	}
	t.rest(t.baseRate)
}

// rest holds the settings for a while.
func (t *Tuner) rest(rate float64) {
	t.phase, t.holdLeft, t.heldRate = hold, t.holdFor, rate
	t.holdFor = min(2*t.holdFor, maxHold)
}

// round returns the moves of a round, the likeliest first: when the workers mostly
// wait for the source, more of them and more parts; otherwise deeper queues first
// (which smooth the decode of uneven samples), and one stream instead of parts
// (whose copies cost CPU). Fewer workers or shallower queues are never tried: each
// trial of a step that loses costs an interval at the lower rate, and neither
// raises the rate of a pipeline that has the memory for them (Go schedules more
// workers than cores at no cost).
func (t *Tuner) round(fetchShare float64) []move {
	if fetchShare >= 0.9 {
		// The workers wait nearly all the time (and the CPU is not saturated): first
		// the jump to as many readers as the budget holds.
		return []move{{5, true}, {0, true}, {4, true}, {2, true}, {3, true}, {1, true}, {2, false}}
	}
	if fetchShare >= 0.5 {
		return []move{{0, true}, {4, true}, {2, true}, {3, true}, {1, true}, {2, false}}
	}
	return []move{{1, true}, {0, true}, {2, false}, {3, true}, {2, true}, {4, true}}
}

// apply returns the knobs after m, and false when m changes nothing, is pinned, or
// does not fit.
func (t *Tuner) apply(m move) (Knobs, bool) {
	k := t.cur
	if t.busy && m.up && m.knob != 1 {
		return k, false // no idle CPU for more readers, or for larger parts' page faults
	}
	switch m.knob {
	case 0:
		if t.pins.Pinned(Workers) {
			return k, false
		}
		k.Workers = min(t.factor*k.Workers, t.lim.Lanes+k.ReadAhead)
	case 1:
		if t.pins.Pinned(QueueBytes) {
			return k, false
		}
		k.QueueBytes = min(2*k.QueueBytes, MaxQueueBytes)
	case 2:
		if t.pins.Pinned(FetchParallel) || !t.lim.Fetch {
			return k, false
		}
		if m.up {
			k.FetchParallel = min(2*k.FetchParallel, MaxParallel)
		} else {
			// Straight to one stream: what costs is the parts' copy, not their number.
			k.FetchParallel = 1
		}
	case 3:
		if t.pins.Pinned(FetchPartSize) || !t.lim.Fetch || k.FetchParallel <= 1 {
			return k, false
		}
		k.FetchPartSize = min(2*k.FetchPartSize, MaxPartSize)
	case 4:
		// More shards open, and as many more workers to read them: a shard opened
		// ahead with no worker free waits like the rest.
		if t.pins.Pinned(ReadAhead) {
			return k, false
		}
		open := t.lim.Lanes + k.ReadAhead
		k.ReadAhead = min(max(t.factor*k.ReadAhead, t.lim.Lanes), MaxReadAhead*t.lim.Lanes)
		if !t.pins.Pinned(Workers) {
			k.Workers = max(min(k.Workers*(t.lim.Lanes+k.ReadAhead)/open, t.lim.Lanes+k.ReadAhead), 1)
		}
	case 5:
		// The jump: as many shards open as the read-ahead allows (9 times the
		// lanes), a worker for each, lowered until they fit the budget. Workers that
		// wait for the source 90% of their time on a CPU with room to spare are far
		// from enough: stepping up 4x at a time took the intervals a short job has
		// (the latency case in BENCHMARKS.md), and readers beyond what the source
		// needs cost their queues' memory, within the budget, and no CPU.
		if t.pins.Pinned(Workers) || t.pins.Pinned(ReadAhead) {
			return k, false
		}
		// Shards in flight stand in for parts within a shard: where the parts are
		// what does not fit, the jump reads each shard as one stream.
		open := (1 + MaxReadAhead) * t.lim.Lanes
		for ; open > t.lim.Lanes; open = max(open*3/4, t.lim.Lanes) {
			j := k
			j.ReadAhead, j.Workers = open-t.lim.Lanes, open
			if !t.lim.Fits(j) && !t.pins.Pinned(FetchParallel) {
				j.FetchParallel = 1
			}
			if t.lim.Fits(j) {
				k = j
				break
			}
		}
	}
	if k == t.cur || !t.lim.Fits(k) {
		return k, false
	}
	return k, true
}
