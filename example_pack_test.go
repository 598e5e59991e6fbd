package shardload_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/shardload/shardload"
	"github.com/shardload/shardload/megatron"
)

// Pack the documents of a Megatron dataset into rows of 4 tokens with eos 0 after
// each document: batches of 2 rows in the loader's slabs, with the columns
// flash-attention's varlen kernels take, and a state that resumes on any world size.
func ExampleConfig_pack() {
	dir, _ := os.MkdirTemp("", "pack")
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

	ctx := context.Background()
	l, err := shardload.Open(ctx, shardload.Config{URLs: []string{idx.Name()}, Pack: "tokens:4:eos=0",
		BatchSize: 2, NoShuffle: true, NoLock: true})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer l.Close()
	for b, err := range l.All(ctx) {
		if err != nil {
			fmt.Println(err)
			return
		}
		ids, _ := b.Column("input_ids")
		pos, _ := b.Column("position_ids")
		cu, _ := b.Column("cu_seqlens")
		fmt.Println(ids.Shape, ids.Int64s(b.Data()), pos.Int64s(b.Data()), "cu_seqlens:", cu.Shape[0], "padded:", b.Padded)
	}
	fmt.Println("rows yielded:", l.State().Rows)
	// Output:
	// [2 4] [11 12 13 0 21 22 23 24] [0 1 2 3 0 1 2 3] cu_seqlens: 3 padded: 0
	// [2 4] [25 0 31 0 0 0 0 0] [0 1 0 1 0 1 2 3] cu_seqlens: 4 padded: 1
	// rows yielded: 3
}
