package index

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"

	"github.com/klauspost/compress/zstd"

	"github.com/shardload/shardload/redact"
	"github.com/shardload/shardload/shard"
)

// An addressable index (WriteAddressable) is a zstd stream whose sample offsets can be
// read for a few shards without reading the rest:
//
//	empty zstd frame        9 bytes: the file starts as any zstd index does
//	skippable frame         the table: tag, the counts' length, the blocks
//	zstd frame              the counts: the JSON lines of Write without "offsets"
//	skippable frame ...     one per block of shards: their offsets
//
// A skippable frame (magic 0x184D2A50-0x184D2A5F, a 4-byte length, that many bytes) is
// one every zstd decoder passes over, so a reader of plain zstd indexes (an earlier
// release, or "zstd -d") reads the counts, versions and sizes and no offsets: a valid
// index whose shards it cannot enter mid-shard.
//
// The table's payload is little-endian: tableTag (8 bytes), an id (8 bytes: the
// first 8 of the SHA-256 of the counts' frame), the counts' frame length (8), the
// shards (8), the blocks (4), then per block the ordinal of its first shard (8) and
// its frame's length with its 8-byte frame header (8). The blocks follow the counts
// in order. A block's payload is the id, then a zstd frame (with its checksum) of,
// per shard of the block in order, the uvarint length of its offsets and the offsets
// as in Write's lines before base64 (uvarint deltas; length 0 for none); in an index
// of format version 2 (its counts' header says), each shard's offsets are followed
// by the uvarint length of its members and its members (appendMembers; length 0 for
// unknown). A block read by a range whose id differs from the table's was written by
// another index (the object was replaced in between): an error.

// emptyFrame is a zstd frame of no bytes (single segment, a 1-byte content size of
// 0, one raw last block of 0 bytes).
var emptyFrame = []byte{0x28, 0xb5, 0x2f, 0xfd, 0x20, 0x00, 0x01, 0x00, 0x00}

const (
	skippableMagic = 0x184D2A5E
	tableTag       = "SLIDXT01"
	// blockBytes and blockShards bound a block's raw offsets and its shards: what a
	// process reads for one shard it plans to enter (64 KiB of 512-sample shards of
	// 100 KB images; 1,024 shards of tiny ones).
	blockBytes  = 64 << 10
	blockShards = 1024
	// maxTable and maxBlock bound what a reader allocates for a table and one block.
	maxTable = 64 << 20
	maxBlock = MaxLine + 64<<10
	idLen    = 8
	// countsWindow is the zstd window of the counts.
	countsWindow = 1 << 20
)

// addrTable is an addressable index's table.
type addrTable struct {
	members   bool // the blocks hold each shard's members after its offsets (version 2)
	id        [idLen]byte
	countsLen int64
	shards    int
	first     []int // ordinal of each block's first shard
	off       []int64
	length    []int64 // of the block's frame, header included
}

// block returns the block holding shard ordinal ord.
func (t *addrTable) block(ord int) int {
	lo, hi := 0, len(t.first)
	for hi-lo > 1 {
		m := (lo + hi) / 2
		if t.first[m] <= ord {
			lo = m
		} else {
			hi = m
		}
	}
	return lo
}

// end returns the ordinal after block k's last shard.
func (t *addrTable) end(k int) int {
	if k+1 < len(t.first) {
		return t.first[k+1]
	}
	return t.shards
}

// WriteAddressable writes infos as a zstd-compressed index whose sample offsets and
// members are addressable: a loader reads the counts of all shards and the offsets
// (and members) of the few it plans to enter (Plan, LoadMembers); Read reads it
// whole. Readers of earlier releases read one without members (format version 1) as
// an index without offsets, and refuse one with members (version 2). URLs are
// written without their secrets.
func WriteAddressable(w io.Writer, infos []shard.Info) error {
	level := zstd.WithEncoderLevel(zstd.SpeedBetterCompression)
	var counts bytes.Buffer
	// A window of 1 MiB rather than the level's 8: a reader's decoder holds a window,
	// and one shard's line matches the lines just before it (no larger for it).
	zw, err := zstd.NewWriter(&counts, level, zstd.WithWindowSize(countsWindow))
	if err != nil {
		return err
	}
	enc := json.NewEncoder(zw)
	enc.SetEscapeHTML(false)
	countsLine := func(info shard.Info) line {
		return lineOf(shard.Info{URL: info.URL, Samples: info.Samples, Version: info.Version, Size: info.Size})
	}
	linesum, err := linesSum(infos, countsLine)
	if err != nil {
		return err
	}
	version := versionOf(infos)
	if err := enc.Encode(header{Format: formatName, Version: version, Shards: len(infos), Offsets: offsetsBlocks, Sum: linesum}); err != nil {
		return err
	}
	for _, info := range infos {
		if err := enc.Encode(countsLine(info)); err != nil {
			return err
		}
	}
	if err := zw.Close(); err != nil {
		return err
	}
	sum := sha256.Sum256(counts.Bytes())
	var t addrTable
	copy(t.id[:], sum[:])
	be, err := zstd.NewWriter(nil, level, zstd.WithEncoderConcurrency(1))
	if err != nil {
		return err
	}
	defer be.Close()
	var blocks [][]byte
	var raw []byte
	first := 0
	for i, info := range infos {
		raw = appendBlockEntry(raw, info, version == membersVersion)
		if len(raw) >= blockBytes || i+1-first >= blockShards || i == len(infos)-1 {
			fr := binary.LittleEndian.AppendUint32(nil, skippableMagic)
			payload := be.EncodeAll(raw, append([]byte(nil), t.id[:]...))
			fr = binary.LittleEndian.AppendUint32(fr, uint32(len(payload)))
			blocks = append(blocks, append(fr, payload...))
			t.first = append(t.first, first)
			first, raw = i+1, raw[:0]
		}
	}
	tab := append([]byte(tableTag), t.id[:]...)
	tab = binary.LittleEndian.AppendUint64(tab, uint64(counts.Len()))
	tab = binary.LittleEndian.AppendUint64(tab, uint64(len(infos)))
	tab = binary.LittleEndian.AppendUint32(tab, uint32(len(blocks)))
	for k, b := range blocks {
		tab = binary.LittleEndian.AppendUint64(tab, uint64(t.first[k]))
		tab = binary.LittleEndian.AppendUint64(tab, uint64(len(b)))
	}
	bw := bufio.NewWriterSize(w, 64<<10)
	bw.Write(emptyFrame)
	binary.Write(bw, binary.LittleEndian, uint32(skippableMagic))
	binary.Write(bw, binary.LittleEndian, uint32(len(tab)))
	bw.Write(tab)
	bw.Write(counts.Bytes())
	for _, b := range blocks {
		bw.Write(b)
	}
	return bw.Flush()
}

// appendBlockEntry appends the entry of info in a block to raw: its offsets, and with
// members its members.
func appendBlockEntry(raw []byte, info shard.Info, members bool) []byte {
	raw = binary.AppendUvarint(raw, uint64(deltasLen(info.Offsets)))
	raw = appendDeltas(raw, info.Offsets)
	if members {
		at := len(raw)
		raw = appendMembers(raw, info.Members)
		n := len(raw) - at
		// The length goes before the members: they are moved up by its bytes.
		k := uvarintLen(uint64(n))
		raw = append(raw, make([]byte, k)...)
		copy(raw[at+k:], raw[at:at+n])
		binary.PutUvarint(raw[at:], uint64(n))
	}
	return raw
}

// deltasLen returns the bytes of appendDeltas's encoding of offs.
func deltasLen(offs []int64) int {
	n, prev := 0, int64(0)
	for _, o := range offs {
		n += uvarintLen(uint64(o - prev))
		prev = o
	}
	return n
}

func uvarintLen(v uint64) int {
	n := 1
	for v >= 0x80 {
		v >>= 7
		n++
	}
	return n
}

// isAddressable reports whether br starts an addressable index.
func isAddressable(br *bufio.Reader) bool {
	b, _ := br.Peek(len(emptyFrame) + 8 + len(tableTag))
	return len(b) == len(emptyFrame)+8+len(tableTag) && bytes.Equal(b[:len(emptyFrame)], emptyFrame) &&
		binary.LittleEndian.Uint32(b[len(emptyFrame):]) == skippableMagic && string(b[len(emptyFrame)+8:]) == tableTag
}

// readTable reads an addressable index's start and table from br (isAddressable).
func readTable(br *bufio.Reader, name string) (*addrTable, error) {
	bad := func(why string) error {
		return fmt.Errorf("%w: %s: addressable index: %s", ErrFormat, redact.URL(name), why)
	}
	if _, err := br.Discard(len(emptyFrame) + 4); err != nil {
		return nil, bad(err.Error())
	}
	var n uint32
	if err := binary.Read(br, binary.LittleEndian, &n); err != nil {
		return nil, bad(err.Error())
	}
	const fixed = len(tableTag) + idLen + 8 + 8 + 4
	if int(n) < fixed || n > maxTable {
		return nil, bad(fmt.Sprintf("a table of %d bytes", n))
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(br, b); err != nil {
		return nil, bad("the table: " + err.Error())
	}
	t := &addrTable{}
	copy(t.id[:], b[len(tableTag):])
	b = b[len(tableTag)+idLen:]
	countsLen, shards := binary.LittleEndian.Uint64(b), binary.LittleEndian.Uint64(b[8:])
	blocks := int(binary.LittleEndian.Uint32(b[16:]))
	b = b[20:]
	if countsLen > 1<<50 || shards > 1<<40 || len(b) != 16*blocks || (blocks == 0) != (shards == 0) {
		return nil, bad("a table that does not add up")
	}
	t.countsLen, t.shards = int64(countsLen), int(shards)
	off := int64(len(emptyFrame)) + 8 + int64(n) + t.countsLen
	for k := range blocks {
		first, length := binary.LittleEndian.Uint64(b[16*k:]), binary.LittleEndian.Uint64(b[16*k+8:])
		if (k == 0) != (first == 0) || first >= shards || (k > 0 && int(first) <= t.first[k-1]) || length < 8+idLen || length > maxBlock {
			return nil, bad(fmt.Sprintf("block %d: shard %d, %d bytes", k, first, length))
		}
		t.first, t.off, t.length = append(t.first, int(first)), append(t.off, off), append(t.length, int64(length))
		off += int64(length)
	}
	return t, nil
}

// readAddressable reads an addressable index from br (isAddressable): its counts, and
// with offsets set the offsets of every shard too (Read); otherwise it stops after the
// counts and returns the table, for loading offsets later (offsetsOf).
//
// urls, when given, are the URLs the shards are likely to have, in order: a URL
// equal to its line's takes no memory of its own.
func readAddressable(br *bufio.Reader, name string, offsets bool, urls []string) ([]shard.Info, *addrTable, error) {
	t, err := readTable(br, name)
	if err != nil {
		return nil, nil, err
	}
	lr := io.LimitReader(br, t.countsLen)
	zr, err := zstd.NewReader(lr, zstd.WithDecoderConcurrency(1), zstd.WithDecoderMaxWindow(64<<20))
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %s: %v", ErrFormat, redact.URL(name), err)
	}
	infos, h, err := readLines(zr, name, urls)
	zr.Close()
	if err != nil {
		return nil, nil, err
	}
	if len(infos) != t.shards || h.Offsets != offsetsBlocks {
		return nil, nil, fmt.Errorf("%w: %s: addressable index: %d shards, its table says %d", ErrFormat, redact.URL(name), len(infos), t.shards)
	}
	t.members = h.Version == membersVersion
	if !offsets {
		return infos, t, nil
	}
	if _, err := io.Copy(io.Discard, lr); err != nil {
		return nil, nil, fmt.Errorf("%w: %s: %v", ErrFormat, redact.URL(name), err)
	}
	dec, err := blockDecoder(1)
	if err != nil {
		return nil, nil, err
	}
	defer dec.Close()
	var buf bytes.Buffer
	var names memberNames
	for k := range t.first {
		buf.Reset() // grown as the bytes come, not as the table says
		if _, err := io.CopyN(&buf, br, t.length[k]); err != nil {
			return nil, nil, fmt.Errorf("%w: %s: block %d: %v", ErrFormat, redact.URL(name), k, err)
		}
		blk := infos[t.first[k]:t.end(k)]
		want := func(i int) *shard.Info { return &blk[i] }
		set := func(i int, offs []int64, m *shard.Members) { blk[i].Offsets, blk[i].Members = offs, m }
		if err := t.decodeBlock(dec, k, buf.Bytes(), want, set, &names, name); err != nil {
			return nil, nil, err
		}
	}
	return infos, nil, nil
}

// blockDecoder returns a decoder of blocks for DecodeAll, n at a time.
func blockDecoder(n int) (*zstd.Decoder, error) {
	return zstd.NewReader(nil, zstd.WithDecoderConcurrency(n), zstd.WithDecoderMaxMemory(maxBlock))
}

// decodeBlock decodes block k (its frame b): for the i-th shard of the block,
// want(i) is its entry (its count and URL), or nil to skip it unchecked, and set(i,
// offs, members) takes its offsets and members (nil where it has none), if it is
// not skipped: the entry with them passes Check (against its own size).
func (t *addrTable) decodeBlock(dec *zstd.Decoder, k int, b []byte, want func(i int) *shard.Info, set func(i int, offs []int64, m *shard.Members), names *memberNames, name string) error {
	bad := func(why string) error {
		return fmt.Errorf("%w: %s: addressable index: block %d: %s", ErrFormat, redact.URL(name), k, why)
	}
	if int64(len(b)) != t.length[k] || binary.LittleEndian.Uint32(b) != skippableMagic || int64(binary.LittleEndian.Uint32(b[4:])) != t.length[k]-8 {
		return bad("not the frame its table says")
	}
	if !bytes.Equal(b[8:8+idLen], t.id[:]) {
		return bad("written for another index (the index object was replaced while it was read)")
	}
	raw, err := dec.DecodeAll(b[8+idLen:], nil)
	if err != nil {
		return bad(err.Error())
	}
	next := func() ([]byte, bool) {
		n, m := binary.Uvarint(raw)
		if m <= 0 || n > uint64(len(raw)-m) {
			return nil, false
		}
		d := raw[m : m+int(n)]
		raw = raw[m+int(n):]
		return d, true
	}
	for i := range t.end(k) - t.first[k] {
		d, ok := next()
		var md []byte
		if ok && t.members {
			md, ok = next()
		}
		if !ok {
			return bad("cut short")
		}
		e := want(i)
		if e == nil || len(d) == 0 && len(md) == 0 {
			continue
		}
		var offs []int64
		var mem *shard.Members
		var err error
		if len(d) > 0 {
			offs, err = decodeDeltas(d, e.Samples)
		}
		if err == nil && len(md) > 0 {
			mem, err = names.decodeMembers(md, e.Samples)
		}
		if err == nil && mem != nil {
			checked := *e
			checked.Offsets, checked.Members = offs, mem
			err = checked.Check(-1, -1)
		}
		if err != nil {
			return bad(fmt.Sprintf("shard %d (%s): %v", t.first[k]+i, redact.URL(e.URL), err))
		}
		set(i, offs, mem)
	}
	if len(raw) > 0 {
		return bad("bytes after its last shard")
	}
	return nil
}

// rangeOpener opens byte ranges of objects (a *source.Registry).
type rangeOpener interface {
	OpenRange(ctx context.Context, url string, off, length int64) (io.ReadCloser, error)
}

// offsetsOf reads, from the addressable index at url with table t, the offsets and
// members (what says which) of the shards of ordinals ords into infos[i] for each i
// with ords[i] set (infos[i] is the shard of ordinal ords[i]): a ranged read of each
// block that holds any of them, workers at a time.
func (t *addrTable) offsetsOf(ctx context.Context, src rangeOpener, url string, infos []shard.Info, ords map[int]int, workers, what int) error {
	byBlock := map[int]map[int]int{} // block -> ordinal -> index in infos
	for i, ord := range ords {
		if ord < 0 || ord >= t.shards {
			return fmt.Errorf("index: shard ordinal %d of %d", ord, t.shards)
		}
		k := t.block(ord)
		if byBlock[k] == nil {
			byBlock[k] = map[int]int{}
		}
		byBlock[k][ord] = i
	}
	blocks := make([]int, 0, len(byBlock))
	for k := range byBlock {
		blocks = append(blocks, k)
	}
	lk := Lookup{Workers: workers}.withDefaults()
	dec, err := blockDecoder(max(1, min(lk.Workers, len(blocks))))
	if err != nil {
		return err
	}
	defer dec.Close()
	return lk.each(ctx, len(blocks), func(ctx context.Context, j int) error {
		k := blocks[j]
		body, err := src.OpenRange(ctx, url, t.off[k], t.length[k])
		if err != nil {
			return fmt.Errorf("shardload: index: %w", err)
		}
		b := make([]byte, t.length[k])
		_, err = io.ReadFull(body, b)
		body.Close()
		if err != nil {
			return fmt.Errorf("shardload: index %s: block %d: %w", redact.URL(url), k, err)
		}
		first, of := t.first[k], byBlock[k]
		want := func(i int) *shard.Info {
			if at, ok := of[first+i]; ok {
				return &infos[at]
			}
			return nil
		}
		set := func(i int, offs []int64, m *shard.Members) {
			// A compressed shard's offsets stay nil.
			in := &infos[of[first+i]]
			if what&loadOffsets != 0 {
				in.Offsets = offs
			}
			if what&loadMembers != 0 {
				in.Members = m
			}
		}
		var names memberNames // one a block: blocks are decoded at once
		return t.decodeBlock(dec, k, b, want, set, &names, url)
	})
}

// What offsetsOf loads of a shard.
const (
	loadOffsets = 1 << iota
	loadMembers
)
