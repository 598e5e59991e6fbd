// Package strs copies short strings into shared chunks: one allocation a chunk
// rather than one a string, and no size class's rounding up. An index holds 10^6
// shards' versions and URLs this way; a tar reader its members' names, two or more a
// sample, on the loader's hot path.
package strs

import "unsafe"

// Arena hands out strings carved from chunks of Chunk bytes. The bytes of a string
// handed out are never written again, so the strings are as immutable as any; a
// string keeps its whole chunk alive, so Chunk bounds what one string kept long
// holds. Strings longer than Chunk/16 get an allocation of their own. The zero
// Arena has chunks of 64 KiB. An Arena is not safe for concurrent use.
type Arena struct {
	Chunk int // bytes a chunk; 0: 64 KiB
	buf   []byte
}

// Of returns b as a string.
func (a *Arena) Of(b []byte) string {
	chunk := a.Chunk
	if chunk <= 0 {
		chunk = 64 << 10
	}
	switch {
	case len(b) == 0:
		return ""
	case len(b) > chunk/16:
		return string(b)
	case cap(a.buf)-len(a.buf) < len(b):
		a.buf = make([]byte, 0, chunk)
	}
	n := len(a.buf)
	a.buf = append(a.buf, b...) // within its capacity: the bytes before n stay as they are
	return unsafe.String(&a.buf[n], len(b))
}
