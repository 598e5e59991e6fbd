package index

import "bytes"

// parseLine parses a shard's line as Write writes it ({"url":...,"version":...,
// "size":N,"samples":N,"offsets":...}, those keys in that order, version, size and
// offsets optional, no spaces), without encoding/json's reflection: a tenth of the
// time of a line of 10^6. ok is false for anything else (escapes, bytes beyond
// ASCII, other keys, orders or spellings of numbers), which json.Unmarshal parses
// instead; what it accepts, json.Unmarshal reads the same. A URL equal to want is
// want, without a string of its own.
func parseLine(b []byte, want string) (l line, samples int, ok bool) {
	var url, version, offsets []byte
	if b, ok = cut(b, `{"url":`); !ok {
		return l, 0, false
	}
	if url, b, ok = str(b); !ok {
		return l, 0, false
	}
	if rest, found := cut(b, `,"version":`); found {
		if version, b, ok = str(rest); !ok {
			return l, 0, false
		}
	}
	if rest, found := cut(b, `,"size":`); found {
		if l.Size, b, ok = num(rest); !ok {
			return l, 0, false
		}
	}
	if b, ok = cut(b, `,"samples":`); !ok {
		return l, 0, false
	}
	var n int64
	if n, b, ok = num(b); !ok {
		return l, 0, false
	}
	if rest, found := cut(b, `,"offsets":`); found {
		if offsets, b, ok = str(rest); !ok {
			return l, 0, false
		}
	}
	if string(b) != "}" {
		return l, 0, false
	}
	l.URL, l.Version, l.Offsets = want, string(version), string(offsets)
	if string(url) != want {
		l.URL = string(url)
	}
	return l, int(n), true
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
