package plan_test

import (
	"testing"

	"github.com/shardload/shardload/plan"
)

// FuzzParseRuns: a State's runs parse without panicking, and what parses formats back
// to a string that parses to the same runs; Remaining takes any of them over an
// epoch without panicking, and what it leaves is never more than the epoch.
func FuzzParseRuns(f *testing.F) {
	for _, s := range []string{"", "4x1600", "4x1600,3x800", "1x0", "2y3", "x", "0x1", "3x-1", "1x99999999999999999999", "1048576x0,1048576x0", "4/2x1600,3x800", "4/4x1", "3x1,4/2x1"} {
		f.Add(s, int64(1000))
	}
	f.Fuzz(func(t *testing.T, s string, total int64) {
		runs, err := plan.ParseRuns(s)
		if err != nil {
			return
		}
		again, err := plan.ParseRuns(plan.FormatRuns(runs))
		if err != nil || len(again) != len(runs) {
			t.Fatalf("%q -> %v -> %q: %v", s, runs, plan.FormatRuns(runs), err)
		}
		for i := range runs {
			if again[i] != runs[i] {
				t.Fatalf("%q: run %d %v, again %v", s, i, runs[i], again[i])
			}
		}
		if total < 0 || total > 1<<40 {
			return
		}
		rest, err := plan.Remaining(total, runs)
		if err != nil {
			return
		}
		var n int64
		for _, r := range rest {
			if r.Start < 0 || r.End > total || r.Start >= r.End {
				t.Fatalf("%q over %d: range %v", s, total, r)
			}
			n += r.End - r.Start
		}
		if n > total {
			t.Fatalf("%q over %d: %d left", s, total, n)
		}
	})
}
