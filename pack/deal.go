package pack

import (
	"fmt"
	"math"
)

// Deal deals an epoch's rows to the ranks of a world, BatchSize rows per rank per
// batch, from row Start on. In each step s (every rank's s-th batch) the rows
// [Start + s*World*BatchSize, Start + (s+1)*World*BatchSize) are cut into World
// contiguous blocks of BatchSize rows and rank r takes block r, so a rank reads one
// contiguous run of the token stream per batch. Rows at or past Rows are all pad:
// every rank yields the same number of batches, BatchesPerRank.
//
// The state after every rank has taken k batches is the row Position(k); a Deal of
// any World and BatchSize starting at that row yields each row the first did not,
// once. World and BatchSize are at least 1, 0 <= Start <= Rows, and the rows of one
// step past Rows fit in an int64 (Check); the methods panic on a Deal that fails
// Check.
type Deal struct {
	// World is the number of ranks.
	World int
	// BatchSize is the number of rows in a rank's batch.
	BatchSize int
	// Rows is the number of rows in the epoch, Layout.Rows.
	Rows int64
	// Start is the row the epoch resumes at: 0 for a fresh epoch, a Position
	// otherwise, with no need to be a multiple of anything.
	Start int64
}

// Check reports whether the deal is valid, as ErrDeal.
func (d Deal) Check() error {
	switch {
	case d.World < 1:
		return fmt.Errorf("%w: world size %d", ErrDeal, d.World)
	case d.BatchSize < 1:
		return fmt.Errorf("%w: batch size %d", ErrDeal, d.BatchSize)
	case d.Rows < 0:
		return fmt.Errorf("%w: %d rows", ErrDeal, d.Rows)
	case d.Start < 0 || d.Start > d.Rows:
		return fmt.Errorf("%w: start row %d of an epoch of %d rows", ErrDeal, d.Start, d.Rows)
	case int64(d.World) > (math.MaxInt64-d.Rows)/int64(d.BatchSize):
		return fmt.Errorf("%w: %d ranks of %d rows past row %d overflow", ErrDeal, d.World, d.BatchSize, d.Rows)
	}
	return nil
}

func (d Deal) must() {
	if err := d.Check(); err != nil {
		panic(err.Error())
	}
}

// step is the number of rows all ranks take in one batch each.
func (d Deal) step() int64 { return int64(d.World) * int64(d.BatchSize) }

// BatchesPerRank is the number of batches every rank yields from Start to the end
// of the epoch: ceil((Rows-Start) / (World*BatchSize)).
func (d Deal) BatchesPerRank() int64 {
	d.must()
	left := d.Rows - d.Start
	if left == 0 {
		return 0
	}
	return (left-1)/d.step() + 1
}

// RowsOf gives the rows of rank's batch-th batch: the epoch's rows [from, to) and
// pad, the number of all-pad rows after them, to-from+pad being BatchSize. A batch
// at or past BatchesPerRank is all pad (from = to = Rows). It panics on a rank
// outside [0, World) or a negative batch.
func (d Deal) RowsOf(rank int, batch int64) (from, to int64, pad int) {
	d.must()
	if rank < 0 || rank >= d.World || batch < 0 {
		panic(fmt.Sprintf("pack: RowsOf rank %d batch %d in a world of %d", rank, batch, d.World))
	}
	if batch >= d.BatchesPerRank() {
		return d.Rows, d.Rows, d.BatchSize
	}
	first := d.Start + batch*d.step() + int64(rank)*int64(d.BatchSize)
	from = min(first, d.Rows)
	to = min(first+int64(d.BatchSize), d.Rows)
	return from, to, d.BatchSize - int(to-from)
}

// Position is the state after every rank has taken batchesTaken batches: the row
// Start + batchesTaken*World*BatchSize, clamped to Rows. Resuming with a Deal of any
// world size from it reads every remaining row once. It panics on a negative count.
func (d Deal) Position(batchesTaken int64) int64 {
	d.must()
	if batchesTaken < 0 {
		panic(fmt.Sprintf("pack: Position after %d batches", batchesTaken))
	}
	if batchesTaken >= d.BatchesPerRank() {
		return d.Rows
	}
	return d.Start + batchesTaken*d.step()
}
