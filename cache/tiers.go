package cache

// Serving memory and disk tier entries: opening, loading, references and reaping files.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"

	"github.com/shardload/shardload/source"
)

// openDisk serves a disk entry of url that the caller holds a reference on: into the memory tier
// of node when it fits and the entry was opened before, else straight from the file,
// each block verified before it is served (see blockReader).
func (c *Cache) openDisk(ctx context.Context, url string, de *diskEntry, node int) (io.ReadCloser, error) {
	// The memory tier admits an entry on its second open in this process: a scan
	// that reads each shard once (cat, an epoch larger than the tier) would only
	// churn it, paying a copy into fresh memory for every shard.
	if c.mem != nil && de.opens.Add(1) > 1 {
		key := "mem:" + de.name
		v, err, _ := c.loads.Do(key, func() (any, error) { return c.loadToMemory(de, node) })
		if err != nil {
			c.release(de)
			if errors.Is(err, errVanished) {
				c.vanished(de)
			}
			if errors.Is(err, ErrCorrupt) {
				c.n.corrupt.Add(1)
				c.drop(de.meta.URL)
			}
			return nil, err
		}
		if me, _ := v.(*memEntry); me != nil {
			c.mu.Lock()
			if !me.gone {
				me.refs++
				c.mu.Unlock()
				c.release(de)
				return &memReader{Reader: bytes.NewReader(me.data), c: c, t: tallyOf(ctx), e: me}, nil
			}
			c.mu.Unlock()
		}
	}
	path := c.disk.dataPath(de.name)
	fh, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) || (err == nil && !lockRead(fh)) {
		// Deleted by another process (evicted, replaced) since this one indexed it.
		if fh != nil {
			fh.Close()
		}
		c.release(de)
		c.vanished(de)
		return nil, errVanished
	}
	if err != nil {
		c.release(de)
		c.n.corrupt.Add(1)
		c.drop(de.meta.URL)
		return nil, &source.Error{Op: "open", URL: de.meta.URL, Err: fmt.Errorf("%w: %v", ErrCorrupt, err)}
	}
	c.disk.touch(de)
	return &blockReader{c: c, t: tallyOf(ctx), e: de, fh: fh, path: path, at: -1, open: func(off int64) (io.ReadCloser, error) {
		return c.reopen(ctx, url, de.meta, node, off)
	}}, nil
}

// reopen streams an object from off through the cache again (a new fetch, as a
// dropped entry is no longer there), provided the source still holds the version
// m describes: the bytes already served were of that version. url is the URL as the
// caller gave it (m.URL has its secrets removed).
func (c *Cache) reopen(ctx context.Context, url string, m meta, node int, off int64) (io.ReadCloser, error) {
	at := c.now().UnixNano()
	sctx, cancel := context.WithTimeout(ctx, c.opts.StatTimeout)
	info, err := c.up.Stat(sctx, url)
	cancel()
	if err != nil {
		return nil, err
	}
	if info.Version != m.Version || info.Size != m.Size {
		return nil, &source.Error{Op: "read", URL: m.URL, Err: fmt.Errorf("%w: version %s of %d bytes was cached, the source now holds %s of %d bytes",
			ErrChanged, m.Version, m.Size, info.Version, info.Size)}
	}
	r, _, err := c.openAt(ctx, url, node, 1, info, check{ok: true, at: at})
	if err != nil {
		return nil, err
	}
	if sk, ok := r.(io.Seeker); ok {
		_, err = sk.Seek(off, io.SeekStart)
	} else {
		_, err = io.CopyN(io.Discard, r, off)
	}
	if err != nil {
		r.Close()
		return nil, &source.Error{Op: "read", URL: m.URL, Err: err}
	}
	return r, nil
}

// loadToMemory reads a disk entry into a new buffer of node's memory tier, verifying
// its checksum. It returns a nil entry when the tier has no room.
func (c *Cache) loadToMemory(de *diskEntry, node int) (any, error) {
	m := c.mem[node]
	size := de.meta.Size
	rk := c.ranker(de.meta.URL)
	c.mu.Lock()
	if e, ok := m.lru.Peek(de.meta.URL); ok && e.version == de.meta.Version && int64(len(e.data)) == size {
		c.mu.Unlock()
		return e, nil
	}
	res := m.reserve(size, &c.n, rk)
	c.mu.Unlock()
	if res != roomMade {
		if res == notWanted {
			c.n.memDeclined.Add(1)
		}
		return nil, nil
	}
	buf := c.alloc(size, node)
	if err := c.disk.readVerified(de, buf, &c.n); err != nil {
		c.mu.Lock()
		m.used -= size
		c.mu.Unlock()
		return nil, err
	}
	c.mu.Lock()
	e := m.insert(de.meta.URL, de.meta.Version, buf)
	c.mu.Unlock()
	c.disk.touch(de)
	return e, nil
}

// alloc returns a buffer for node's memory tier, bound to the node when
// Options.BindMemory is set.
func (c *Cache) alloc(size int64, node int) []byte {
	buf := make([]byte, size)
	if c.opts.BindMemory != nil && size > 0 {
		if err := c.opts.BindMemory(buf, node); err != nil {
			c.opts.Logf("cache: binding %d bytes to node %d: %v (using them unbound)", size, node, err)
		}
	}
	return buf
}

// release drops a reference on a disk entry, deleting its files if it was removed
// from the index while it was read.
func (c *Cache) release(de *diskEntry) {
	c.mu.Lock()
	de.refs--
	var victims []*diskEntry
	if de.refs == 0 && de.gone {
		victims = []*diskEntry{de}
	}
	c.mu.Unlock()
	c.reap(victims)
}

// vanished takes out of the index an entry another process deleted.
func (c *Cache) vanished(de *diskEntry) {
	c.mu.Lock()
	if cur, ok := c.disk.lru.Peek(de.hash()); ok && cur == de {
		c.disk.lru.Remove(de.hash())
	}
	de.gone = true
	if de.refs == 0 {
		delete(c.disk.stems, de.name)
	}
	c.mu.Unlock()
}

// loadDisk reads the meta file of the disk entry of key k, if the index has one not
// loaded yet (found in the directory, committed by another process): outside the
// lock, as it reads a file. An entry whose meta cannot be read, or does not describe
// its data file, is dropped (its object is fetched again).
func (c *Cache) loadDisk(k string) {
	if c.disk == nil {
		return
	}
	c.mu.Lock()
	e, ok := c.disk.lru.Peek(hashURL(k))
	if !ok || e.loaded || e.gone {
		c.mu.Unlock()
		return
	}
	c.mu.Unlock()
	m, err := c.disk.readMeta(e.name)
	if err == nil && m.Size != e.dataSize {
		err = fmt.Errorf("%w: meta: %d bytes, the data file %d", ErrCorrupt, m.Size, e.dataSize)
	}
	if errors.Is(err, os.ErrNotExist) {
		c.vanished(e) // deleted by another process since the scan
		return
	}
	c.mu.Lock()
	if e.loaded || e.gone {
		c.mu.Unlock()
		return
	}
	if err == nil {
		e.setMeta(m)
		c.mu.Unlock()
		return
	}
	victims := c.disk.remove(e)
	c.mu.Unlock()
	c.n.corrupt.Add(1)
	c.opts.Logf("cache: dropping entry %s: %v", e.name, err)
	c.reap(victims)
}

// reap deletes the files of removed entries and gives their bytes back to the budget;
// files another process reads stay, and the next look at the directory finds them.
func (c *Cache) reap(victims []*diskEntry) {
	if len(victims) == 0 {
		return
	}
	c.disk.change(func() {
		for _, e := range victims {
			deleted := c.disk.tryDelete(e.name)
			c.mu.Lock()
			delete(c.disk.stems, e.name)
			if deleted {
				c.disk.used -= e.bytes
			}
			c.mu.Unlock()
		}
	})
}

// memReader streams a memory entry. The bytes it serves are counted in
// Stats.BytesFromMemory and its open's Tally (by Read, ReadAt, ReadByte and
// WriteTo).
type memReader struct {
	*bytes.Reader
	c       *Cache
	t       *Tally // the open's, nil if none
	e       *memEntry
	once    sync.Once
	pending int64 // bytes ReadByte served, not counted yet
}

func (r *memReader) Read(p []byte) (int, error) {
	n, err := r.Reader.Read(p)
	r.c.served(r.t, wMemory, int64(n)+r.pending)
	r.pending = 0
	return n, err
}

func (r *memReader) ReadAt(p []byte, off int64) (int, error) {
	n, err := r.Reader.ReadAt(p, off)
	r.c.served(r.t, wMemory, int64(n))
	return n, err
}

func (r *memReader) ReadByte() (byte, error) {
	b, err := r.Reader.ReadByte()
	if err == nil {
		r.pending++
	}
	return b, err
}

func (r *memReader) UnreadByte() error {
	err := r.Reader.UnreadByte()
	if err == nil {
		r.pending--
	}
	return err
}

func (r *memReader) WriteTo(w io.Writer) (int64, error) {
	n, err := r.Reader.WriteTo(w)
	r.c.served(r.t, wMemory, n+r.pending)
	r.pending = 0
	return n, err
}

func (r *memReader) Close() error {
	r.once.Do(func() {
		r.c.served(r.t, wMemory, r.pending)
		r.pending = 0
		r.c.mu.Lock()
		r.e.unref()
		r.c.mu.Unlock()
	})
	return nil
}
