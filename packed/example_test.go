package packed_test

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/shardload/shardload/megatron"
	"github.com/shardload/shardload/pack"
	"github.com/shardload/shardload/packed"
)

// Pack a Megatron dataset of three documents into rows of 4 tokens, eos 0 after
// each document, batches of 2 rows, unshuffled.
func Example() {
	dir, _ := os.MkdirTemp("", "packed")
	defer os.RemoveAll(dir)
	bin, _ := os.Create(filepath.Join(dir, "c.bin"))
	idx, _ := os.Create(filepath.Join(dir, "c.idx"))
	w, _ := megatron.NewWriter(bin, idx, megatron.Uint16)
	for _, doc := range [][]int64{{11, 12, 13}, {21, 22, 23, 24, 25}, {31}} {
		w.AddDocument(doc)
	}
	w.Close()
	bin.Close()
	idx.Close()

	spec, _ := pack.ParseSpec("tokens:4:eos=0")
	l, err := packed.Open(context.Background(), packed.Config{URLs: []string{idx.Name()}, Pack: spec, BatchSize: 2, NoShuffle: true})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer l.Close()
	fmt.Println("batches:", l.Len(), "rows:", l.Rows())
	for {
		b, err := l.Next(context.Background())
		if err == io.EOF {
			break
		}
		fmt.Println(b.InputIDs, b.PositionIDs, b.CuSeqlens, b.MaxSeqlen, b.Padded)
	}
	fmt.Println("state:", l.State().Rows) // the rows yielded: every row of the epoch
	// Output:
	// batches: 2 rows: 3
	// [11 12 13 0 21 22 23 24] [0 1 2 3 0 1 2 3] [0 4 8] 4 0
	// [25 0 31 0 0 0 0 0] [0 1 0 1 0 1 2 3] [0 2 4 8] 4 1
	// state: 3
}

// An epoch's reads, announced before its first (Config.Planned): two Megatron
// datasets, each .bin read from its first document's range to its last, in the
// order the unshuffled epoch reaches them. ReadPlan gives the same reads as a plan
// whose spans a cache's hints take (serve.EpochHints.OpenPlan).
func ExamplePlanned_ReadPlan() {
	dir, _ := os.MkdirTemp("", "packed")
	defer os.RemoveAll(dir)
	var idxs []string
	for _, name := range []string{"a", "b"} {
		bin, _ := os.Create(filepath.Join(dir, name+".bin"))
		idx, _ := os.Create(filepath.Join(dir, name+".idx"))
		w, _ := megatron.NewWriter(bin, idx, megatron.Uint16)
		for d := range 6 {
			w.AddDocument([]int64{int64(10 + d), 1, 2})
		}
		w.Close()
		bin.Close()
		idx.Close()
		idxs = append(idxs, idx.Name())
	}
	spec, _ := pack.ParseSpec("tokens:8:eos=0")
	cfg := packed.Config{URLs: idxs, Pack: spec, BatchSize: 2, NoShuffle: true}
	cfg.Planned = func(p packed.Planned) {
		for _, r := range p.Reads() {
			fmt.Printf("%s: read from document %d to document %d of the epoch\n", filepath.Base(r.URL), r.First, r.Last)
		}
		rp := p.ReadPlan()
		fmt.Println("batches:", rp.Batches, "reads:", len(rp.Spans))
	}
	l, err := packed.Open(context.Background(), cfg)
	if err != nil {
		fmt.Println(err)
		return
	}
	l.Close()
	// Output:
	// a.bin: read from document 1 to document 6 of the epoch
	// b.bin: read from document 7 to document 12 of the epoch
	// batches: 3 reads: 4
}
