package cache

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/shardload/shardload/source"
)

// fill states.
const (
	pending   = iota // space not reserved yet
	streaming        // bytes are going to fh or buf
	bypass           // no room, or the disk tier could not be written: each reader reads the source itself
)

// fillChunk is how many bytes a fetch reads from the source at a time; readers are
// woken after each.
const fillChunk = 1 << 20

// fill is one fetch of an object into the cache, readable while it runs.
type fill struct {
	c          *Cache
	url        string                      // what the source is asked for
	key        string                      // what the cache files it under (see key)
	redirect   func(from, to string) error // the redirect check of the open that started it
	info       source.Info
	checkedAt  int64 // when the Stat that found info was sent (wall-clock nanoseconds; 0: unknown): see validate.go
	node       int
	registered bool   // in c.fills
	tally      *Tally // of the open the fetch is for: the bytes fetched count in its Store
	behind     bool   // a fetch behind a range read (fillBehind): see fill.ranker

	// Guarded by c.mu.
	readers  int        // open fillReaders
	fileRefs int        // fillReaders + the fetch itself: fh closes at 0
	diskEnt  *diskEntry // committed entry; readers release it on close
	memEnt   *memEntry

	mu       sync.Mutex
	state    int
	writeErr error    // the disk tier could not be written: nothing is committed
	fh       *os.File // disk tier: the temporary file
	buf      []byte   // memory tier only: the entry's buffer
	n        int64    // bytes written and readable
	done     bool
	err      error
	adopted  bool          // fh is an entry another process committed: its bytes are the disk tier's
	wake     chan struct{} // closed and replaced whenever the fields above change
}

// set changes the fill's state under f.mu and wakes its readers.
func (f *fill) set(fn func()) {
	f.mu.Lock()
	fn()
	close(f.wake)
	f.wake = make(chan struct{})
	f.mu.Unlock()
}

// run fetches the object, commits it, and ends the fill.
func (f *fill) run() {
	c := f.c
	defer c.wg.Done()
	err := f.fetch()
	if err != nil {
		c.n.failed.Add(1)
		c.mu.Lock()
		f.unregister()
		c.mu.Unlock()
	}
	c.mu.Lock()
	f.fileRefs--
	last := f.fileRefs == 0
	c.mu.Unlock()
	if last && f.fh != nil {
		f.fh.Close()
	}
	f.set(func() { f.done, f.err = true, err })
}

// unregister takes f out of the in-flight map. Called with c.mu held.
func (f *fill) unregister() {
	if f.registered && f.c.fills[f.key] == f {
		delete(f.c.fills, f.key)
	}
	f.registered = false
}

// fetch reserves space, streams the object into it, and commits the entry. Without
// room, or when a file of the entry cannot be written (disk full, a read-only
// directory, any write error), it removes what it wrote, switches the fill to bypass
// and returns nil: its readers go on from the source, each from the byte it got to.
func (f *fill) fetch() error {
	c := f.c
	size := f.info.Size
	var (
		name, metaTmp string
		mb            []byte
		reserved      int64
	)
	fetched := c.fetchTime()
	var tmp string
	if c.disk != nil {
		lk, adopted, err := f.lockObject()
		var we *writeError
		if errors.As(err, &we) {
			c.cannotWrite(f.key, we.err)
			return f.bypassUnwritable(we.err)
		}
		if err != nil || adopted {
			return err
		}
		defer lk.release()
		name = newName(f.key)
		mb = placeholderMeta(f.key, f.info.Version, size, fetched)
		if len(mb) > maxMetaBytes {
			return f.bypass()
		}
		reserved = size + int64(len(mb))
		tmp = c.disk.tmpData(name, reserved)
		var fh *os.File
		res, err := c.disk.reserve(reserved, &c.n, f.ranker(), func() (err error) {
			fh, err = c.disk.create(tmp)
			return err
		})
		if err != nil {
			c.cannotWrite(f.key, err)
			return f.bypassUnwritable(err)
		}
		if res != roomMade {
			if res == notWanted {
				c.n.declined.Add(1)
			}
			return f.bypass()
		}
		// Held while this process reads the file: no other one deletes it once it is
		// committed.
		lockRead(fh)
		f.set(func() { f.state, f.fh = streaming, fh })
	} else {
		m := c.mem[f.node]
		rk := f.ranker()
		c.mu.Lock()
		res := m.reserve(size, &c.n, rk)
		c.mu.Unlock()
		if res != roomMade {
			if res == notWanted {
				c.n.declined.Add(1)
			}
			return f.bypass()
		}
		buf := c.alloc(size, f.node)
		f.set(func() { f.state, f.buf = streaming, buf })
	}
	c.n.fetches.Add(1)

	cleanup := func() {
		if f.fh != nil {
			c.disk.change(func() {
				c.disk.removePath(tmp)
				if metaTmp != "" {
					c.disk.removePath(metaTmp)
				}
				f.unreserve(reserved)
			})
		} else {
			c.mu.Lock()
			c.mem[f.node].used -= size
			c.mu.Unlock()
		}
	}
	fail := func(err error) error {
		cleanup()
		return err
	}
	// unwritable ends a fill whose files cannot be written: nothing of it is
	// committed, and its readers go on from the source.
	unwritable := func(err error) error {
		cleanup()
		c.cannotWrite(f.key, err)
		return f.bypassUnwritable(err)
	}
	// uncommitted ends a fill whose data file was made durable and checked but
	// whose entry cannot be committed: nothing is cached, and its readers read the
	// rest of the checked file (unlinked, still open).
	uncommitted := func(err error) error {
		cleanup()
		c.cannotWrite(f.key, err)
		c.mu.Lock()
		f.unregister()
		c.mu.Unlock()
		f.set(func() { f.writeErr = err })
		return nil
	}
	h := newBlockHasher(size)
	n, err := f.copyFrom(h)
	var we *writeError
	if errors.As(err, &we) {
		return unwritable(we.err)
	}
	if err != nil {
		return fail(err)
	}
	if n != size {
		return fail(&source.Error{Op: "read", URL: f.url, Err: fmt.Errorf("%w: read %d bytes, the source said %d", ErrChanged, n, size)})
	}
	sums := h.finish()
	if f.fh == nil {
		c.mu.Lock()
		f.memEnt = c.mem[f.node].insert(f.key, f.info.Version, f.buf)
		f.memEnt.refs = f.readers
		if c.sharing() {
			f.memEnt.checkedAt = f.checkedAt
		}
		f.unregister()
		c.mu.Unlock()
		return nil
	}

	// Disk: make the data durable, check it, then the meta, then rename both.
	d := c.disk
	m := meta{Format: metaFormat, URL: f.key, Version: f.info.Version, Size: size, Block: h.block, XXH3: formatSums(sums), Fetched: fetched, sums: sums}
	mb, _ = json.Marshal(m)
	mb = append(mb, '\n')
	if err := d.sync(f.fh, tmp); err != nil {
		return unwritable(err)
	}
	c.n.checked.Add(m.blocks())
	if err := checkFile(f.fh, m, tmp); err != nil {
		return fail(err)
	}
	metaTmp = d.tmpMeta(name)
	if err := d.writeFileSync(metaTmp, mb); err != nil {
		return uncommitted(err)
	}
	if f.checkedAt != 0 && c.sharing() {
		// The entry appears with the Stat that found its version.
		d.writeCheck(metaTmp, f.info.Version, size, f.checkedAt)
	}
	var victims []*diskEntry
	var cerr error
	d.change(func() {
		if err := d.rename(tmp, d.dataPath(name)); err != nil {
			cerr = err
			return
		}
		if err := d.rename(metaTmp, d.metaPath(name)); err != nil {
			d.removePath(d.dataPath(name))
			cerr = err
			return
		}
		if err := d.syncDir(); err != nil {
			c.logOnce("sync dir: "+writeCause(err), "cache: syncing %s: %v (logged once)", d.root, err)
		}
		e := newDiskEntry(name, m, size+int64(len(mb)))
		if c.sharing() {
			e.checkedAt.Store(f.checkedAt)
		}
		c.mu.Lock()
		if old, ok := d.lru.Peek(e.hash()); ok {
			victims = d.remove(old)
		}
		d.used += e.bytes - reserved
		e.refs = f.readers
		d.lru.Add(e.hash(), e)
		d.stems[name] = e
		f.diskEnt = e
		f.unregister()
		c.mu.Unlock()
	})
	if cerr != nil {
		return uncommitted(cerr)
	}
	c.reap(victims)
	return nil
}

// lockObject takes the object's fill lock, so that one process at a time fetches it
// into the directory. While another process holds it, it waits (polling: a lock
// another process holds cannot be waited on with a deadline), then serves what that
// process committed; a process that dies lets its lock go. adopted says the fill's
// readers were given a committed entry of the object instead: there is nothing to
// fetch. It returns a *writeError when the lock file cannot be created, and
// ErrClosed when the cache closes.
func (f *fill) lockObject() (lk *objectLock, adopted bool, err error) {
	d := f.c.disk
	hash := hashURL(f.key)
	wait := 2 * time.Millisecond
	for {
		if f.adoptCommitted() {
			return nil, true, nil
		}
		lk, ok, err := d.tryObjectLock(hash)
		if err != nil {
			return nil, false, &writeError{err}
		}
		if ok {
			if f.adoptCommitted() { // committed between the look and the lock
				lk.release()
				return nil, true, nil
			}
			return lk, false, nil
		}
		t := time.NewTimer(wait)
		select {
		case <-f.c.ctx.Done():
			t.Stop()
			return nil, false, &source.Error{Op: "open", URL: f.url, Err: ErrClosed}
		case <-t.C:
		}
		wait = min(2*wait, 100*time.Millisecond)
	}
}

// adoptCommitted serves the fill's readers a committed entry of the object at the
// fill's version, if the directory has one (another process fetched it).
func (f *fill) adoptCommitted() bool {
	c, d := f.c, f.c.disk
	d.refresh()
	c.loadDisk(f.key)
	c.mu.Lock()
	e, ok := d.peek(f.key)
	if !ok || e.gone || !e.matches(f.info) {
		c.mu.Unlock()
		return false
	}
	e.refs++
	c.mu.Unlock()
	fh, err := os.Open(d.dataPath(e.name))
	if err != nil || !lockRead(fh) {
		if fh != nil {
			fh.Close()
		}
		c.release(e)
		c.vanished(e)
		return false
	}
	c.mu.Lock()
	e.refs += f.readers - 1
	f.diskEnt = e
	f.unregister()
	c.mu.Unlock()
	c.n.diskHits.Add(1)
	f.set(func() { f.state, f.fh, f.n, f.adopted = streaming, fh, e.meta.Size, true })
	return true
}

// copyFrom streams the object from the source into the fill, hashing it, and
// publishes each chunk to the readers.
func (f *fill) copyFrom(h io.Writer) (int64, error) {
	c := f.c
	ctx := c.ctx
	if f.redirect != nil {
		ctx = source.WithRedirectCheck(ctx, f.redirect)
	}
	body, err := c.openUp(ctx, f.url, f.info)
	if err != nil {
		return 0, err
	}
	defer body.Close()
	size := f.info.Size
	var chunk []byte
	if f.fh != nil {
		chunk = make([]byte, fillChunk)
	}
	var n int64
	for {
		var p []byte
		if f.fh != nil {
			p = chunk
		} else {
			if n == size {
				// Read one more byte to see the end (or that the object grew).
				p = make([]byte, 1)
			} else {
				p = f.buf[n:min(n+fillChunk, size)]
			}
		}
		k, rerr := body.Read(p)
		if k > 0 {
			if n+int64(k) > size {
				return n, &source.Error{Op: "read", URL: f.url, Err: fmt.Errorf("%w: more than the %d bytes the source said", ErrChanged, size)}
			}
			if f.fh != nil {
				if err := c.disk.writeAt(f.fh, p[:k], n); err != nil {
					return n, &writeError{err}
				}
			}
			h.Write(p[:k])
			c.n.bytesFetched.Add(int64(k))
			n += int64(k)
			if f.tally != nil {
				f.tally.store.Add(int64(k))
			}
			f.set(func() { f.n = n })
		}
		if rerr == io.EOF {
			return n, nil
		}
		if rerr != nil {
			return n, rerr
		}
	}
}

// isFor reports whether the fetch counts in t, not nil.
func (f *fill) isFor(t *Tally) bool { return t != nil && f.tally == t }

// writeError is a failure to write a file of the disk tier.
type writeError struct{ err error }

func (e *writeError) Error() string { return e.err.Error() }
func (e *writeError) Unwrap() error { return e.err }

// bypass makes every reader of f read the source itself.
func (f *fill) bypass() error {
	c := f.c
	c.mu.Lock()
	f.unregister()
	c.mu.Unlock()
	f.set(func() { f.state = bypass })
	return nil
}

// bypassUnwritable makes every reader of f go on from the source, from the byte it
// got to, because the disk tier could not be written (err).
func (f *fill) bypassUnwritable(err error) error {
	c := f.c
	c.mu.Lock()
	f.unregister()
	c.mu.Unlock()
	f.set(func() { f.state, f.writeErr = bypass, err })
	return nil
}

// wait returns when the fill has ended or turned to bypass, or ctx is done.
func (f *fill) wait(ctx context.Context) {
	for {
		f.mu.Lock()
		end, wake := f.done || f.state == bypass, f.wake
		f.mu.Unlock()
		if end {
			return
		}
		select {
		case <-wake:
		case <-ctx.Done():
			return
		}
	}
}

// unwritable returns why the fill could not write the disk tier; nil if it could.
func (f *fill) unwritable() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.writeErr
}

func (f *fill) unreserve(n int64) {
	f.c.mu.Lock()
	f.c.disk.used -= n
	f.c.mu.Unlock()
}

// placeholderMeta returns a meta file of the size the real one will have, for the
// budget, before the checksums are known.
func placeholderMeta(url, version string, size int64, fetched time.Time) []byte {
	b := blockSize(size)
	m := meta{Format: metaFormat, URL: url, Version: version, Size: size, Block: b, XXH3: strings.Repeat("0", int(16*((size+b-1)/b))), Fetched: fetched}
	mb, _ := json.Marshal(m)
	return append(mb, '\n')
}

// writeFileSync writes a new file with mode 0600 and fsyncs it.
func (d *diskTier) writeFileSync(path string, b []byte) error {
	if err := d.inject("create", path); err != nil {
		return err
	}
	fh, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	if err = d.inject("write", path); err == nil {
		_, err = fh.Write(b)
	}
	if err == nil {
		err = d.sync(fh, path)
	}
	if cerr := fh.Close(); err == nil {
		err = cerr
	}
	return err
}

// fillReader reads a fill as it grows, or the source itself when the fill had no
// room.
type fillReader struct {
	ctx    context.Context
	t      *Tally // the open's, nil if none
	f      *fill
	own    bool // the fetch is the reader's: its open started it, or one of the same Tally did
	off    int64
	end    int64         // with off set by section: where its range ends (-1: the object's end; 0: not set)
	up     io.ReadCloser // bypass: the reader's own stream from the source
	closed bool
	warm   bool // Warm's reader: reading the source without caching is pointless
}

func (r *fillReader) Read(p []byte) (int, error) {
	if r.closed {
		return 0, errors.New("cache: read after close")
	}
	if r.up != nil {
		return r.readUp(p)
	}
	f := r.f
	for {
		f.mu.Lock()
		state, writeErr, n, done, err, wake, fh, buf, adopted := f.state, f.writeErr, f.n, f.done, f.err, f.wake, f.fh, f.buf, f.adopted
		f.mu.Unlock()
		switch {
		case state == bypass && writeErr != nil && r.warm:
			return 0, &source.Error{Op: "warm", URL: f.url, Err: fmt.Errorf("%w: %w", ErrUnwritable, writeErr)}
		case state == bypass && writeErr != nil && r.off >= f.info.Size:
			// Every byte arrived and was checked; only the commit failed.
			return 0, io.EOF
		case state == bypass:
			if writeErr == nil {
				f.c.n.bypassed.Add(1)
			}
			end := int64(-1)
			if r.end > 0 {
				end = r.end
			}
			up, err := f.c.sourceAt(r.ctx, f.url, f.info, r.off, end)
			if err != nil {
				return 0, err
			}
			r.up = up
			return r.readUp(p)
		case r.off < n:
			k := int(min(int64(len(p)), n-r.off))
			if fh != nil {
				k, err = fh.ReadAt(p[:k], r.off)
				if err != nil && err != io.EOF {
					return k, &source.Error{Op: "read", URL: f.url, Err: fmt.Errorf("cache: %w", err)}
				}
			} else {
				copy(p, buf[r.off:r.off+int64(k)])
			}
			r.off += int64(k)
			r.f.c.served(r.t, r.from(adopted), int64(k))
			return k, nil
		case done && err != nil:
			return 0, err
		case done:
			return 0, io.EOF
		}
		select {
		case <-wake:
		case <-r.ctx.Done():
			return 0, &source.Error{Op: "read", URL: f.url, Err: r.ctx.Err()}
		}
	}
}

// readUp reads the reader's own stream from the source.
func (r *fillReader) readUp(p []byte) (int, error) {
	n, err := r.up.Read(p)
	r.f.c.served(r.t, wBypass, int64(n))
	return n, err
}

// from says where the bytes the reader gets from its fill come from: the disk
// tier when another process had committed the object (adopted); else its own
// fetch (counted as fetched), or another reader's (joined).
func (r *fillReader) from(adopted bool) where {
	switch {
	case adopted:
		return wDisk
	case r.own:
		return wOwn
	}
	return wJoined
}

func (r *fillReader) Close() error {
	if r.closed {
		return nil
	}
	r.closed = true
	var err error
	if r.up != nil {
		err = r.up.Close()
	}
	f, c := r.f, r.f.c
	c.mu.Lock()
	f.readers--
	f.fileRefs--
	last := f.fileRefs == 0
	var victims []*diskEntry
	if e := f.diskEnt; e != nil {
		e.refs--
		if e.refs == 0 && e.gone {
			victims = append(victims, e)
		}
	}
	if e := f.memEnt; e != nil {
		e.unref()
	}
	c.mu.Unlock()
	c.reap(victims)
	if last {
		f.mu.Lock()
		fh := f.fh
		f.mu.Unlock()
		if fh != nil {
			fh.Close()
		}
	}
	return err
}
