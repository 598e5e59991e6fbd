// Package packed is the loader of packed token streams: it reads the documents of
// an epoch (1-D integer arrays: a field of tar shards' samples, or the documents of
// Megatron-LM indexed datasets), in the epoch's seeded order, and packs them into
// batches of rows of SEQ_LEN tokens with input_ids, position_ids, cu_seqlens and
// max_seqlen (package pack).
//
// # The layout and the order
//
// An epoch's documents are taken in the order of package plan (NewOrder: shards
// shuffled per seed and epoch, read in Lanes regions side by side, windows of
// ShuffleBuffer documents permuted), computed from the shards' document counts alone,
// and concatenated into rows (pack.Layout) from the documents' lengths alone: the
// index's member sizes (shardload index records each .npy member's dtype and element
// count) or a Megatron .idx. Nothing of it depends on the world size. Rows are dealt
// to ranks batch by batch (pack.Deal): every rank yields the same number of batches
// (rows past the epoch's end are pad, counted in Batch.Padded), Len is exact, and a
// State is one row position, which resumes exactly on the same or another world
// size: every token of the epoch once overall.
//
// A Megatron dataset (a URL ending in .idx naming X.idx and X.bin) is cut, for the
// order, into runs of DocsPerShard consecutive documents that play the part of
// shards; its documents' tokens are read from the .bin by range.
//
// # Mixing streams by tokens
//
// Config.Streams mixes several datasets (runs of the URLs, tar shards or Megatron
// datasets) into each epoch, as package plan's Mix does for samples, but counted in
// tokens: a stream's Weight is its share of the epoch's tokens (eos included), and
// EpochTokens the epoch's length in tokens (0: every weighted stream's tokens once,
// and what Repeat and Choose give of the others). Each stream's share is turned into
// a number of documents at the stream's mean document length, which its index (the
// member sizes, the .idx) gives without reading a token, and plan.Mix draws that many
// documents of the stream (plan.Stream.Choose): a stream drawn beyond its documents
// repeats them, every document once before any twice; one drawn at fewer rotates
// through them from epoch to epoch. The documents are then packed as one dataset's
// are, so the layout, the deal to ranks, Len and the State work as without streams
// (a resume on another world size included), and the fingerprint names the streams,
// their settings and the draws made of them.
//
// The shares are exact in expectation: a stream drawn in whole cycles of its
// documents gets exactly its tokens; of a partial cycle the documents drawn are a
// shuffled subset, whose mean length differs from the stream's by their sampling
// error (a few hundred documents drawn of a stream keep its share within a fraction
// of a percent). Loader.StreamTokens says what each stream got. The order of a mixed
// epoch is read forward from the plan's windows: a resume walks them from the
// epoch's start once (about a microsecond a window).
//
// # Reading
//
// Each batch's documents are read with ranged requests: the runs of consecutive
// samples (documents) of a shard (.bin) it needs, merged across gaps of at most
// ReadGap bytes, ReadAhead batches ahead of the consumer. A tar shard must be
// uncompressed and indexed with its member sizes (shardload index), so that a
// sample's bytes are found by its offset; a document's tokens are its .npy member's
// elements.
//
// Every object is read through Config.Sources. A registry wrapped by cache.Wrap (as
// the command line's --cache-dir makes it, and the library's Config.Sources can be)
// reads through the node cache: a range of a cached shard or .bin is served from the
// cache, one not cached is read from the store while the cache fetches the object
// behind it.
//
// # Bad input
//
// A field that is not a 1-D integer array, a token id that does not fit the output,
// an eos or pad out of range, a Megatron index that does not hold together, a shard
// without member sizes: each is an error before the first batch, or at the batch
// that reads the document, naming the shard (or .bin) and the sample and byte offset.
package packed
