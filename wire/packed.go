package wire

import (
	"encoding/binary"
	"fmt"
	"unsafe"

	"github.com/shardload/shardload/decode"
	"github.com/shardload/shardload/pack"
)

// The columns of a packed batch (package pack): rows of SeqLen tokens, not samples,
// so a packed batch has no KeyColumn.
const (
	InputIDsColumn    = "input_ids"    // [rows, SeqLen] int64 (int32 when asked for)
	PositionIDsColumn = "position_ids" // [rows, SeqLen] int64
	CuSeqlensColumn   = "cu_seqlens"   // [segments+1] int32, over the flattened batch
	MaxSeqlenColumn   = "max_seqlen"   // [1] int32: the longest segment
)

// PackedFields are the columns of a packed batch of rows of seqLen tokens as fields
// (what a session's ready message names): input_ids (int32 with int32 set, else
// int64) and position_ids of shape [seqLen] per row, then cu_seqlens and
// max_seqlen, int32, whose shapes are per batch (see PackedLayout).
func PackedFields(seqLen int, int32IDs bool) []decode.Field {
	ids := decode.Int64
	if int32IDs {
		ids = decode.Int32
	}
	return []decode.Field{
		{Name: InputIDsColumn, Ext: InputIDsColumn, Kind: decode.KindNPY, DType: ids, Shape: []int{seqLen}},
		{Name: PositionIDsColumn, Ext: PositionIDsColumn, Kind: decode.KindNPY, DType: decode.Int64, Shape: []int{seqLen}},
		{Name: CuSeqlensColumn, Ext: CuSeqlensColumn, Kind: decode.KindNPY, DType: decode.Int32},
		{Name: MaxSeqlenColumn, Ext: MaxSeqlenColumn, Kind: decode.KindNPY, DType: decode.Int32},
	}
}

// PackedBytes is the most a packed batch of rows rows of seqLen tokens takes in a
// slab: input_ids, position_ids, cu_seqlens at its longest (every token a segment)
// and max_seqlen, each aligned.
func PackedBytes(rows, seqLen int, int32IDs bool) int64 {
	n := int64(rows) * int64(seqLen)
	ids := int64(8)
	if int32IDs {
		ids = 4
	}
	return alignUp(n*ids) + alignUp(8*n) + alignUp(4*(n+1)) + alignUp(4)
}

// PackedLayout writes packed batch b, of rows rows of seqLen tokens, into slab as
// the four packed columns: input_ids and position_ids fixed [rows, seqLen],
// cu_seqlens fixed [len(b.CuSeqlens)] and max_seqlen [1], each at a multiple of
// Align, little-endian, the padding between them zeroed. It fails with
// ErrSlabTooSmall when slab is shorter than what they take (at most PackedBytes).
func PackedLayout(slab []byte, b *pack.Batch, rows, seqLen int) (Layout, error) {
	n := rows * seqLen
	ids, size := decode.Int64, int64(8)
	if b.InputIDs == nil {
		ids, size = decode.Int32, 4
	}
	if len(b.PositionIDs) != n || (ids == decode.Int64 && len(b.InputIDs) != n) || (ids == decode.Int32 && len(b.InputIDs32) != n) {
		return Layout{}, fmt.Errorf("wire: a packed batch of %d rows of %d tokens holds %d input_ids and %d position_ids", rows, seqLen, max(len(b.InputIDs), len(b.InputIDs32)), len(b.PositionIDs))
	}
	cols := []Column{
		{Name: InputIDsColumn, Kind: decode.KindNPY, DType: ids, Shape: []int{rows, seqLen}, Length: int64(n) * size},
		{Name: PositionIDsColumn, Kind: decode.KindNPY, DType: decode.Int64, Shape: []int{rows, seqLen}, Length: 8 * int64(n)},
		{Name: CuSeqlensColumn, Kind: decode.KindNPY, DType: decode.Int32, Shape: []int{len(b.CuSeqlens)}, Length: 4 * int64(len(b.CuSeqlens))},
		{Name: MaxSeqlenColumn, Kind: decode.KindNPY, DType: decode.Int32, Shape: []int{1}, Length: 4},
	}
	var used int64
	for i := range cols {
		cols[i].Offset = alignUp(used)
		used = cols[i].Offset + cols[i].Length
	}
	if used > int64(len(slab)) {
		return Layout{}, fmt.Errorf("%w: a packed batch of %d rows of %d tokens needs %d bytes, the slab has %d", ErrSlabTooSmall, rows, seqLen, used, len(slab))
	}
	le := binary.LittleEndian
	at := func(c int) []byte { return slab[cols[c].Offset : cols[c].Offset+cols[c].Length] }
	// A column PackedViews put in place is there already.
	switch d := at(0); {
	case ids == decode.Int64 && !inPlace(d, b.InputIDs):
		for i, v := range b.InputIDs {
			le.PutUint64(d[8*i:], uint64(v))
		}
	case ids == decode.Int32 && !inPlace(d, b.InputIDs32):
		for i, v := range b.InputIDs32 {
			le.PutUint32(d[4*i:], uint32(v))
		}
	}
	if d := at(1); !inPlace(d, b.PositionIDs) {
		for i, v := range b.PositionIDs {
			le.PutUint64(d[8*i:], uint64(v))
		}
	}
	if d := at(2); !inPlace(d, b.CuSeqlens) {
		for i, v := range b.CuSeqlens {
			le.PutUint32(d[4*i:], uint32(v))
		}
	}
	le.PutUint32(at(3), uint32(b.MaxSeqlen))
	// The padding between columns is zeroed, as Collate's is.
	var end int64
	for i := range cols {
		clear(slab[end:cols[i].Offset])
		end = cols[i].Offset + cols[i].Length
	}
	return Layout{Rows: rows, Columns: cols, Used: used}, nil
}

// littleEndian reports whether the host stores integers little-endian, as the
// slabs hold them.
var littleEndian = binary.NativeEndian.Uint16([]byte{1, 0}) == 1

// PackedViews points b's InputIDs (InputIDs32 with int32IDs), PositionIDs and
// CuSeqlens (with room for rows*seqLen+1) at the bytes of slab where PackedLayout
// puts those columns, so that a pack.Filler writes a batch in place and
// PackedLayout, given the filled batch, writes no more than max_seqlen and the
// padding: each token's bytes are written once. It returns false, leaving b as it
// is, where the slab's bytes cannot be viewed as integers (a big-endian host, a
// slab not 8-byte aligned), and fails with ErrSlabTooSmall when slab is shorter
// than PackedBytes.
func PackedViews(slab []byte, b *pack.Batch, rows, seqLen int, int32IDs bool) (bool, error) {
	if need := PackedBytes(rows, seqLen, int32IDs); need > int64(len(slab)) {
		return false, fmt.Errorf("%w: a packed batch of %d rows of %d tokens needs up to %d bytes, the slab has %d", ErrSlabTooSmall, rows, seqLen, need, len(slab))
	}
	if !littleEndian || uintptr(unsafe.Pointer(unsafe.SliceData(slab)))%8 != 0 {
		return false, nil
	}
	n := int64(rows) * int64(seqLen)
	size := int64(8)
	if int32IDs {
		size = 4
	}
	pos := alignUp(n * size)
	cu := alignUp(pos + 8*n)
	if int32IDs {
		b.InputIDs, b.InputIDs32 = nil, view[int32](slab, 0, n)
	} else {
		b.InputIDs, b.InputIDs32 = view[int64](slab, 0, n), nil
	}
	b.PositionIDs = view[int64](slab, pos, n)
	b.CuSeqlens = view[int32](slab, cu, n+1)
	return true, nil
}

// view is the n elements of type T at byte off of b, which the caller has checked
// hold them, aligned.
func view[T int32 | int64](b []byte, off, n int64) []T {
	return unsafe.Slice((*T)(unsafe.Pointer(&b[off])), n)
}

// inPlace reports whether s's elements are the bytes d, where PackedViews put them.
func inPlace[T int32 | int64](d []byte, s []T) bool {
	return len(s) > 0 && len(d) > 0 && unsafe.Pointer(unsafe.SliceData(s)) == unsafe.Pointer(unsafe.SliceData(d))
}
