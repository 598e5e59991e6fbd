package pipeline

import (
	"errors"
	"fmt"
	"math"
)

// Policy says what happens when a sample or shard is bad.
type Policy int

const (
	// Fail stops the loader at the first bad sample or shard: Next returns the error.
	Fail Policy = iota
	// Skip leaves bad samples (and the rest of a bad shard) out, logs each once with
	// shard URL, key and cause, counts them, and fails only when more than
	// the error budget (ErrorBudget) allows were skipped.
	Skip
)

// String returns "fail" or "skip".
func (p Policy) String() string {
	if p == Skip {
		return "skip"
	}
	return "fail"
}

// ParsePolicy parses "fail" or "skip".
func ParsePolicy(s string) (Policy, error) {
	switch s {
	case "fail":
		return Fail, nil
	case "skip":
		return Skip, nil
	}
	return Fail, fmt.Errorf("shardload: error policy %q: want fail or skip", s)
}

// ErrorBudget bounds what the Skip policy may leave out of one epoch of the whole job: the
// samples and shards of every rank together, so that a rank reading a few shards of a
// large job is not failed by the first bad one. A rank fails with ErrErrorBudget when
// the samples (or shards) it skipped exceed the larger of Fraction times the job's
// samples (shards) and Samples (Shards). Each rank counts its own skips against the
// job's budget: ranks do not talk to each other, so a job whose ranks all skip may
// leave out up to World times the budget. The zero ErrorBudget allows nothing.
type ErrorBudget struct {
	// Fraction of the job's samples, and of its shards, in [0, 1].
	Fraction float64
	// Samples and Shards are counts allowed whatever the fraction gives.
	Samples, Shards int64
}

// String says what the budget allows, e.g. "1% of the job's samples or shards" or
// "no skips".
func (b ErrorBudget) String() string {
	return NewBudget(b.Fraction, b.Samples, b.Shards, 0, 0).Text
}

// Check returns what is wrong with b (a fraction outside [0, 1], negative counts),
// nil when nothing is.
func (b ErrorBudget) Check() error {
	var errs []error
	if math.IsNaN(b.Fraction) || b.Fraction < 0 || b.Fraction > 1 {
		errs = append(errs, fmt.Errorf("ErrorBudget.Fraction %g outside [0, 1]", b.Fraction))
	}
	if b.Samples < 0 || b.Shards < 0 {
		errs = append(errs, fmt.Errorf("ErrorBudget counts are negative (%d samples, %d shards)", b.Samples, b.Shards))
	}
	return errors.Join(errs...)
}
