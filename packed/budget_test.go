package packed

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/shardload/shardload/megatron"
	"github.com/shardload/shardload/pack"
)

// With a small Memory the chunks read and not yet packed stay within half of it
// (one batch past it only when no other is in flight), and the batches are those
// of a large budget.
func TestReadBudget(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 1))
	var docs [][]int64
	for i := range 3000 {
		d := make([]int64, 1+r.IntN(300))
		for j := range d {
			d[j] = int64(i + j)
		}
		docs = append(docs, d)
	}
	dir := t.TempDir()
	bin, _ := os.Create(filepath.Join(dir, "c.bin"))
	idx, _ := os.Create(filepath.Join(dir, "c.idx"))
	w, err := megatron.NewWriter(bin, idx, megatron.Int32)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range docs {
		w.AddDocument(d)
	}
	w.Close()
	bin.Close()
	idx.Close()
	run := func(memory int64) ([][]int64, *budget) {
		l, err := Open(context.Background(), Config{URLs: []string{idx.Name()}, Pack: pack.Spec{Field: "tokens", SeqLen: 128, HasEOS: true, EOS: 1 << 20},
			BatchSize: 4, Seed: 2, Memory: memory, ReadGap: 4096, Logf: t.Logf})
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		var out [][]int64
		for {
			b, err := l.Next(context.Background())
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, slices.Clone(b.InputIDs))
			l.Release(b)
		}
		return out, l.rd.budget
	}
	want, big := run(0)
	for _, memory := range []int64{1 << 20, 64 << 10, 16 << 10} {
		t.Run(fmt.Sprint(memory), func(t *testing.T) {
			got, b := run(memory)
			if !slices.EqualFunc(got, want, slices.Equal) {
				t.Errorf("the batches differ from those of the default budget")
			}
			// A batch of 4 rows of 128 tokens reads at most its documents'
			// 512 tokens, two cut ones of 300 at most, and ReadGap between; past
			// the budget are at most the chunks of the group being planned (a
			// sixth of the budget and a batch) and those the planner keeps of the
			// group before (as many).
			batch := int64(4*(4*128+2*300) + 4*4096)
			if b.over > b.max/3+2*batch || b.peak > b.max+b.over {
				t.Errorf("chunks of %d bytes at the most, %d past the budget of %d", b.peak, b.over, b.max)
			}
			t.Logf("budget %d: peak %d, over %d (default budget: peak %d)", b.max, b.peak, b.over, big.peak)
		})
	}
}
