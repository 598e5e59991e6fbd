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
// A planner cuts the rank's batches into groups (the first of 512 KiB of documents
// to read, each next twice the last's, up to 64 MiB or a sixth of the read budget)
// and reads each group's documents with ranged requests: the documents of one
// object (a shard, a .bin), in offset order, merged across gaps of at most ReadGap
// bytes into chunks of up to 8 MiB (a larger document is a chunk of its own). A
// chunk is read once and shared by every batch that needs it, the next group's
// included: the order's lanes read their shards forward, so that with one rank a
// lane's run of documents is one request however the windows permute them. Fetches
// readers read the chunks, in the order the batches need them, ahead of the
// consumer as far as the read budget (half of Memory, at most 64 MiB) allows; fillers (ReadAhead,
// at most one a CPU) decode each piece's tokens from its chunk straight into the
// batch, and Next hands the batches over in order, ReadAhead of them ready at most.
// Loader.Release gives a batch's buffers back for later batches.
//
// Memory is bounded by Memory: the chunks read and not yet packed take the read
// budget
// (the planner waits for room only while batches in flight will free some, so
// past it by at most the chunks of two groups, a third of it and two batches'
// documents: a batch whose documents take more than the budget still makes
// progress), the batches ReadAhead plus the fillers' times BatchSize x
// SEQ_LEN x 16 bytes (input_ids and position_ids) and cu_seqlens. Besides them the
// loader holds what planning needs: the index (the shards' entries; a Megatron
// .idx's arrays, about 8 bytes a document), the order (12 bytes a shard) and the
// layout (8 bytes every 1024 documents). A tar shard must be
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
