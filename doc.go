// Package shardload keeps GPUs fed: it streams WebDataset-style tar shards from object
// storage, shuffles, decodes and collates their samples into batches in pinned
// (page-locked, memfd-backed) host memory.
//
// # Configuring and opening
//
// A Config names the shards (URLs with brace patterns, or Shards with their sample
// counts, or an Index written by "shardload index"), the fields to decode,
// the batch size, the seed and epoch, the rank and world of a distributed job, and the
// bounds of the pipeline: shuffle buffer, open shards, workers, queues, slabs, the
// per-member and per-sample caps (MaxMemberSize, MaxSampleSize) and the decompression
// ratio cap. The zero value plus URLs works; each default is stated beside its field
// and defined once as an exported constant (DefaultBatchSize, DefaultSlabBytes, ...).
// CPUs places the loader's goroutines on the CPUs of the GPU they feed; Device adds a
// copy of each batch to a GPU (package device). Config.Validate reports every setting
// that is negative or makes no sense; Open calls it. MemoryBudget and RingBytes say
// what the settings will hold in memory.
//
// Open plans one rank's epoch and starts the loader. Every rank gets the same number of
// batches, and the order is a pure function of the shards, seed, epoch, rank, world and
// shuffle settings (plan.New). Open reads no shard to count it: it plans from
// an index (Config.Index, or one beside the shards: package index) with exact counts
// and sample offsets, so that a rank starting inside a shard reads from its sample's
// offset; without an index, from counts estimated from the objects' sizes, which keep
// every rank's batch count equal and may repeat or leave out as many samples as the
// estimates are off by (Shards says which; CountFirst and Count count exactly). The
// node's index store keeps every exact entry found for later runs. The loader reads
// several shards at once with a bounded pool of
// workers, interleaves and shuffles their samples, decodes the configured fields
// (package decode) and collates each batch straight into a slab of a ring (package
// pinned). Loader.Next (or Loader.All) hands out each Batch, whose columns are views
// into its slab; Batch.Release gives the slab back; Loader.Close stops everything.
// Loader.Stats returns counters and the time spent in each stage (StageNames).
//
// # Every rank reads the same epoch
//
// Loader.Order returns every setting that decides which samples each rank reads and in
// which order: a digest of the dataset, the seed, epoch, world, batching and shuffle
// settings. A rank whose Order differs from the others' reads an overlapping or
// incomplete part of the epoch without any error, so a job compares Order.Fingerprint
// across its ranks, and Order.Diff names the settings that differ.
//
// # Errors
//
// Config.OnError is the policy for bad samples and shards: Fail (the default) stops at
// the first; Skip leaves them out, logs each, and fails the loader with ErrErrorBudget
// once the skips exceed Config.ErrorBudget (a *Budget over the whole job's epoch; nil
// means DefaultErrorBudget, 1% of the samples or shards; &Budget{} allows nothing).
// Errors from Next are sticky and match with errors.Is:
//
//   - ErrCountMismatch: a shard holds another number of samples than the counts the
//     epoch was planned from (Shards, Index or the counting pass);
//   - ErrErrorBudget: the Skip policy left out more than the budget;
//   - ErrPanic: a goroutine of the loader panicked (in a Source, a decoder or the
//     loader itself); the error says where, with the stack;
//   - *SampleError (errors.As) for a sample that could not be decoded, with the
//     shard's URL, the sample's key and byte offset, the field and the cause
//     (ErrMissingField, decode.ErrWrongShape, ...);
//   - ErrEmpty: the shards hold no samples; ErrClosed: Next after Close;
//   - the errors of package shard (a damaged or hostile shard: shard.ErrTruncated,
//     shard.ErrCorrupt, shard.ErrTooCompressed, shard.ErrSparse, ...) and of package
//     source (source.ErrNotFound, source.ErrPermission, ...), wrapped.
//
// URLs carry secrets: the user information of a URL and the signature and token
// parameters of presigned URLs. The errors of Open, Count and Next name URLs with those
// secrets removed (errors.Is and errors.As still reach the cause), and an Index matches
// shards by their redacted URL, so it stays valid when a signature changes.
//
// # Autotuning
//
// Config.Memory is one budget for every buffer the loader sizes (slabs, decoded
// samples, remote reads' parts; see Config.MemoryBudget). Within it, a tuner adjusts
// the settings that do not change the batches (Workers, ReadAhead, QueueBytes,
// FetchParallel, FetchPartSize) while the loader runs: it tries one change at a time
// while the consumer waits for batches, keeps a change that raised the rate of
// samples delivered by 5%, and undoes one that did not. Settings set in the Config are
// left alone; Config.NoAutotune turns it off. Give the loaders of a job's epochs one
// Tuner (Config.Tuner) so that each starts where the last ended; Loader.Settings and
// Tuner.Settings say where it is.
//
// # The stages on their own
//
// The stages are usable on their own: package source (the Source interface, a registry
// by URL scheme, the fetcher, the file backend, and the cloud backends), package shard
// (brace expansion, the streaming sample reader and its checks on damaged input, the
// epoch order and each rank's plan of it), package index (the dataset index), package decode, package pinned, package cache (a
// shard cache on local disk that is itself a Source) and package device.
package shardload
