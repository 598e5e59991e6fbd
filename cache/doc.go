// Package cache will own the node-wide shard cache: a memory LRU tier and a disk LRU
// tier, each with a byte budget, in front of any source.Source; concurrent misses for
// one shard merged into one fetch; crash-safe files (written to a temporary name,
// verified, renamed); and the pre-warm used by "shardload warm". It does not parse tar.
package cache
