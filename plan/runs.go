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
		if r.RanksPerNode > 0 {
			fmt.Fprintf(&b, "%d/%dx%d", r.World, r.RanksPerNode, r.Consumed)
			continue
		}
		fmt.Fprintf(&b, "%dx%d", r.World, r.Consumed)
	}
	return b.String()
}

// ParseRuns parses a resume state's runs (shardload.State.Runs): WORLDxCONSUMED,
// comma-separated; the first may be WORLD/RANKSPERNODExCONSUMED (an epoch whose
// order keeps shards on nodes, Run.RanksPerNode). The error wraps ErrBadRuns.
func ParseRuns(s string) ([]Run, error) {
	if s == "" {
		return nil, nil
	}
	var runs []Run
	for part := range strings.SplitSeq(s, ",") {
		w, c, ok := strings.Cut(part, "x")
		w, r, nodes := strings.Cut(w, "/")
		world, err1 := strconv.Atoi(w)
		consumed, err2 := strconv.ParseInt(c, 10, 64)
		perNode, err3 := 0, error(nil)
		if nodes {
			perNode, err3 = strconv.Atoi(r)
		}
		if !ok || err1 != nil || err2 != nil || err3 != nil || world < 1 || world > MaxWorld || consumed < 0 ||
			nodes && (len(runs) > 0 || perNode < 1 || perNode >= world) {
			return nil, fmt.Errorf("%w: runs %q: %q is not WORLDxCONSUMED (a world of 1 to %d; the first may be WORLD/RANKSPERNODExCONSUMED, fewer ranks per node than the world)", ErrBadRuns, s, part, MaxWorld)
		}
		runs = append(runs, Run{World: world, Consumed: consumed, RanksPerNode: perNode})
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
	return AdvanceRun(runs, Run{World: world, Consumed: consumed})
}

// AdvanceRun returns runs after a job of run.World ranks consumed run.Consumed more
// samples: run added to the last run when that has the same world size, else
// appended. Its RanksPerNode (Plan.RanksPerNode) is kept for an epoch's first run
// only.
func AdvanceRun(runs []Run, run Run) []Run {
	if n := len(runs); n > 0 && runs[n-1].World == run.World {
		runs[n-1].Consumed += run.Consumed
		return runs
	}
	if len(runs) > 0 {
		run.RanksPerNode = 0
	}
	return append(runs, run)
}
