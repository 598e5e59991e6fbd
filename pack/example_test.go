package pack_test

import (
	"fmt"

	"github.com/shardload/shardload/pack"
)

// A corpus of four documents packed into rows of 8 tokens with eos 1 and pad 0,
// dealt to two ranks taking one row per batch, then resumed on one rank.
func Example() {
	spec, err := pack.ParseSpec("tokens.npy:8:eos=1:pad=0")
	if err != nil {
		panic(err)
	}
	// The epoch's documents in its order: document i's tokens are 10*(i+1), +1, ...
	lens := []int64{5, 11, 0, 3}
	layout, err := pack.NewLayout(spec, len(lens), func(i int) int64 { return lens[i] })
	if err != nil {
		panic(err)
	}
	fmt.Println(spec, "tokens:", layout.Tokens(), "rows:", layout.Rows())

	tokens := func(p pack.Piece, dst []int64) error {
		for j := range dst {
			dst[j] = int64(10*(p.Doc+1)) + p.From + int64(j)
		}
		return nil
	}
	filler, err := pack.NewFiller(spec, 1)
	if err != nil {
		panic(err)
	}
	b := &pack.Batch{
		InputIDs:    make([]int64, filler.Tokens()),
		PositionIDs: make([]int64, filler.Tokens()),
		CuSeqlens:   make([]int32, 0, filler.MaxCuSeqlens()),
	}
	var pieces []pack.Piece
	show := func(d pack.Deal) {
		for s := range d.BatchesPerRank() {
			for rank := range d.World {
				from, to, pad := d.RowsOf(rank, s)
				pieces = layout.Pieces(from, to, pieces[:0])
				if err := filler.Fill(b, pieces, tokens); err != nil {
					panic(err)
				}
				fmt.Printf("world %d batch %d rank %d: rows [%d,%d), %d pad rows\n", d.World, s, rank, from, to, pad)
				fmt.Printf("  input_ids %v position_ids %v\n", b.InputIDs, b.PositionIDs)
				fmt.Printf("  cu_seqlens %v max_seqlen %d\n", b.CuSeqlens, b.MaxSeqlen)
			}
		}
	}
	// Row 2 holds the end of document 1 and its eos, document 2 (its eos alone),
	// document 3 and its eos, then the pad, a segment of its own after an eos. Rank 1
	// has no row left in batch 1 and yields a row of pad, as many batches as rank 0.
	deal := pack.Deal{World: 2, BatchSize: 1, Rows: layout.Rows()}
	show(deal)

	// After one batch on each of the 2 ranks, the state is row 2: one rank resumes there.
	state := deal.Position(1)
	fmt.Println("state after 1 batch:", state)
	show(pack.Deal{World: 1, BatchSize: 1, Rows: layout.Rows(), Start: state})
	// Output:
	// tokens.npy:8:eos=1:pad=0 tokens: 23 rows: 3
	// world 2 batch 0 rank 0: rows [0,1), 0 pad rows
	//   input_ids [10 11 12 13 14 1 20 21] position_ids [0 1 2 3 4 5 0 1]
	//   cu_seqlens [0 6 8] max_seqlen 6
	// world 2 batch 0 rank 1: rows [1,2), 0 pad rows
	//   input_ids [22 23 24 25 26 27 28 29] position_ids [0 1 2 3 4 5 6 7]
	//   cu_seqlens [0 8] max_seqlen 8
	// world 2 batch 1 rank 0: rows [2,3), 0 pad rows
	//   input_ids [30 1 1 40 41 42 1 0] position_ids [0 1 0 0 1 2 3 0]
	//   cu_seqlens [0 2 3 7 8] max_seqlen 4
	// world 2 batch 1 rank 1: rows [3,3), 1 pad rows
	//   input_ids [0 0 0 0 0 0 0 0] position_ids [0 1 2 3 4 5 6 7]
	//   cu_seqlens [0 8] max_seqlen 8
	// state after 1 batch: 2
	// world 1 batch 0 rank 0: rows [2,3), 0 pad rows
	//   input_ids [30 1 1 40 41 42 1 0] position_ids [0 1 0 0 1 2 3 0]
	//   cu_seqlens [0 2 3 7 8] max_seqlen 4
}
