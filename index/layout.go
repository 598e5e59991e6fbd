package index

import (
	"bufio"
	"io"

	"github.com/shardload/shardload/shard"
)

// Layout is where the parts of an addressable index (WriteAddressable) lie, for a
// model of what a loader reads of it: the start and the counts of every shard
// (Lookup.Quick), then the blocks holding the offsets of the shards its plan reads
// (Plan).
type Layout struct {
	// Head is the bytes before the counts (the empty frame and the table); Counts
	// the counts' frame.
	Head, Counts int64
	// First is each block's first shard, and Blocks each block's bytes.
	First  []int
	Blocks []int64
}

// Size returns the bytes of the whole index.
func (l Layout) Size() int64 {
	n := l.Head + l.Counts
	for _, b := range l.Blocks {
		n += b
	}
	return n
}

// Block returns the block holding the offsets of shard i.
func (l Layout) Block(i int) int {
	t := addrTable{first: l.First}
	return t.block(i)
}

// ReadLayout reads the layout of the index whose first bytes r reads, up to its
// table; ok is false for an index that is not addressable (Write's, which a loader
// reads whole). name is for errors.
func ReadLayout(r io.Reader, name string) (l Layout, ok bool, err error) {
	br := bufio.NewReaderSize(r, 1<<16)
	if !isAddressable(br) {
		return Layout{}, false, nil
	}
	t, err := readTable(br, name)
	if err != nil {
		return Layout{}, true, err
	}
	// readTable's offsets count from the index's start: the first block's less the
	// counts is the head.
	l = Layout{Counts: t.countsLen, First: t.first, Blocks: t.length}
	if len(t.off) > 0 {
		l.Head = t.off[0] - t.countsLen
	} else {
		l.Head = int64(len(emptyFrame)) + 8 + int64(len(tableTag)+idLen+8+8+4)
	}
	return l, true, nil
}

// BlockStarts returns the first shard of each block WriteAddressable writes infos
// in: the shards of a block hold at most blockBytes of encoded offsets (and
// members, in an index of format version 2) together (the block that passes it ends
// with the shard that did), and at most blockShards.
func BlockStarts(infos []shard.Info) []int {
	var first []int
	members := versionOf(infos) == membersVersion
	var scratch []byte
	raw, start := 0, 0
	for i, in := range infos {
		scratch = appendBlockEntry(scratch[:0], in, members)
		raw += len(scratch)
		if raw >= blockBytes || i+1-start >= blockShards || i == len(infos)-1 {
			first = append(first, start)
			start, raw = i+1, 0
		}
	}
	return first
}

// RawBlockBytes returns the bytes of offsets (and members), before compression, of
// the block of infos that starts at shard first and ends before shard end.
func RawBlockBytes(infos []shard.Info, first, end int) int64 {
	var raw int64
	// The block's own shards say whether it holds members (looking at every shard
	// for each block would take the square of the shards).
	members := versionOf(infos[first:end]) == membersVersion
	var scratch []byte
	for _, in := range infos[first:end] {
		scratch = appendBlockEntry(scratch[:0], in, members)
		raw += int64(len(scratch))
	}
	return raw
}
