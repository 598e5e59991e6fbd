package index

import "bytes"

// rawLine is a shard's line as parseLine finds it: its strings are the bytes of the
// line, not copies.
type rawLine struct {
	url, version, offsets []byte
	size                  int64
	samples               int
	members               rawMembers
}

// parseLine parses a shard's line as Write writes it ({"url":...,"version":...,
// "size":N,"samples":N,"offsets":...,"exts":[...],"dtypes":[...],"sizes":...,
// "items":...}, those keys in that order, all but url and samples optional, no
// spaces), without encoding/json's reflection: a tenth of the
// time of a line of 10^6, and no allocation. ok is false for anything else (escapes
// other than \" and \\ in the version, which it removes in place in b, as a quoted S3
// ETag needs; bytes beyond ASCII, other keys, orders or spellings of numbers), which
// json.Unmarshal parses instead; what it accepts, json.Unmarshal reads the same.
func parseLine(b []byte) (l rawLine, ok bool) {
	if b, ok = cut(b, `{"url":`); !ok {
		return l, false
	}
	if l.url, b, ok = str(b); !ok {
		return l, false
	}
	escaped := false
	if rest, found := cut(b, `,"version":`); found {
		if l.version, b, escaped, ok = quotedStr(rest); !ok {
			return l, false
		}
	}
	if rest, found := cut(b, `,"size":`); found {
		if l.size, b, ok = num(rest); !ok {
			return l, false
		}
	}
	if b, ok = cut(b, `,"samples":`); !ok {
		return l, false
	}
	var n int64
	if n, b, ok = num(b); !ok {
		return l, false
	}
	l.samples = int(n)
	if rest, found := cut(b, `,"offsets":`); found {
		if l.offsets, b, ok = str(rest); !ok {
			return l, false
		}
	}
	m := &l.members
	m.parsed = true
	if rest, found := cut(b, `,"exts":`); found {
		if m.rawExts, b, ok = strArray(rest); !ok {
			return l, false
		}
		m.known = true
	}
	if rest, found := cut(b, `,"dtypes":`); found {
		if m.rawDTypes, b, ok = strArray(rest); !ok {
			return l, false
		}
		m.hasDTypes = true
	}
	if rest, found := cut(b, `,"sizes":`); found {
		if m.sizes, b, ok = str(rest); !ok {
			return l, false
		}
	}
	if rest, found := cut(b, `,"items":`); found {
		if m.items, b, ok = str(rest); !ok {
			return l, false
		}
	}
	if !m.known && (m.hasDTypes || len(m.sizes) > 0 || len(m.items) > 0) {
		m.known, m.bad = true, true // as json.Unmarshal's line: sizes without extensions
	}
	if string(b) != "}" {
		return l, false
	}
	if escaped {
		l.version = unescape(l.version)
	}
	return l, true
}

// cut returns b after prefix, if b starts with it.
func cut(b []byte, prefix string) ([]byte, bool) {
	if !bytes.HasPrefix(b, []byte(prefix)) {
		return b, false
	}
	return b[len(prefix):], true
}

// str parses a JSON string of printable ASCII without escapes at the start of b.
func str(b []byte) (s, rest []byte, ok bool) {
	if len(b) == 0 || b[0] != '"' {
		return nil, b, false
	}
	for i := 1; i < len(b); i++ {
		switch c := b[i]; {
		case c == '"':
			return b[1:i], b[i+1:], true
		case c == '\\' || c < 0x20 || c >= 0x7f:
			return nil, b, false
		}
	}
	return nil, b, false
}

// strArray parses a JSON array of strings that str parses at the start of b: its
// contents are what lies between the brackets.
func strArray(b []byte) (contents, rest []byte, ok bool) {
	if len(b) < 2 || b[0] != '[' {
		return nil, b, false
	}
	if b[1] == ']' {
		return b[1:1], b[2:], true
	}
	i := 1
	for {
		_, r, ok := str(b[i:])
		if !ok || len(r) == 0 {
			return nil, b, false
		}
		i = len(b) - len(r)
		switch b[i] {
		case ',':
			i++
		case ']':
			return b[1:i], b[i+1:], true
		default:
			return nil, b, false
		}
	}
}

// quotedStr is str for a string that may hold the escapes \" and \\ as well (an S3
// ETag is a quoted string: "version":"\"9b2cf535f27731c974343645a3985328\""): s is
// the string as written, escapes in, and escaped says whether there are any.
func quotedStr(b []byte) (s, rest []byte, escaped, ok bool) {
	if len(b) == 0 || b[0] != '"' {
		return nil, b, false, false
	}
	for i := 1; i < len(b); i++ {
		switch c := b[i]; {
		case c == '"':
			return b[1:i], b[i+1:], escaped, true
		case c == '\\':
			if i+1 == len(b) || b[i+1] != '"' && b[i+1] != '\\' {
				return nil, b, false, false
			}
			escaped = true
			i++
		case c < 0x20 || c >= 0x7f:
			return nil, b, false, false
		}
	}
	return nil, b, false, false
}

// unescape removes the backslashes of s's escapes (\" and \\, as quotedStr
// accepts them) in place, and returns the shorter s.
func unescape(s []byte) []byte {
	n := 0
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' {
			i++
		}
		s[n] = s[i]
		n++
	}
	return s[:n]
}

// num parses a non-negative JSON integer of at most 18 digits at the start of b.
func num(b []byte) (n int64, rest []byte, ok bool) {
	i := 0
	for i < len(b) && b[i] >= '0' && b[i] <= '9' {
		n = n*10 + int64(b[i]-'0')
		i++
	}
	if i == 0 || i > 18 || (b[0] == '0' && i > 1) || (i < len(b) && (b[i] == '.' || b[i] == 'e' || b[i] == 'E')) {
		return 0, b, false
	}
	return n, b[i:], true
}
