package shard

// Samples and their fields, and the memory their data is read into.

import "github.com/shardload/shardload/mem"

// Field is one member of a sample.
type Field struct {
	// Ext is the extension: the member's base name after its first dot, lower-cased
	// ("seg.png" for "a/b/x.seg.png").
	Ext string
	// Name is the member's path in the tar, as written.
	Name string
	// Size is the member's length in bytes.
	Size int64
	// Offset is the byte offset of the member's data in the tar stream.
	Offset int64
	// Data holds the member's bytes; nil when Options.SizesOnly is set. It is owned by
	// the Reader and valid until the next call to Next, except with Options.Buffers:
	// then it lies in Sample.Buf.
	Data []byte
}

// Sample is a group of adjacent members that share a key.
type Sample struct {
	// Key is the member path up to the first dot of its base name (WebDataset's
	// __key__); directories stay in the key.
	Key string
	// URL is the shard the sample came from (WebDataset's __url__).
	URL string
	// Offset is the byte offset of the header of the sample's first member.
	Offset int64
	// Fields are the sample's members in the order they appear in the tar.
	Fields []Field
	// Buf, with Options.Buffers, is the buffer from Buffers.Get that holds every
	// field's Data, one after the other (its length is their total), or nil when
	// they are all empty. The caller owns it: it keeps it with the data or gives it
	// back with Buffers.Put.
	Buf []byte
}

// Get returns the data of the field with extension ext, and whether it exists.
func (s *Sample) Get(ext string) ([]byte, bool) {
	for i := range s.Fields {
		if s.Fields[i].Ext == ext {
			return s.Fields[i].Data, true
		}
	}
	return nil, false
}

// Bytes returns the total size of the sample's members.
func (s *Sample) Bytes() int64 {
	var n int64
	for _, f := range s.Fields {
		n += f.Size
	}
	return n
}

// Clone returns a deep copy of s whose data stays valid after the Reader moves on. The
// copies of all fields share one allocation.
func (s *Sample) Clone() *Sample {
	c := &Sample{Key: s.Key, URL: s.URL, Offset: s.Offset, Fields: make([]Field, len(s.Fields))}
	var n int
	for _, f := range s.Fields {
		n += len(f.Data)
	}
	buf := make([]byte, 0, n)
	for i, f := range s.Fields {
		c.Fields[i] = f
		if f.Data != nil {
			start := len(buf)
			buf = append(buf, f.Data...)
			c.Fields[i].Data = buf[start:len(buf):len(buf)]
		}
	}
	return c
}

// sampleSize is the bytes of s's members so far.
func sampleSize(s *Sample) int64 {
	var n int64
	for _, f := range s.Fields {
		n += f.Size
	}
	return n
}

// hand gives a complete sample to the caller: with Options.Buffers, its buffer too.
func (r *Reader) hand(s *Sample) *Sample {
	if r.opts.Buffers != nil && r.used > 0 {
		s.Buf = r.buf[:r.used]
		r.buf = nil
		r.hint = r.used + r.used/16
	}
	return s
}

// readData reads size bytes of the current member into dst when it is not nil
// (Options.Place), else into the arena.
func (r *Reader) readData(size int64, dst []byte) ([]byte, error) {
	if dst != nil {
		m, err := readFull(r.tr, dst)
		if err != nil {
			return dst[:m], err
		}
		return dst, nil
	}
	n := int(size)
	if n > cap(r.buf)-r.used {
		if n > upfront {
			return r.readGrowing(n)
		}
		r.grow(0, n)
	}
	b := r.buf[r.used : r.used+n : r.used+n]
	m, err := readFull(r.tr, b) // an error that comes with the last bytes counts
	if err != nil {
		return b[:m], err
	}
	r.used += n
	return b, nil
}

// upfront is the largest member size readData makes room for before reading: a
// larger member's room grows with the bytes that arrive, so that a header claiming
// more than the stream holds (up to MaxMemberSize) costs memory only in proportion to
// the data actually there.
const upfront = 8 << 20

// readGrowing reads n bytes of the current member into the arena, growing it as the
// bytes arrive.
func (r *Reader) readGrowing(n int) ([]byte, error) {
	got := 0
	for got < n {
		if r.used+got == cap(r.buf) {
			r.grow(got, min(n-got, max(got, upfront)))
		}
		end := min(cap(r.buf), r.used+n)
		m, err := readFull(r.tr, r.buf[r.used+got:end])
		got += m
		if err != nil {
			return r.buf[r.used : r.used+got : r.used+got], err
		}
	}
	b := r.buf[r.used : r.used+n : r.used+n]
	r.used += n
	return b, nil
}

// grow makes room for more bytes after the arena's used bytes and the partial bytes
// of the current member that follow them, which it keeps.
func (r *Reader) grow(partial, more int) {
	if r.opts.Buffers != nil {
		r.regrow(partial, more)
		return
	}
	// Earlier fields of this sample keep the old array alive; the current member
	// (and the next sample) start at the front of the new one.
	nb := make([]byte, max(2*cap(r.buf), partial+more, 64<<10))
	copy(nb, r.buf[r.used:r.used+partial])
	r.buf, r.used = nb, 0
}

// regrow gets a buffer from Options.Buffers with room for more bytes after the used
// and partial ones, moving the current sample's fields (and the partial bytes) into it.
func (r *Reader) regrow(partial, more int) {
	nb := r.opts.Buffers.Get(max(r.used+partial+more, r.hint))
	nb = nb[:cap(nb)]
	copy(nb, r.buf[:r.used+partial])
	off := 0
	for i := range r.sample.Fields {
		f := &r.sample.Fields[i]
		k := len(f.Data)
		if _, in := mem.Within(f.Data, r.buf[:r.used]); k > 0 && !in {
			continue // read to its place (Options.Place)
		}
		f.Data = nb[off : off+k : off+k]
		off += k
	}
	if r.buf != nil {
		r.opts.Buffers.Put(r.buf[:0])
	}
	r.buf = nb
}
