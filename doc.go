// Package shardload keeps GPUs fed: it streams WebDataset-style tar shards from object
// storage, caches them beside the trainer, shuffles, decodes and collates samples into
// batches in pinned host memory.
//
// This root package will hold the library API (Config, Open, the batch iterator) that
// wires the stages together. Today the stages usable on their own are:
//
//   - package source: the Source interface, a registry by URL scheme, and the file and
//     S3 backends;
//   - package shard: brace expansion of shard URLs and the streaming WebDataset sample
//     reader.
package shardload
