package cache

// The open path: serving an open from a tier, a fill in flight, a new fill or the source.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/shardload/shardload/source"
)

// Open returns the object, from the memory tier of node 0, the disk tier, a fetch in
// flight, or a new fetch that fills the cache as it is read. Streams of cached entries
// implement io.Seeker.
func (c *Cache) Open(ctx context.Context, url string) (io.ReadCloser, error) {
	r, _, err := c.open(ctx, url, 0, 0)
	return r, err
}

// OpenRange returns length bytes of the object from off (to the end when length < 0).
// A cached object is served from the cache, and so is the whole object (off 0,
// length < 0), fetched into the cache when it is not there. Any other range of an
// object not cached is read from the source as a range when the source is a
// source.RangeReader (and cut from a whole fetch when it is not), while the whole
// object is fetched into the cache in the background for the reads that follow (the
// node's other ranks, the next epoch): at most maxBehind objects at a time, one fetch
// per object, into free room only (see "Eviction by next use" in the package
// documentation). A later range that fetch has written already is read from it.
func (c *Cache) OpenRange(ctx context.Context, url string, off, length int64) (io.ReadCloser, error) {
	return c.openRange(ctx, url, 0, off, length)
}

// OpenVersion is OpenRange provided the object is still at version (an earlier
// Info.Version): otherwise it fails with an error wrapping source.ErrChanged; a
// range of an object not cached of at most 64 MiB (RangeFillMax) is served from a
// fetch of the whole object rather than read as a range. The
// version is compared with the source's, as Open validates a cached copy: one Stat
// (which an unreachable source answers with the cached copy's version), or none
// when a cached copy at version was found at the source less than
// Options.ValidateWithin before.
func (c *Cache) OpenVersion(ctx context.Context, url, version string, off, length int64) (io.ReadCloser, error) {
	if off < 0 {
		return nil, &source.Error{Op: "open", URL: url, Err: fmt.Errorf("cache: negative offset %d", off)}
	}
	if err := ctx.Err(); err != nil {
		return nil, &source.Error{Op: "open", URL: url, Err: err}
	}
	for share := true; ; share = false {
		info, chk, err := c.validate(ctx, url, version, share)
		if err != nil {
			return nil, err
		}
		if info.Version != version {
			return nil, &source.Error{Op: "open", URL: url, Err: fmt.Errorf("%w: version %s, want %s", source.ErrChanged, info.Version, version)}
		}
		if _, ok := c.cachedVersion(url); !ok && (off > 0 || length >= 0) && !c.rangeFills(info) {
			if r := c.joinCovering(ctx, url, version, off, length); r != nil {
				return r, nil
			}
			if rr := c.rangeReader(url); rr != nil {
				c.n.bypassed.Add(1)
				c.fillBehind(ctx, url)
				return c.bypassed(ctx)(rr.OpenRange(ctx, url, off, length))
			}
		}
		r, _, err := c.openAt(ctx, url, 0, 0, info, chk)
		if errors.Is(err, errUnshared) && share {
			continue
		}
		if err != nil {
			return nil, err
		}
		return section(url, r, off, length)
	}
}

func (c *Cache) openRange(ctx context.Context, url string, node int, off, length int64) (io.ReadCloser, error) {
	if off < 0 {
		return nil, &source.Error{Op: "open", URL: url, Err: fmt.Errorf("cache: negative offset %d", off)}
	}
	if _, ok := c.cachedVersion(url); !ok && (off > 0 || length >= 0) {
		if r := c.joinCovering(ctx, url, "", off, length); r != nil {
			return r, nil
		}
		if rr := c.rangeReader(url); rr != nil {
			c.n.bypassed.Add(1)
			c.fillBehind(ctx, url)
			return c.bypassed(ctx)(rr.OpenRange(ctx, url, off, length))
		}
	}
	r, _, err := c.open(ctx, url, node, 0)
	if err != nil {
		return nil, err
	}
	return section(url, r, off, length)
}

// RangeFillMax is the largest object of which OpenVersion serves a range, when the
// object is not cached, from a fetch of the whole object into the cache (started,
// joined, or another process's, waited for) rather than as a range read from the
// source with the whole object fetched behind it. Through the fetch, the node's
// store sends the object once where its readers read it in parts (the ranks of a
// node that split a shard, a whole shard read as a range), at the cost of the range
// waiting for the bytes before it (up to 64 MiB) and, where another process fetches
// the object, for its end; a larger object's ranges are read as ranges at once.
const RangeFillMax = 64 << 20

// rangeFillMax is RangeFillMax, lowered by tests.
var rangeFillMax int64 = RangeFillMax

// rangeFills reports whether a range of the object at info, not cached, is served
// from a fetch of the whole object (RangeFillMax): there is a tier to fill, and the
// object is of a known size no larger than that.
func (c *Cache) rangeFills(info source.Info) bool {
	return (c.disk != nil || c.mem != nil) && info.Size >= 0 && info.Size <= rangeFillMax
}

// section returns length bytes of r from off (the rest, when length < 0), seeking
// where r can; r is closed when that fails. A reader of a fetch in flight starts
// at off without reading the bytes before it, and reads only the range from the
// source if the fetch turns to the source (not admitted, no room).
func section(url string, r io.ReadCloser, off, length int64) (io.ReadCloser, error) {
	if fr, ok := r.(*fillReader); ok && fr.off == 0 && fr.up == nil {
		fr.off, fr.end = off, -1
		if length >= 0 {
			fr.end = off + length
		}
	} else if sk, ok := r.(io.Seeker); ok {
		if _, err := sk.Seek(off, io.SeekStart); err != nil {
			r.Close()
			return nil, &source.Error{Op: "open", URL: url, Err: err}
		}
	} else if _, err := io.CopyN(io.Discard, r, off); err != nil && err != io.EOF {
		r.Close()
		return nil, err
	}
	if length < 0 {
		return r, nil
	}
	return struct {
		io.Reader
		io.Closer
	}{io.LimitReader(r, length), r}, nil
}

// maxBehind bounds the objects fetched into the cache in the background at once.
const maxBehind = 2

// behindKey marks the context of a fillBehind's open: its fill is behind.
type behindKey struct{}

// fillBehind starts fetching url into the cache in the background, unless a fetch of
// it is in flight, the cache is closing, or maxBehind are running. The fetch is an
// open with no reader: the fill it starts runs to its end whether read or not. It
// counts in the Tally of ctx, the context of the read that wanted it.
func (c *Cache) fillBehind(ctx context.Context, url string) {
	if c.disk == nil && c.mem == nil {
		return
	}
	k := key(url)
	c.mu.Lock()
	if c.closed || c.fills[k] != nil || c.behind[k] || len(c.behind) >= maxBehind {
		c.mu.Unlock()
		return
	}
	c.behind[k] = true
	c.behindWG.Add(1)
	c.mu.Unlock()
	go func() {
		defer c.behindWG.Done()
		defer func() {
			c.mu.Lock()
			delete(c.behind, k)
			c.mu.Unlock()
		}()
		r, _, err := c.open(context.WithValue(WithTally(c.ctx, tallyOf(ctx)), behindKey{}, true), url, 0, 0)
		if err != nil {
			return
		}
		if fr, ok := r.(*fillReader); ok {
			// Hold the object in behind until its fill ends (committed, or given up:
			// no room), without reading it.
			fr.f.wait(c.ctx)
		}
		r.Close()
	}()
}

// joinCovering returns a reader of the range [off, off+length) of url from the
// object's fetch in flight (a fetch behind its earlier ranges, most often) when that
// fetch, of version (any when ""), has written those bytes already: the range is
// then not read from the source a second time. It returns nil when there is no such
// fetch, when it has not got that far (a range ahead of it is read from the source,
// not waited for), and for a range to the object's end.
func (c *Cache) joinCovering(ctx context.Context, url, version string, off, length int64) io.ReadCloser {
	if length < 0 {
		return nil
	}
	c.mu.Lock()
	f := c.fills[key(url)]
	if f == nil || version != "" && f.info.Version != version {
		c.mu.Unlock()
		return nil
	}
	f.mu.Lock()
	covered := f.state == streaming && f.writeErr == nil && !f.adopted && f.n >= off+length
	f.mu.Unlock()
	if !covered {
		c.mu.Unlock()
		return nil
	}
	f.readers++
	f.fileRefs++
	c.mu.Unlock()
	c.n.joined.Add(1)
	t := tallyOf(ctx)
	r, err := section(url, &fillReader{ctx: ctx, t: t, f: f, own: f.isFor(t)}, off, length)
	if err != nil {
		return nil
	}
	return r
}

// upstream returns the source that serves url: the upstream itself or, behind a
// Registry (as Wrap builds), the source registered for url's scheme.
func (c *Cache) upstream(url string) (source.Source, error) {
	if res, ok := c.up.(source.Resolver); ok {
		return res.Lookup(url)
	}
	return c.up, nil
}

// openUp opens url at the source to fill the cache with it, at info, the version
// and size the open's check has just found there: without asking the source again
// where it can (source.InfoOpener), one request less a fetch, and the bytes are
// then those of the version the entry records (an object written since fails with
// ErrChanged).
func (c *Cache) openUp(ctx context.Context, url string, info source.Info) (io.ReadCloser, error) {
	if up, err := c.upstream(url); err == nil && info.Version != "" && info.Size >= 0 {
		if op, ok := up.(source.InfoOpener); ok {
			info.URL = url
			r, err := op.OpenInfo(ctx, info)
			return r, changedAt(url, err)
		}
	}
	return c.up.Open(ctx, url)
}

// changedAt returns err, a read of url pinned to a version, as the cache's
// ErrChanged when the source says the object changed since.
func changedAt(url string, err error) error {
	if se := (*source.Error)(nil); errors.Is(err, source.ErrChanged) && errors.As(err, &se) {
		return &source.Error{Op: "read", URL: url, Err: fmt.Errorf("%w: %w", ErrChanged, se.Err)}
	}
	return err
}

// rangeReader returns the upstream that reads ranges of url; nil when it has no
// ranged reads.
func (c *Cache) rangeReader(url string) source.RangeReader {
	up, err := c.upstream(url)
	if err != nil {
		return nil
	}
	rr, _ := up.(source.RangeReader)
	return rr
}

// how says where an open was served from.
type how int

const (
	fromMemory how = iota
	fromDisk
	fromFetch  // started a fetch
	fromJoin   // joined a fetch in flight
	fromSource // bypassed the cache
)

// open serves url. It re-checks the tiers after a corrupt entry is dropped, once.
func (c *Cache) open(ctx context.Context, url string, node int, attempt int) (io.ReadCloser, how, error) {
	return c.openWant(ctx, url, "", node, attempt)
}

// openWant is open; want, when not empty, is the version the caller expects: a
// cached copy of another version is not served from a shared check (validate).
func (c *Cache) openWant(ctx context.Context, url, want string, node int, attempt int) (io.ReadCloser, how, error) {
	if err := ctx.Err(); err != nil {
		return nil, 0, &source.Error{Op: "open", URL: url, Err: err}
	}
	for share := true; ; share = false {
		info, chk, err := c.validate(ctx, url, want, share)
		if err != nil {
			return nil, 0, err
		}
		r, how, err := c.openAt(ctx, url, node, attempt, info, chk)
		if errors.Is(err, errUnshared) && share {
			continue
		}
		return r, how, err
	}
}

// openAt serves url at the version info describes, settled as chk says.
func (c *Cache) openAt(ctx context.Context, url string, node, attempt int, info source.Info, chk check) (io.ReadCloser, how, error) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil, 0, &source.Error{Op: "open", URL: url, Err: ErrClosed}
	}
	k := key(url)
	if me := c.memLookup(k, node, info); me != nil {
		me.refs++
		c.mu.Unlock()
		c.n.memHits.Add(1)
		return &memReader{Reader: bytes.NewReader(me.data), c: c, t: tallyOf(ctx), e: me}, fromMemory, nil
	}
	if c.disk != nil {
		if de, ok := c.disk.get(k); ok && de.matches(info) {
			de.refs++
			c.mu.Unlock()
			r, err := c.openDisk(ctx, url, de, node)
			if errors.Is(err, errVanished) && attempt < 3 {
				return c.open(ctx, url, node, attempt+1)
			}
			if errors.Is(err, ErrCorrupt) && attempt == 0 {
				c.opts.Logf("cache: %s: %v; fetching it again", k, err)
				return c.open(ctx, url, node, attempt+1)
			}
			if err != nil {
				return nil, 0, err
			}
			c.n.diskHits.Add(1)
			return r, fromDisk, nil
		}
	}
	if !chk.ok {
		// The source is unreachable and nothing matching is cached any more.
		c.mu.Unlock()
		r, err := c.bypassed(ctx)(c.up.Open(ctx, url))
		return r, fromSource, err
	}
	if f := c.fills[k]; f != nil && f.info.Version == info.Version && f.info.Size == info.Size {
		f.readers++
		f.fileRefs++
		c.mu.Unlock()
		c.n.joined.Add(1)
		t := tallyOf(ctx)
		return &fillReader{ctx: ctx, t: t, f: f, own: f.isFor(t)}, fromJoin, nil
	}
	if chk.shared {
		c.mu.Unlock()
		return nil, 0, errUnshared
	}
	if (c.disk == nil && c.mem == nil) || info.Size < 0 {
		// No tier, or a size the source cannot tell: nothing to reserve.
		c.mu.Unlock()
		c.n.bypassed.Add(1)
		r, err := c.bypassed(ctx)(c.up.Open(ctx, url))
		return r, fromSource, err
	}
	f := &fill{c: c, url: url, key: k, info: info, node: node, readers: 1, fileRefs: 2, wake: make(chan struct{}),
		redirect: source.RedirectCheck(ctx), checkedAt: chk.at, tally: tallyOf(ctx), behind: ctx.Value(behindKey{}) != nil}
	if _, busy := c.fills[k]; !busy {
		c.fills[k] = f // an older fill of another version keeps running unregistered
		f.registered = true
	}
	c.wg.Add(1)
	c.mu.Unlock()
	go f.run()
	return &fillReader{ctx: ctx, t: tallyOf(ctx), f: f, own: true}, fromFetch, nil
}

// memLookup returns a memory entry of key k matching info, from node's tier or
// another node's. Called with c.mu held.
func (c *Cache) memLookup(k string, node int, info source.Info) *memEntry {
	if c.mem == nil {
		return nil
	}
	if e, ok := c.mem[node].lru.Get(k); ok && e.matches(info) {
		return e
	}
	for i, m := range c.mem {
		if i == node {
			continue
		}
		if e, ok := m.lru.Peek(k); ok && e.matches(info) {
			return e
		}
	}
	return nil
}

// sourceAt opens url from off straight from the source, at the version info
// describes: the bytes before off, already served, were of that version. It fails
// with ErrChanged when the source holds another version.
func (c *Cache) sourceAt(ctx context.Context, url string, info source.Info, off, end int64) (io.ReadCloser, error) {
	length := int64(-1)
	if end >= 0 {
		length = max(end-off, 0)
	}
	if off == 0 && length < 0 {
		return c.openUp(ctx, url, info)
	}
	up, err := c.upstream(url)
	if err != nil {
		return nil, err
	}
	if vr, ok := up.(source.VersionReader); ok && info.Version != "" {
		r, err := vr.OpenVersion(ctx, url, info.Version, off, length)
		return r, changedAt(url, err)
	}
	sctx, cancel := context.WithTimeout(ctx, c.opts.StatTimeout)
	now, err := c.up.Stat(sctx, url)
	cancel()
	if err != nil {
		return nil, err
	}
	if now.Version != info.Version || now.Size != info.Size {
		return nil, &source.Error{Op: "read", URL: url, Err: fmt.Errorf("%w: version %s of %d bytes was being read, the source now holds %s of %d bytes",
			ErrChanged, info.Version, info.Size, now.Version, now.Size)}
	}
	if rr, ok := up.(source.RangeReader); ok {
		return rr.OpenRange(ctx, url, off, length)
	}
	r, err := c.up.Open(ctx, url)
	if err != nil {
		return nil, err
	}
	if _, err := io.CopyN(io.Discard, r, off); err != nil {
		r.Close()
		return nil, &source.Error{Op: "read", URL: url, Err: err}
	}
	return r, nil // read no further than end: section limits it
}

// bypassed returns a function that returns r, a stream read straight from the
// source for an open made with ctx, counting what it reads in Stats.BytesBypassed
// and the open's Tally.
func (c *Cache) bypassed(ctx context.Context) func(r io.ReadCloser, err error) (io.ReadCloser, error) {
	return func(r io.ReadCloser, err error) (io.ReadCloser, error) {
		if err != nil || r == nil {
			return r, err
		}
		return &bypassReader{ReadCloser: r, c: c, t: tallyOf(ctx)}, nil
	}
}

// bypassReader counts the bytes read from a stream that bypassed the cache.
type bypassReader struct {
	io.ReadCloser
	c *Cache
	t *Tally
}

func (r *bypassReader) Read(p []byte) (int, error) {
	k, err := r.ReadCloser.Read(p)
	r.c.served(r.t, wBypass, int64(k))
	return k, err
}
