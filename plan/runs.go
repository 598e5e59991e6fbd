package plan

import (
	"fmt"
	"strconv"
	"strings"
)

// MaxWorld is the largest world size a resume state's runs may name.
const MaxWorld = 1 << 20

// FormatRuns returns runs in the form of a resume state's runs (shardload.State.Runs).
func FormatRuns(runs []Run) string {
	var b strings.Builder
	for i, r := range runs {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, "%dx%d", r.World, r.Consumed)
	}
	return b.String()
}

// ParseRuns parses a resume state's runs (shardload.State.Runs): WORLDxCONSUMED,
// comma-separated. The error wraps ErrBadRuns.
func ParseRuns(s string) ([]Run, error) {
	if s == "" {
		return nil, nil
	}
	var runs []Run
	for part := range strings.SplitSeq(s, ",") {
		w, c, ok := strings.Cut(part, "x")
		world, err1 := strconv.Atoi(w)
		consumed, err2 := strconv.ParseInt(c, 10, 64)
		if !ok || err1 != nil || err2 != nil || world < 1 || world > MaxWorld || consumed < 0 {
			return nil, fmt.Errorf("%w: runs %q: %q is not WORLDxCONSUMED (a world of 1 to %d)", ErrBadRuns, s, part, MaxWorld)
		}
		runs = append(runs, Run{World: world, Consumed: consumed})
	}
	return runs, nil
}

// Replayable returns the batches to replay (read again and drop) to resume, after
// batches of them, an epoch whose batches follow the data (planned from estimated
// counts): only runs all of a job of world ranks with batches of batchSize, which
// consumed those batches' samples, can be resumed so; ok is false otherwise.
func Replayable(runs []Run, batches, world, batchSize int) (n int, ok bool) {
	if len(runs) == 0 || batches < 0 {
		return 0, false
	}
	for _, r := range runs {
		if r.World != world {
			return 0, false
		}
	}
	consumed := runs[len(runs)-1].Consumed
	full := int64(batches) * int64(batchSize)
	if consumed == full || consumed < full && full-consumed < int64(batchSize) {
		return batches, true
	}
	return 0, false
}

// Advance returns runs after a job of world ranks consumed consumed more samples.
func Advance(runs []Run, world int, consumed int64) []Run {
	if n := len(runs); n > 0 && runs[n-1].World == world {
		runs[n-1].Consumed += consumed
		return runs
	}
	return append(runs, Run{World: world, Consumed: consumed})
}
