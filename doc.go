// Package shardload keeps GPUs fed: it streams WebDataset-style tar shards from object
// storage, shuffles, decodes and collates their samples into batches in pinned
// (page-locked, memfd-backed) host memory.
//
// Open plans one rank's epoch (every rank gets the same number of batches; the order
// is a pure function of the shards, seed, epoch, rank, world and shuffle settings),
// reads several shards at once with a bounded pool of workers, interleaves and
// shuffles their samples, decodes the configured fields (package decode) and collates
// each batch straight into a slab of a ring (package pinned). Next hands the batches
// out; Release gives a slab back; Close stops everything.
//
// The stages are usable on their own: package source (the Source interface, a
// registry by URL scheme, file and S3 backends), package shard (brace expansion, the
// streaming sample reader, the epoch plan, the shuffle buffer), package decode and
// package pinned.
package shardload
