package cache

import (
	"context"
	"fmt"
	"io"

	"github.com/shardload/shardload/source"
)

// OpenAt returns length bytes from off (to the end when length < 0) of the object
// info describes (info.URL at info.Version and info.Size, as a Stat answered), without
// asking the source again: from a cached copy of that version, or from the one fetch
// of the whole object into the cache, which the opens of the same object join
// (every process sharing the directory: they wait for it and read what it
// committed). Where Open and OpenRange each ask the source for the object's Info,
// and OpenRange reads a part of an object not cached yet from the source, OpenAt
// serves many reads of one object at one version (an index every rank of a node
// reads, counts and blocks) with one fetch per node and no request after it.
//
// An object at another version than info's at the source fails the fetch with
// ErrChanged where its size shows it; the caller's Stat is the version check.
func (c *Cache) OpenAt(ctx context.Context, info source.Info, off, length int64) (io.ReadCloser, error) {
	url := info.URL
	if off < 0 {
		return nil, &source.Error{Op: "open", URL: url, Err: fmt.Errorf("cache: negative offset %d", off)}
	}
	if err := ctx.Err(); err != nil {
		return nil, &source.Error{Op: "open", URL: url, Err: err}
	}
	r, _, err := c.openAt(ctx, url, 0, 0, info, check{ok: true})
	if err != nil {
		return nil, err
	}
	return section(url, r, off, length)
}
