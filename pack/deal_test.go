package pack

import (
	"errors"
	"math"
	"testing"
)

func TestDeal(t *testing.T) {
	// 10 rows, 2 ranks of 2 rows: steps of 4 rows, the last with 2 rows of pad on
	// rank 1 (rows 8,9 to rank 0).
	d := Deal{World: 2, BatchSize: 2, Rows: 10}
	if n := d.BatchesPerRank(); n != 3 {
		t.Fatalf("BatchesPerRank = %d", n)
	}
	type rows struct {
		from, to int64
		pad      int
	}
	want := [][]rows{
		{{0, 2, 0}, {4, 6, 0}, {8, 10, 0}},
		{{2, 4, 0}, {6, 8, 0}, {10, 10, 2}},
	}
	for rank, batches := range want {
		for s, w := range batches {
			from, to, pad := d.RowsOf(rank, int64(s))
			if (rows{from, to, pad}) != w {
				t.Errorf("RowsOf(%d, %d) = %d, %d, %d, want %v", rank, s, from, to, pad, w)
			}
		}
	}
	for k, w := range []int64{0, 4, 8, 10, 10} {
		if got := d.Position(int64(k)); got != w {
			t.Errorf("Position(%d) = %d, want %d", k, got, w)
		}
	}
	// Resuming at row 7 with 3 ranks of 1: rows 7, 8, 9, then nothing.
	d = Deal{World: 3, BatchSize: 1, Rows: 10, Start: 7}
	if d.BatchesPerRank() != 1 || d.Position(1) != 10 {
		t.Errorf("from 7: %d batches, position %d", d.BatchesPerRank(), d.Position(1))
	}
	if from, to, pad := d.RowsOf(2, 0); from != 9 || to != 10 || pad != 0 {
		t.Errorf("from 7, rank 2: %d %d %d", from, to, pad)
	}
	// A partial block: 2 ranks of 3 rows from row 8 of 10.
	d = Deal{World: 2, BatchSize: 3, Rows: 10, Start: 8}
	if from, to, pad := d.RowsOf(0, 0); from != 8 || to != 10 || pad != 1 {
		t.Errorf("partial block: %d %d %d", from, to, pad)
	}
	if from, to, pad := d.RowsOf(1, 0); from != 10 || to != 10 || pad != 3 {
		t.Errorf("all-pad block: %d %d %d", from, to, pad)
	}
	// Nothing left, or nothing at all.
	for _, d := range []Deal{{World: 4, BatchSize: 2, Rows: 10, Start: 10}, {World: 1, BatchSize: 1}} {
		if d.BatchesPerRank() != 0 || d.Position(0) != d.Rows || d.Position(5) != d.Rows {
			t.Errorf("%+v: %d batches", d, d.BatchesPerRank())
		}
	}
}

func TestDealCheck(t *testing.T) {
	for _, d := range []Deal{
		{World: 0, BatchSize: 1, Rows: 1},
		{World: 1, BatchSize: 0, Rows: 1},
		{World: 1, BatchSize: 1, Rows: -1},
		{World: 1, BatchSize: 1, Rows: 4, Start: 5},
		{World: 1, BatchSize: 1, Rows: 4, Start: -1},
		{World: math.MaxInt32, BatchSize: math.MaxInt32, Rows: math.MaxInt64 - 1<<61},
		{World: 2, BatchSize: 1, Rows: math.MaxInt64},
	} {
		if err := d.Check(); !errors.Is(err, ErrDeal) {
			t.Errorf("%+v: %v", d, err)
		}
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%+v: BatchesPerRank did not panic", d)
				}
			}()
			d.BatchesPerRank()
		}()
	}
	// The largest rows a step allows.
	d := Deal{World: 1, BatchSize: 1, Rows: math.MaxInt64 - 1, Start: math.MaxInt64 - 2}
	if err := d.Check(); err != nil {
		t.Fatal(err)
	}
	if from, to, pad := d.RowsOf(0, 0); from != d.Start || to != d.Rows || pad != 0 {
		t.Errorf("RowsOf near the end of int64: %d %d %d", from, to, pad)
	}
	for _, bad := range []func(){
		func() { d.RowsOf(1, 0) },
		func() { d.RowsOf(-1, 0) },
		func() { d.RowsOf(0, -1) },
		func() { d.Position(-1) },
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Error("no panic")
				}
			}()
			bad()
		}()
	}
}
