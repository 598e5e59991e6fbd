// Package wire is what the loader and its trainers must agree on, byte for byte: the
// layout of a batch in its slab, and the trainer protocol's messages
// (docs/protocol.md). The Go server (package serve) and the Python client
// (client/python) read the same golden fixtures in testdata/, so that the two cannot
// drift apart.
//
// # The slab layout
//
// Collate writes a batch of decoded samples into a slab and returns its
// Layout: one Column per field, in order, then "__key__" (the sample keys). Every
// column's data and every offsets array starts at a multiple of Align (64) bytes
// from the start of the slab.
//
//   - KindInt fields: fixed column of int64, shape [rows].
//   - KindNPY fields with a Shape, and KindImage fields: fixed column of the
//     field's dtype, shape [rows, Shape...], C order, rows back to back.
//   - Every other field, and __key__: ragged. Data holds the rows' bytes back to back
//     (for NPY the array data without its header); OffsetsOffset holds rows+1
//     little-endian int64 offsets into Data, offsets[0] = 0, offsets[rows] = Length.
//     DType is uint8 and Shape [Length].
//
// Sizes are computed before anything is written; a batch that does not fit returns
// ErrSlabTooSmall with the bytes needed, leaving the slab untouched.
package wire
