package tune

import (
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Counts are a loader's counters as the tuner reads them: samples and batches
// delivered, and the nanoseconds its consumer waited and its workers fetched.
type Counts struct {
	Samples, Batches, Wait, Fetch int64
}

// Shared is a tuner that the loaders of a job's epochs use one after another (the
// library's Tuner): each loader starts where the last one's settings ended, and the
// intervals of loaders shorter than one are judged together. Its methods are safe
// for concurrent use.
type Shared struct {
	mu    sync.Mutex
	t     *Tuner
	acc   span // the interval so far
	steps int  // intervals judged
}

// span is what loaders did over part of an interval.
type span struct {
	dt        time.Duration
	c         Counts
	idle, cpu uint64 // the machine's idle and total CPU ticks
}

// Start starts the tuner at k for a loader, keeping what it learnt of earlier ones.
func (s *Shared) Start(k Knobs, pins Pins, lim Limits) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.t == nil {
		s.t = New(k, pins, lim)
	} else {
		s.t.Restart(k, pins, lim)
	}
}

// Knobs returns the knobs in effect (a change on trial too); zero before Start.
func (s *Shared) Knobs() Knobs {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.t == nil {
		return Knobs{}
	}
	return s.t.Knobs()
}

// Kept returns the knobs kept last (while a change is on trial, those before it),
// the changes kept and whether the last round of trials kept none; ok is false
// before Start.
func (s *Shared) Kept() (k Knobs, changes int, settled, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.t == nil {
		return Knobs{}, 0, false, false
	}
	return s.t.Kept(), s.t.Changes(), s.t.Settled(), true
}

// Steps returns the intervals judged so far.
func (s *Shared) Steps() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.steps
}

// Loop is one loader's run of a Shared tuner.
type Loop struct {
	Interval time.Duration // how often the loader is looked at
	// MinSamples: an interval lasts until this many samples came (at most four
	// Intervals): the loader yields a window's samples once most of them are in.
	MinSamples int64
	Read       func() Counts        // the loader's counters now
	Apply      func(Knobs)          // sets the knobs the tuner moved to
	Kept       func(Knobs, float64) // a change was kept: the knobs before, the rate
}

// Run runs the loop until done is closed: every Interval it adds what the loader did
// to the tuner's interval and, when that is long enough, steps the tuner and applies
// the knobs it returns.
func (s *Shared) Run(l Loop, done <-chan struct{}) {
	tick := time.NewTicker(l.Interval)
	defer tick.Stop()
	type snap struct {
		at        time.Time
		c         Counts
		idle, cpu uint64
	}
	take := func() snap {
		n := snap{at: time.Now(), c: l.Read()}
		n.idle, n.cpu, _ = CPUTimes()
		return n
	}
	prev := take()
	add := func(step bool) {
		cur := take()
		s.mu.Lock()
		a := &s.acc
		a.dt += cur.at.Sub(prev.at)
		a.c.Samples += cur.c.Samples - prev.c.Samples
		a.c.Batches += cur.c.Batches - prev.c.Batches
		a.c.Wait += cur.c.Wait - prev.c.Wait
		a.c.Fetch += cur.c.Fetch - prev.c.Fetch
		if cur.cpu >= prev.cpu && cur.idle >= prev.idle {
			a.idle += cur.idle - prev.idle
			a.cpu += cur.cpu - prev.cpu
		}
		prev = cur
		if !step || a.dt < l.Interval || (a.c.Samples < l.MinSamples && a.dt < 4*l.Interval) {
			s.mu.Unlock()
			return
		}
		k0, kept := s.t.Knobs(), s.t.Changes()
		rate := float64(a.c.Samples) / a.dt.Seconds()
		k := s.t.Step(Observation{
			Rate:       rate,
			Bound:      float64(a.c.Wait) >= 0.05*float64(a.dt),
			FetchShare: min(float64(a.c.Fetch)/(float64(max(k0.Workers, 1))*float64(a.dt)), 1),
			Saturated:  a.cpu > 0 && float64(a.idle) < BusyIdle*float64(a.cpu),
		})
		s.acc = span{}
		s.steps++
		keptNow := s.t.Changes() > kept
		s.mu.Unlock()
		if keptNow && l.Kept != nil {
			l.Kept(k0, rate)
		}
		if k != k0 {
			l.Apply(k)
		}
	}
	for {
		select {
		case <-done:
			add(false)
			return
		case <-tick.C:
			add(true)
		}
	}
}

// CPUTimes returns the machine's idle and total CPU time so far, in clock ticks,
// from /proc/stat; ok is false where there is none.
func CPUTimes() (idle, total uint64, ok bool) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0, false
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 5 || f[0] != "cpu" {
		return 0, 0, false
	}
	for i, v := range f[1:] {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return 0, 0, false
		}
		total += n
		if i == 3 || i == 4 { // idle, iowait
			idle += n
		}
	}
	return idle, total, true
}
