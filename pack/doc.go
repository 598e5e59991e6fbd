// Package pack packs token documents into rows of a fixed length, with a layout that
// does not depend on the world size, and fills batches of those rows with input_ids,
// position_ids and cu_seqlens. It is pure: it reads no data, and is given the
// documents' lengths and tokens by functions.
//
// # Spec
//
// A Spec, written FIELD:SEQ_LEN[:eos=ID][:pad=ID] (ParseSpec, Spec.String), names the
// field holding each sample's document (a 1-D array of token ids), the row length
// SEQ_LEN, the eos id appended after every document (none by default) and the pad id
// (eos when eos is given, else 0). Spec.Check says whether eos and pad fit an output
// dtype.
//
// # Layout
//
// The documents of an epoch are concatenated in the epoch's order, each followed by
// eos when the spec has one, into one token stream, and the stream is cut into rows of
// exactly SEQ_LEN tokens. A document longer than what is left of a row continues at
// the start of the next: nothing is truncated or dropped. An empty document adds only
// its eos (nothing without eos). The tail of the last row is pad. An epoch of T
// stream tokens has ceil(T/SEQ_LEN) rows. Which token lies in which row is a function
// of the documents' lengths in epoch order, SEQ_LEN and eos alone, never of the world
// size or batch size, so a position in it (a row) means the same thing in a world of
// any size.
//
// A Layout is made from the number of documents and a function giving the i-th
// document's length (NewLayout). Layout.Pieces gives the pieces that fill a range of
// rows: runs of one document's tokens within one row (Piece: document, offsets within
// it, row, column), and the last row's pad.
//
// # Dealing and the state
//
// A Deal hands rows to ranks batch by batch: in each step the next World*BatchSize
// rows from Deal.Start are cut into World contiguous blocks of BatchSize rows, rank r
// taking block r, so each rank's batch is one contiguous run of the stream. Past the
// epoch's last row a rank's rows are all pad, so every rank yields the same number of
// batches, ceil((Rows-Start)/(World*BatchSize)). The state after every rank has taken
// k batches is a single row, Deal.Position(k) = min(Start + k*World*BatchSize, Rows);
// a Deal with any World and BatchSize starting at that row yields every row not yet
// yielded exactly once, so a packed epoch resumes exactly on another world size.
//
// # Batches: position_ids and cu_seqlens
//
// A Filler writes a batch of BatchSize rows from its pieces into the caller's
// buffers (Batch): input_ids (int64, or int32 with every id checked to fit),
// position_ids, cu_seqlens and max_seqlen, as flash-attention's varlen kernels
// (cu_seqlens, max_seqlen over the batch flattened to BatchSize*SEQ_LEN tokens) and
// Hugging Face's packing with position ids (position_ids restarting at 0 at each
// sequence) expect them. A segment is a run of tokens that attend to each other:
//
//   - a segment starts at the first column of every row, since rows are separate
//     sequences: a document cut by a row's end starts a new segment in the next row;
//   - a segment starts at every document's first token (the token after the previous
//     document's eos, when the spec has eos); an empty document with eos is a
//     segment of its eos alone;
//   - the pad after the epoch's last document starts a segment of its own when it
//     follows an eos; without eos it continues the last document's segment (there is
//     no boundary token between them), unless it is at a row's start;
//   - an all-pad row past the epoch's end is one segment.
//
// position_ids are 0 at each segment's first token and count up by 1 to its end, pad
// included. cu_seqlens are exactly the indices of the flattened batch where
// position_ids are 0, in order, followed by BatchSize*SEQ_LEN: it begins with 0, has
// between BatchSize+1 and BatchSize*SEQ_LEN+1 entries (Filler.MaxCuSeqlens, the
// capacity to give it), and its consecutive differences are the segments' lengths,
// the largest of which is max_seqlen.
//
// # Memory and cost
//
// A Layout keeps no per-document state: it keeps the stream offset of every
// BlockDocs-th (1024th) document, 8 bytes per 1024 documents, under 800 KB for 10^8
// documents. The cost is in calls of the length function: NewLayout calls it once
// per document; Locate and Pieces call it up to BlockDocs times to find their first
// document, then once per document they cover. Pieces appends to the caller's slice
// and Fill writes into the caller's buffers: neither allocates per token.
package pack
