// Package plan decides which samples of an epoch each rank reads, and in which order:
// from the shards' entries (shard.Info: their counts) and the settings alone, without
// reading data.
//
// NewOrder defines an epoch's order from the shards' counts, the seed, the epoch and
// the shuffle settings alone (not the world size, timing or data): the shards
// shuffled per (Seed, Epoch), cut into Lanes regions, and windows that take from every
// lane in proportion and permute their samples uniformly. The position of any sample
// is computed without reading data (Order.At).
//
// New gives one rank's part of one epoch: the epoch (what earlier runs left of it,
// when resuming) cut into World contiguous parts of floor(total/World) samples, so
// every rank yields the same number of samples and batches and none runs out early
// and hangs a distributed job; the total%World samples left over are read by no rank
// that epoch (Plan.Dropped). The parts follow the order's windows, and a window two
// ranks share is cut by where its samples lie in the data (split.go): each rank reads
// a run of every lane's part of it, nothing another rank reads, and yields its
// samples window by window in the order's positions. A Plan lists the Spans (runs of consecutive
// samples of a shard) the rank reads, and its Windows say where each span's samples
// go and in which order the rank yields them. ErrNoSamples means a rank would get
// nothing to read: fewer samples than ranks, or, with DropLast, fewer than one batch
// per rank. The order and the plan, like EpochRand's random sources, are pure
// functions of their inputs.
//
// With Config.RanksPerNode, the ranks sit on nodes, and a shuffled epoch of more than
// one node is the order of each node's group of samples, one after the other: the
// groups a fixed arrangement of the shards cut where the rank split's nodes start, so
// that a node reads the same samples of the same shards every epoch (what its cache
// holds), shuffled anew within the node each epoch (nodes.go). The order then depends
// on the layout of the epoch's first run too, which the runs of a state record
// (Run.RanksPerNode): a resume on another world size or layout stays exact.
package plan
