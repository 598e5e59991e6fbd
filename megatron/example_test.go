package megatron_test

import (
	"bytes"
	"fmt"

	"github.com/shardload/shardload/megatron"
)

// Example writes a two-document dataset, parses its index and reads each document
// back from the .bin.
func Example() {
	var bin, idx bytes.Buffer
	w, err := megatron.NewWriter(&bin, &idx, megatron.Uint16)
	if err != nil {
		panic(err)
	}
	w.AddDocument([]int64{101, 7592, 102})
	w.AddDocument([]int64{101, 2088, 999, 102})
	if err := w.Close(); err != nil {
		panic(err)
	}

	// With files: Parse(idxFile, idxInfo.Size(), binInfo.Size()).
	x, err := megatron.Parse(bytes.NewReader(idx.Bytes()), int64(idx.Len()), int64(bin.Len()))
	if err != nil {
		panic(err)
	}
	fmt.Println(x.Docs(), "documents,", x.Tokens(), "tokens of", x.DType())

	data := bytes.NewReader(bin.Bytes())
	var buf []byte
	var tokens []int64
	for i := range x.Docs() {
		off, n := x.DocRange(i)
		buf = append(buf[:0], make([]byte, n)...)
		if _, err := data.ReadAt(buf, off); err != nil {
			panic(err)
		}
		if tokens, err = megatron.AppendTokens(tokens[:0], buf, x.DType()); err != nil {
			panic(err)
		}
		fmt.Printf("document %d: bytes %d+%d, %d tokens %v\n", i, off, n, x.DocTokens(i), tokens)
	}
	// Output:
	// 2 documents, 7 tokens of uint16
	// document 0: bytes 0+6, 3 tokens [101 7592 102]
	// document 1: bytes 6+8, 4 tokens [101 2088 999 102]
}
