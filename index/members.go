package index

// The members of a shard (shard.Members) in an index: in a line of Write, as its
// "exts", "dtypes", "sizes" and "items"; in a block of WriteAddressable, after its
// offsets, in binary.

import (
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/shardload/shardload/shard"
)

// rawMembers are a line's members as parsed, not yet decoded.
type rawMembers struct {
	known  bool // the line has members
	bad    bool // it has sizes, types or counts without extensions
	parsed bool // by parseLine, into the raw fields; else by json.Unmarshal
	// From parseLine: the JSON arrays' contents (`"cls","jpg"`), with hasDTypes
	// telling an absent "dtypes" from an empty one.
	rawExts, rawDTypes []byte
	hasDTypes          bool
	// From json.Unmarshal.
	exts, dtypes []string
	sizes, items []byte // base64
}

// memberNames decodes the members of an index's shards, whose extensions and types
// are the same strings, and mostly the same lists, from shard to shard: one copy of
// each name, and one list of them for the shards that have the same as the shard
// before.
type memberNames struct {
	names        map[string]string
	exts, dtypes []string // the lists of the shard before
	parts        [][]byte
	sizes, items []byte // decoded from base64
}

// name returns b as a string, one copy for every equal b.
func (c *memberNames) name(b []byte) string {
	if s, ok := c.names[string(b)]; ok {
		return s
	}
	if c.names == nil {
		c.names = map[string]string{}
	}
	s := string(b)
	c.names[s] = s
	return s
}

// list returns the strings of parts, as the list *last when it is the same (which
// it then stays), else as a new list (which becomes *last).
func (c *memberNames) list(parts [][]byte, last *[]string) []string {
	if len(parts) == len(*last) && *last != nil {
		same := true
		for i, p := range parts {
			if string(p) != (*last)[i] {
				same = false
				break
			}
		}
		if same {
			return *last
		}
	}
	out := make([]string, len(parts))
	for i, p := range parts {
		out[i] = c.name(p)
	}
	*last = out
	return out
}

// splitStrs returns the strings of the contents of a JSON array of strings that
// parseLine accepted (strArray), appended to parts[:0].
func splitStrs(b []byte, parts [][]byte) [][]byte {
	parts = parts[:0]
	for len(b) > 0 {
		s, rest, _ := str(b)
		parts = append(parts, s)
		b = rest
		if len(b) > 0 {
			b = b[1:] // ','
		}
	}
	return parts
}

// bytesOf returns ss as byte slices, appended to parts[:0].
func bytesOf(ss []string, parts [][]byte) [][]byte {
	parts = parts[:0]
	for _, s := range ss {
		parts = append(parts, []byte(s))
	}
	return parts
}

// decode returns the members r describes, of a shard of samples samples.
func (c *memberNames) decode(r rawMembers, samples int) (*shard.Members, error) {
	if r.bad {
		return nil, errors.New(`"dtypes", "sizes" or "items" without "exts"`)
	}
	var exts, dtypes []string
	if r.parsed {
		c.parts = splitStrs(r.rawExts, c.parts)
	} else {
		c.parts = bytesOf(r.exts, c.parts)
	}
	exts = c.list(c.parts, &c.exts)
	switch {
	case r.parsed && r.hasDTypes:
		c.parts = splitStrs(r.rawDTypes, c.parts)
		dtypes = c.list(c.parts, &c.dtypes)
	case !r.parsed && r.dtypes != nil:
		c.parts = bytesOf(r.dtypes, c.parts)
		dtypes = c.list(c.parts, &c.dtypes)
	}
	var err error
	if c.sizes, err = decodeBase64(r.sizes, c.sizes); err != nil {
		return nil, fmt.Errorf("sizes: %v", err)
	}
	if c.items, err = decodeBase64(r.items, c.items); err != nil {
		return nil, fmt.Errorf("element counts: %v", err)
	}
	return shard.DecodeMembers(samples, exts, dtypes, c.sizes, c.items)
}

// decodeBase64 decodes s (standard alphabet, no padding) into scratch, grown as it
// needs.
func decodeBase64(s, scratch []byte) ([]byte, error) {
	if n := base64.RawStdEncoding.DecodedLen(len(s)); cap(scratch) < n {
		scratch = make([]byte, n)
	}
	n, err := base64.RawStdEncoding.Decode(scratch[:cap(scratch)], s)
	if err != nil {
		return scratch[:0], err
	}
	return scratch[:n], nil
}

// appendMembers appends m to b as a block holds it (nothing for nil): the number of
// extensions and each (a uvarint length and its bytes), the number of types (0, or
// as many as the extensions) and each, then the uvarint length and bytes of
// m.AppendSizes and of m.AppendItems.
func appendMembers(b []byte, m *shard.Members) []byte {
	if m == nil {
		return b
	}
	appendStrs := func(b []byte, ss []string) []byte {
		b = binary.AppendUvarint(b, uint64(len(ss)))
		for _, s := range ss {
			b = binary.AppendUvarint(b, uint64(len(s)))
			b = append(b, s...)
		}
		return b
	}
	b = appendStrs(b, m.Exts())
	b = appendStrs(b, m.DTypes())
	// The varints' length first: they are written after it, and moved if it takes
	// more than the byte left for it.
	for _, appendVals := range []func([]byte) []byte{m.AppendSizes, m.AppendItems} {
		at := len(b)
		b = appendVals(append(b, 0))
		n := len(b) - at - 1
		if k := uvarintLen(uint64(n)); k > 1 {
			b = append(b, make([]byte, k-1)...)
			copy(b[at+k:], b[at+1:at+1+n])
		}
		binary.PutUvarint(b[at:], uint64(n))
	}
	return b
}

// decodeMembers decodes the members of a shard of samples samples that
// appendMembers wrote, b, whole.
func (c *memberNames) decodeMembers(b []byte, samples int) (*shard.Members, error) {
	next := func() ([]byte, bool) {
		n, k := binary.Uvarint(b)
		if k <= 0 || n > uint64(len(b)-k) {
			return nil, false
		}
		s := b[k : k+int(n)]
		b = b[k+int(n):]
		return s, true
	}
	strs := func(last *[]string) ([]string, bool) {
		n, k := binary.Uvarint(b)
		if k <= 0 || n > uint64(len(b)-k) { // every string takes a byte at least
			return nil, false
		}
		b = b[k:]
		c.parts = c.parts[:0]
		for range n {
			s, ok := next()
			if !ok {
				return nil, false
			}
			c.parts = append(c.parts, s)
		}
		if n == 0 {
			return []string{}, true
		}
		return c.list(c.parts, last), true
	}
	exts, ok1 := strs(&c.exts)
	dtypes, ok2 := strs(&c.dtypes)
	sizes, ok3 := next()
	items, ok4 := next()
	if !ok1 || !ok2 || !ok3 || !ok4 || len(b) > 0 {
		return nil, errors.New("members: cut short, or bytes after them")
	}
	if len(dtypes) == 0 {
		dtypes = nil
	}
	return shard.DecodeMembers(samples, exts, dtypes, sizes, items)
}
