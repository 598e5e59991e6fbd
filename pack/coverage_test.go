package pack

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// specs of the coverage tests: no eos, eos with its default pad, eos and a pad of
// its own.
var coverageSpecs = []string{
	"tokens:7",
	"tokens:7:pad=3",
	"tokens.npy:8:eos=1",
	"tokens:5:eos=1:pad=2",
	"tokens:1:eos=1:pad=2",
	"tokens:1",
}

// TestCoverage checks token by token that the rows every rank builds through
// RowsOf, Pieces and Fill are the reference stream cut into rows, for world sizes 1
// to 3 and batch sizes 1 to 4: each row once, pad rows after the epoch's end, and
// the same number of batches on every rank.
func TestCoverage(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, s := range coverageSpecs {
		spec, err := ParseSpec(s)
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range []int{1, 3, BlockDocs} {
			c := randomCorpus(r, 40+r.IntN(40), spec.SeqLen)
			want := refRows(spec, c)
			l, err := newLayout(spec, len(c.lens), c.length, k)
			if err != nil {
				t.Fatal(err)
			}
			if l.Rows() != int64(len(want)) {
				t.Fatalf("%s: %d rows, want %d", s, l.Rows(), len(want))
			}
			for world := 1; world <= 3; world++ {
				for bs := 1; bs <= 4; bs++ {
					t.Run(fmt.Sprintf("%s/k=%d/world=%d/batch=%d", s, k, world, bs), func(t *testing.T) {
						d := Deal{World: world, BatchSize: bs, Rows: l.Rows()}
						seen := runDeal(t, l, c, d, d.BatchesPerRank(), want, bs%2 == 0)
						for row, n := range seen {
							if n != 1 {
								t.Fatalf("row %d yielded %d times", row, n)
							}
						}
					})
				}
			}
		}
	}
}

// runDeal runs batches [0, batches) of every rank of d, checking each against the
// reference, and counts how many times each row of the epoch was yielded.
func runDeal(t *testing.T, l *Layout, c *corpus, d Deal, batches int64, want [][]tokenRef, int32IDs bool) []int {
	t.Helper()
	spec := l.Spec()
	f, err := NewFiller(spec, d.BatchSize)
	if err != nil {
		t.Fatal(err)
	}
	seen := make([]int, len(want))
	b := newBatch(f, int32IDs)
	var pieces []Piece
	for rank := 0; rank < d.World; rank++ {
		for s := int64(0); s < batches; s++ {
			from, to, pad := d.RowsOf(rank, s)
			if int(to-from)+pad != d.BatchSize {
				t.Fatalf("rank %d batch %d: rows [%d,%d) and %d pad in a batch of %d", rank, s, from, to, pad, d.BatchSize)
			}
			pieces = l.Pieces(from, to, pieces[:0])
			if err := f.Fill(b, pieces, c.tokens); err != nil {
				t.Fatalf("rank %d batch %d: %v", rank, s, err)
			}
			rows := append([][]tokenRef(nil), want[from:to]...)
			for range pad {
				rows = append(rows, padRow(spec))
			}
			checkBatch(t, spec, b, rows)
			for row := from; row < to; row++ {
				seen[row]++
			}
		}
		// The rank's next batch, if it took one, would be all pad: every rank has
		// the same number of batches.
		if from, to, pad := d.RowsOf(rank, d.BatchesPerRank()); from != to || pad != d.BatchSize {
			t.Fatalf("rank %d: batch %d past the end holds rows [%d,%d)", rank, d.BatchesPerRank(), from, to)
		}
	}
	return seen
}

// TestElastic takes k batches at world 2, resumes at world 3 (and other batch
// sizes) from the Position, and checks that the two runs together yield every row
// of the world-1 epoch exactly once.
func TestElastic(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for _, s := range coverageSpecs {
		spec, _ := ParseSpec(s)
		c := randomCorpus(r, 60, spec.SeqLen)
		want := refRows(spec, c)
		l, err := newLayout(spec, len(c.lens), c.length, 5)
		if err != nil {
			t.Fatal(err)
		}
		for _, bs := range []int{1, 2, 3} {
			first := Deal{World: 2, BatchSize: bs, Rows: l.Rows()}
			for k := int64(0); k <= first.BatchesPerRank(); k++ {
				pos := first.Position(k)
				if want := min(int64(k)*int64(2*bs), l.Rows()); pos != want {
					t.Fatalf("Position(%d) = %d, want %d", k, pos, want)
				}
				for _, bs2 := range []int{1, 4} {
					t.Run(fmt.Sprintf("%s/batch=%d/k=%d/then=%d", s, bs, k, bs2), func(t *testing.T) {
						seen := runDeal(t, l, c, first, k, want, false)
						second := Deal{World: 3, BatchSize: bs2, Rows: l.Rows(), Start: pos}
						if err := second.Check(); err != nil {
							t.Fatal(err)
						}
						more := runDeal(t, l, c, second, second.BatchesPerRank(), want, true)
						for row := range seen {
							if seen[row]+more[row] != 1 {
								t.Fatalf("row %d yielded %d times at world 2 and %d at world 3", row, seen[row], more[row])
							}
						}
					})
				}
			}
		}
	}
}
