package shard

// Members: what the members of a shard's samples are and how large, as an index
// records them, so that a batch's layout is known before its samples are read.

import (
	"cmp"
	"encoding/binary"
	"fmt"
	"slices"
	"strings"
	"unsafe"
)

// Members are the members of the samples of one shard: the extensions present in it
// (Field.Ext: WebDataset's grouping, as the Reader splits names), in sorted order,
// and each sample's size of each of them, a member absent from a sample told apart
// from an empty one. For a .npy extension (IsNPY) whose members present are all 1-D
// arrays of one element type, they hold that type (DType) and each member's element
// count (Items): what a token packer needs to lay out its rows. Such an extension
// with any member of another shape, Fortran order, another or an unrecorded type, or
// bytes other than the header and the array, has no type (DType "") and no counts:
// it is not packable from the index alone, and its samples have to be read.
//
// Members are held compactly: per extension one value per sample, 1, 2, 4 or 8
// bytes wide as its largest value needs, and for a typed .npy extension one more
// for its element counts (a jpg of up to 4 GB and a cls take 5 bytes a sample; a
// .npy of 32,704 to 65,534 uint16 tokens 6: its size 4, its count 2), and no Go
// value per sample. A Members does not change once made and may be shared.
//
// An index records them (index.Write, the blocks of index.WriteAddressable) and a
// full read of the shard makes them (MembersBuilder). A nil *Members is unknown
// members: every method answers as for a member absent.
type Members struct {
	exts    []string
	dtypes  []string // per extension: its element type, or ""; nil when none has one
	samples int
	// buf starts with two bytes per extension, the width in bytes of its sizes and of
	// its element counts (0: none), followed per extension by its sizes and then its
	// counts, each samples values of that width, little-endian: the size (the count)
	// plus one, 0 for a sample without the member.
	buf []byte
}

// maxMemberValue is the largest member size (or element count) a Members holds: as
// large as a tar offset goes, and no sum of a shard's overflows.
const maxMemberValue = 1 << 62

// Exts returns the extensions of the shard's members, in sorted order. The slice is
// the Members' own: do not change it.
func (m *Members) Exts() []string {
	if m == nil {
		return nil
	}
	return m.exts
}

// Samples returns the number of samples m describes (0 for nil).
func (m *Members) Samples() int {
	if m == nil {
		return 0
	}
	return m.samples
}

// Size returns the size in bytes of sample's member of extension ext, and false
// when the sample has none (or m is nil, or sample out of range).
func (m *Members) Size(sample int, ext string) (int64, bool) {
	e := m.index(ext)
	if e < 0 || sample < 0 || sample >= m.samples {
		return 0, false
	}
	c := m.col(e)
	v := value(m.buf[c.off+sample*c.w:], c.w)
	if v == 0 {
		return 0, false
	}
	return int64(v) - 1, true
}

// Items returns the element count of sample's member of extension ext, a 1-D .npy
// array of element type DType(ext), and false when the sample has none or the
// extension has no type.
func (m *Members) Items(sample int, ext string) (int64, bool) {
	e := m.index(ext)
	if e < 0 || sample < 0 || sample >= m.samples {
		return 0, false
	}
	c := m.col(e)
	if c.iw == 0 {
		return 0, false
	}
	v := value(m.buf[c.ioff+sample*c.iw:], c.iw)
	if v == 0 {
		return 0, false
	}
	return int64(v) - 1, true
}

// DType returns the element type of the .npy members of extension ext, as a
// little-endian (or single-byte) numpy descr ("<u2", "<i4", "|u1"; NPYItemSize gives
// its size), or "" when they have none: not a .npy extension, not 1-D arrays of one
// type, or unknown.
func (m *Members) DType(ext string) string {
	e := m.index(ext)
	if e < 0 || m.dtypes == nil {
		return ""
	}
	return m.dtypes[e]
}

// DTypes returns the element type of each extension of Exts, "" for none; nil when
// no extension has one. The slice is the Members' own: do not change it.
func (m *Members) DTypes() []string {
	if m == nil {
		return nil
	}
	return m.dtypes
}

// SampleBytes returns the bytes of sample's members together.
func (m *Members) SampleBytes(sample int) int64 {
	var n int64
	for _, ext := range m.Exts() {
		if s, ok := m.Size(sample, ext); ok {
			n += s
		}
	}
	return n
}

// Bytes returns the memory m holds of its own: the values of its samples and its
// header (the extensions' names, shared by the shards read together, aside).
func (m *Members) Bytes() int64 {
	if m == nil {
		return 0
	}
	return int64(unsafe.Sizeof(*m)) + int64(cap(m.buf))
}

// index returns the position of ext in m.exts, or -1.
func (m *Members) index(ext string) int {
	if m == nil {
		return -1
	}
	for i, x := range m.exts {
		if x == ext {
			return i
		}
	}
	return -1
}

// column is where an extension's values lie in Members.buf.
type column struct{ off, w, ioff, iw int }

// col returns the column of extension e.
func (m *Members) col(e int) column {
	off := 2 * len(m.exts)
	for j := range e {
		off += m.samples * (int(m.buf[2*j]) + int(m.buf[2*j+1]))
	}
	w := int(m.buf[2*e])
	return column{off: off, w: w, ioff: off + m.samples*w, iw: int(m.buf[2*e+1])}
}

// columns returns the columns of every extension.
func (m *Members) columns() []column {
	cs := make([]column, len(m.exts))
	off := 2 * len(m.exts)
	for e := range cs {
		w, iw := int(m.buf[2*e]), int(m.buf[2*e+1])
		cs[e] = column{off: off, w: w, ioff: off + m.samples*w, iw: iw}
		off += m.samples * (w + iw)
	}
	return cs
}

// tarBytes returns the bytes of tar each sample's members take at least, headers
// and padding included, through fn(sample, bytes).
func (m *Members) tarBytes(fn func(sample int, n int64) bool) {
	cs := m.columns()
	for s := range m.samples {
		var n int64
		for _, c := range cs {
			if v := value(m.buf[c.off+s*c.w:], c.w); v != 0 {
				n += blockSize + (int64(v)-1+blockSize-1)/blockSize*blockSize
			}
		}
		if !fn(s, n) {
			return
		}
	}
}

func value(b []byte, w int) uint64 {
	switch w {
	case 1:
		return uint64(b[0])
	case 2:
		return uint64(binary.LittleEndian.Uint16(b))
	case 4:
		return uint64(binary.LittleEndian.Uint32(b))
	}
	return binary.LittleEndian.Uint64(b)
}

func putValue(b []byte, w int, v uint64) {
	switch w {
	case 1:
		b[0] = byte(v)
	case 2:
		binary.LittleEndian.PutUint16(b, uint16(v))
	case 4:
		binary.LittleEndian.PutUint32(b, uint32(v))
	default:
		binary.LittleEndian.PutUint64(b, v)
	}
}

// width returns the bytes a value of at most v takes: 1, 2, 4 or 8.
func width(v uint64) int {
	switch {
	case v < 1<<8:
		return 1
	case v < 1<<16:
		return 2
	case v < 1<<32:
		return 4
	}
	return 8
}

// AppendSizes appends the sizes of m to b as unsigned varints, extension after
// extension in the order of Exts, each the sample's size plus one, 0 for a sample
// without the member: len(Exts())*Samples() varints, what DecodeMembers reads.
func (m *Members) AppendSizes(b []byte) []byte {
	if m == nil {
		return b
	}
	for _, c := range m.columns() {
		for s := range m.samples {
			b = binary.AppendUvarint(b, value(m.buf[c.off+s*c.w:], c.w))
		}
	}
	return b
}

// AppendItems appends the element counts of m to b as AppendSizes does its sizes,
// for the extensions with a type (DTypes) alone.
func (m *Members) AppendItems(b []byte) []byte {
	if m == nil {
		return b
	}
	for _, c := range m.columns() {
		if c.iw == 0 {
			continue
		}
		for s := range m.samples {
			b = binary.AppendUvarint(b, value(m.buf[c.ioff+s*c.iw:], c.iw))
		}
	}
	return b
}

// minimalUvarint is binary.Uvarint for varints written in as few bytes as they need
// (as AppendUvarint writes them); a longer one (a value padded with 0x80 bytes and
// a final 0x00) reports n = 0, so that what decodes encodes back to the same bytes.
func minimalUvarint(b []byte) (uint64, int) {
	v, n := binary.Uvarint(b)
	if n > 1 && b[n-1] == 0 {
		return 0, 0
	}
	return v, n
}

// DecodeMembers returns the Members of a shard of samples samples from its
// extensions (sorted, each once), their element types (nil, or one per extension,
// "" for none) and the varints of AppendSizes and AppendItems. It refuses what no
// shard's members can be: extensions out of order, repeated or not as the Reader
// spells them, or in no sample; a sample without a member; varints fewer or more
// than the samples, or overflowing; a size over 2^62, or sizes that add up past it;
// an element type for a member that is no .npy, or unknown; a count for an absent
// member or none for a present one, or more elements than the member's bytes hold.
func DecodeMembers(samples int, exts, dtypes []string, sizes, items []byte) (*Members, error) {
	if samples < 0 {
		return nil, fmt.Errorf("members of %d samples", samples)
	}
	if samples == 0 && len(exts) > 0 {
		return nil, fmt.Errorf("member extensions %q for no sample", exts)
	}
	for i, e := range exts {
		if e == "" || strings.ContainsAny(e, "/\x00") || strings.ToLower(e) != e {
			return nil, fmt.Errorf("member extension %q: no reader gives it", e)
		}
		if i > 0 && exts[i-1] >= e {
			return nil, fmt.Errorf("member extensions %q and %q: not in order, or repeated", exts[i-1], e)
		}
	}
	if dtypes != nil && len(dtypes) != len(exts) {
		return nil, fmt.Errorf("%d element types for %d member extensions", len(dtypes), len(exts))
	}
	typed := 0
	for i, d := range dtypes {
		if d == "" {
			continue
		}
		if !IsNPY(exts[i]) {
			return nil, fmt.Errorf("element type %q for member %q, which is no .npy", d, exts[i])
		}
		if _, ok := NPYItemSize(d); !ok {
			return nil, fmt.Errorf("element type %q of member %q: not one an index records", d, exts[i])
		}
		typed++
	}
	if typed == 0 {
		dtypes = nil
	}
	// Every value takes a byte at least: the samples are checked before anything is
	// allocated for them.
	if len(exts) > 0 && samples > len(sizes)/len(exts) {
		return nil, fmt.Errorf("sizes: %d bytes for %d samples of %d members", len(sizes), samples, len(exts))
	}
	if typed > 0 && samples > len(items)/typed {
		return nil, fmt.Errorf("element counts: %d bytes for %d samples of %d arrays", len(items), samples, typed)
	}
	m := &Members{exts: exts, dtypes: dtypes, samples: samples}
	widths := make([]byte, 2*len(exts))
	// First pass: the varints are checked, and the widths found.
	var total uint64
	b := sizes
	for e := range exts {
		var most uint64
		present := false
		for range samples {
			v, n := minimalUvarint(b)
			if n <= 0 || v > maxMemberValue+1 {
				return nil, fmt.Errorf("sizes of member %q: a bad varint", exts[e])
			}
			b = b[n:]
			if v != 0 {
				present = true
				if total += v - 1; total > maxMemberValue {
					return nil, fmt.Errorf("sizes: the members add up to more than %d bytes", uint64(maxMemberValue))
				}
			}
			most = max(most, v)
		}
		if !present {
			return nil, fmt.Errorf("member extension %q in no sample", exts[e])
		}
		widths[2*e] = byte(width(most))
	}
	if len(b) > 0 {
		return nil, fmt.Errorf("sizes: more than %d for %d samples of %d members", samples*len(exts), samples, len(exts))
	}
	b = items
	for e := range exts {
		if dtypes == nil || dtypes[e] == "" {
			continue
		}
		var most uint64
		for range samples {
			v, n := minimalUvarint(b)
			if n <= 0 || v > maxMemberValue+1 {
				return nil, fmt.Errorf("element counts of member %q: a bad varint", exts[e])
			}
			b = b[n:]
			most = max(most, v)
		}
		widths[2*e+1] = byte(width(most))
	}
	if len(b) > 0 {
		return nil, fmt.Errorf("element counts: more than %d for %d samples of %d arrays", samples*typed, samples, typed)
	}
	n := len(widths)
	for e := range exts {
		n += samples * (int(widths[2*e]) + int(widths[2*e+1]))
	}
	m.buf = make([]byte, n)
	copy(m.buf, widths)
	// Second pass: the values, checked against one another.
	cs := m.columns()
	b = sizes
	for _, c := range cs {
		for s := range samples {
			v, k := binary.Uvarint(b)
			b = b[k:]
			putValue(m.buf[c.off+s*c.w:], c.w, v)
		}
	}
	b = items
	for e, c := range cs {
		if c.iw == 0 {
			continue
		}
		isz, _ := NPYItemSize(dtypes[e])
		for s := range samples {
			v, k := binary.Uvarint(b)
			b = b[k:]
			size := value(m.buf[c.off+s*c.w:], c.w)
			switch {
			case (v == 0) != (size == 0):
				return nil, fmt.Errorf("element counts of member %q: sample %d has a count and no member, or a member and no count", exts[e], s)
			case v != 0 && (size-1 < npyMinBytes || (v-1) > (size-1-npyMinBytes)/uint64(isz)):
				return nil, fmt.Errorf("element counts of member %q: sample %d's %d elements of %s do not fit in its %d bytes", exts[e], s, v-1, dtypes[e], size-1)
			}
			putValue(m.buf[c.ioff+s*c.iw:], c.iw, v)
		}
	}
	for s := range samples {
		some := false
		for _, c := range cs {
			if value(m.buf[c.off+s*c.w:], c.w) != 0 {
				some = true
				break
			}
		}
		if !some {
			return nil, fmt.Errorf("sizes: sample %d has no member", s)
		}
	}
	return m, nil
}

// npyMinBytes is the fewest bytes of a .npy member: its magic, version and header
// length.
const npyMinBytes = 10

// MembersBuilder makes the Members of a shard read from its start: call Sample for
// each sample in order, then Member (or MemberHead) for each of its members, then
// Members. The zero value is ready to use.
type MembersBuilder struct {
	samples int
	exts    []string
	cols    []builderCol
	// unknown: a .npy member's header was not given; failed: what was given is no
	// shard's members (a member before a sample, an extension twice in a sample).
	unknown, failed bool
}

type builderCol struct {
	sizes []uint64 // per sample so far, the size plus one; samples after its end lack the member
	npy   bool     // a .npy extension
	bad   bool     // not packable: a member not a 1-D array of the type of the others
	dtype string
	items []uint64
}

// Reset empties b for another shard.
func (b *MembersBuilder) Reset() { *b = MembersBuilder{exts: b.exts[:0], cols: b.cols[:0]} }

// Sample starts the next sample.
func (b *MembersBuilder) Sample() { b.samples++ }

// Member records a member of the current sample whose data was not read: its
// extension and size. A .npy member recorded so leaves its extension's type unknown,
// and Members returns nil: use MemberHead for those.
func (b *MembersBuilder) Member(ext string, size int64) { b.add(ext, size, nil, false) }

// MemberHead records a member of the current sample with its first bytes: for a .npy
// member its header at least (ReadNPYHeader), or its whole data; for others head is
// not looked at.
func (b *MembersBuilder) MemberHead(ext string, size int64, head []byte) {
	b.add(ext, size, head, true)
}

func (b *MembersBuilder) add(ext string, size int64, head []byte, known bool) {
	if b.samples == 0 || size < 0 || size > maxMemberValue {
		b.failed = true
		return
	}
	e := slices.Index(b.exts, ext)
	if e < 0 {
		e = len(b.exts)
		b.exts = append(b.exts, ext)
		b.cols = append(b.cols, builderCol{npy: IsNPY(ext)})
	}
	c := &b.cols[e]
	s := b.samples - 1
	if len(c.sizes) > s {
		b.failed = true // twice in one sample: the Reader fails such a sample
		return
	}
	c.sizes = append(padZeros(c.sizes, s), uint64(size)+1)
	if !c.npy || c.bad {
		return
	}
	if !known {
		if size < npyMinBytes {
			c.bad, c.items = true, nil // no .npy
		} else {
			b.unknown = true
		}
		return
	}
	dtype, n, ok := npy1D(head, size)
	if !ok || (c.dtype != "" && dtype != c.dtype) {
		c.bad, c.items = true, nil
		return
	}
	c.dtype = dtype
	c.items = append(padZeros(c.items, s), uint64(n)+1)
}

// padZeros returns v with zeros appended up to n values.
func padZeros(v []uint64, n int) []uint64 {
	for len(v) < n {
		v = append(v, 0)
	}
	return v
}

// Members returns the Members of the samples recorded, or nil when they are not
// known: a .npy member recorded without its header (Member), or members that no
// Reader gives.
func (b *MembersBuilder) Members() *Members {
	if b.failed || b.unknown {
		return nil
	}
	order := make([]int, len(b.exts))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(i, j int) int { return cmp.Compare(b.exts[i], b.exts[j]) })
	m := &Members{exts: make([]string, len(order)), samples: b.samples}
	n := 2 * len(order)
	for k, i := range order {
		c := &b.cols[i]
		m.exts[k] = b.exts[i]
		w := width(slices.Max(c.sizes))
		iw := 0
		if !c.bad && c.dtype != "" {
			iw = width(slices.Max(c.items))
			if m.dtypes == nil {
				m.dtypes = make([]string, len(order))
			}
			m.dtypes[k] = c.dtype
		}
		n += b.samples * (w + iw)
	}
	m.buf = make([]byte, n)
	off := 2 * len(order)
	for k, i := range order {
		c := &b.cols[i]
		w, iw := width(slices.Max(c.sizes)), 0
		if m.dtypes != nil && m.dtypes[k] != "" {
			iw = width(slices.Max(c.items))
		}
		m.buf[2*k], m.buf[2*k+1] = byte(w), byte(iw)
		for s, v := range c.sizes {
			putValue(m.buf[off+s*w:], w, v)
		}
		off += b.samples * w
		if iw > 0 {
			for s, v := range c.items {
				putValue(m.buf[off+s*iw:], iw, v)
			}
			off += b.samples * iw
		}
	}
	return m
}
