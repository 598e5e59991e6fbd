package cache

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"github.com/hashicorp/golang-lru/v2/simplelru"

	"github.com/shardload/shardload/internal/redact"
	"io"
	"log"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sync/singleflight"

	"github.com/shardload/shardload/source"
)

// Errors of this package.
var (
	// ErrClosed means the Cache was used after Close.
	ErrClosed = errors.New("cache: closed")
	// ErrBusy means an older shardload, which takes a cache directory for itself
	// alone, holds the directory.
	ErrBusy = errors.New("cache: directory held by another process")
	// ErrCorrupt means a cached file does not match its recorded size or checksum.
	ErrCorrupt = errors.New("cache: corrupt entry")
	// ErrChanged means an object changed at the source while it was being fetched;
	// it wraps source.ErrChanged.
	ErrChanged = fmt.Errorf("cache: object changed at the source while it was fetched (%w)", source.ErrChanged)
	// ErrNoRoom means an object could not be cached: it is larger than the budget, or
	// the rest of the budget is held by entries being read.
	ErrNoRoom = errors.New("cache: no room in the budget")
	// ErrUnwritable means an object could not be cached because the disk tier
	// could not be written (disk full, a read-only directory, ...). Reads go on
	// from the source; Warm fails with it.
	ErrUnwritable = errors.New("cache: cannot write the cache directory")
)

// Default values of Options.
const (
	DefaultDiskBytes   = 32 << 30
	DefaultStatTimeout = 2 * time.Second
	DefaultOfflineFor  = 30 * time.Second
	// DefaultValidateWithin is how long a Stat that found a cached entry's version
	// serves the node's opens of that entry (Options.ValidateWithin).
	DefaultValidateWithin = 5 * time.Second
)

// Options configure a Cache. The zero value is a cache with no tiers, whose every
// Open goes to the source; set Dir, MemoryBytes or both.
type Options struct {
	// Dir is the directory of the disk tier; entries live in Dir/v1. Empty: no disk
	// tier.
	Dir string
	// DiskBytes is the disk tier's budget: data and metadata files together. Default
	// 32 GiB (DefaultDiskBytes).
	DiskBytes int64
	// MemoryBytes is the memory tier's budget, across all nodes. Default 0: no memory
	// tier.
	MemoryBytes int64
	// Nodes splits the memory tier into this many per-node tiers of MemoryBytes/Nodes
	// each (NUMA nodes). Default 1.
	Nodes int
	// BindMemory, if not nil, is called with each buffer allocated for the memory
	// tier of node, before it is filled, to place it on that node. An error is
	// logged and the buffer used unbound.
	BindMemory func(b []byte, node int) error
	// StatTimeout bounds the Stat that validates a cached entry on Open. Default 2 s.
	StatTimeout time.Duration
	// OfflineFor is how long, after a validation found the source unreachable, cached
	// entries are served without asking it again. Default 30 s; negative: ask every
	// time.
	OfflineFor time.Duration
	// ValidateWithin is how long a Stat that found a cached entry at its version
	// (the validation of an open, or the one before its fetch) serves the opens of
	// that entry that follow, in this process and in the node's other processes
	// sharing Dir, without a Stat of their own: a node's ranks opening one shard
	// send one HEAD per interval, not one each. An object rewritten at the source
	// within the interval of a node's last check of it is seen at most that much
	// later. Default 5 s (DefaultValidateWithin); negative: a Stat on every open.
	ValidateWithin time.Duration
	// Logf receives warnings (an unbound buffer, a file that could not be removed,
	// once per cause a cache that cannot be written).
	// Default log.Printf.
	Logf func(format string, args ...any)
}

func (o Options) withDefaults() Options {
	if o.DiskBytes == 0 {
		o.DiskBytes = DefaultDiskBytes
	}
	if o.Nodes <= 0 {
		o.Nodes = 1
	}
	if o.StatTimeout <= 0 {
		o.StatTimeout = DefaultStatTimeout
	}
	if o.OfflineFor == 0 {
		o.OfflineFor = DefaultOfflineFor
	}
	if o.ValidateWithin == 0 {
		o.ValidateWithin = DefaultValidateWithin
	}
	if o.Logf == nil {
		o.Logf = log.Printf
	}
	return o
}

// Stats counts what the cache did. All counts are since New.
type Stats struct {
	MemoryHits  int64 // opens served from the memory tier
	DiskHits    int64 // opens served from the disk tier
	Fetches     int64 // objects fetched from the source into the cache
	Joined      int64 // opens that joined a fetch already in flight
	Bypassed    int64 // opens read straight from the source: no room in the budget
	Stale       int64 // cached entries dropped because the source's version changed
	Corrupt     int64 // cached entries dropped because their checksum or size was wrong
	Unvalidated int64 // cached entries served while the source was unreachable
	Evicted     int64 // entries evicted from either tier to make room
	Failed      int64 // fetches that failed
	// WriteErrors counts fetches that could not write the disk tier (disk full, a
	// read-only or unwritable directory, any error writing the cache's own files):
	// their readers went on from the source, and nothing was cached.
	WriteErrors int64
	// BlocksChecked counts disk blocks whose XXH3 checksum was computed and
	// compared: a fetch's read-back, every read of a block from the disk tier, and
	// each block of an entry loaded into the memory tier.
	BlocksChecked int64
	// ValidationsShared counts opens (and Stats) of cached entries served without
	// asking the source: a Stat of this process or another one of the node found
	// the entry's version less than Options.ValidateWithin before.
	ValidationsShared int64

	DiskBytes     int64 // bytes the disk tier holds or has reserved
	DiskEntries   int   // entries in the disk tier
	MemoryBytes   int64 // bytes the memory tiers hold or have reserved
	MemoryEntries int   // entries in the memory tiers
}

type counters struct {
	memHits, diskHits, fetches, joined, bypassed, stale, corrupt, unvalidated, evicted, failed, writeErrs, checked, shared atomic.Int64
}

// Cache is a source.Source that keeps the objects it reads in a memory and a disk
// tier. It is safe for concurrent use. Open and Stat use the memory tier of node 0;
// Node returns a view for another node.
type Cache struct {
	opts Options
	up   source.Source

	ctx    context.Context // canceled by Close; fetches run under it
	cancel context.CancelFunc
	wg     sync.WaitGroup
	once   sync.Once

	mu     sync.Mutex
	closed bool
	disk   *diskTier  // nil: no disk tier
	mem    []*memTier // nil: no memory tier
	fills  map[string]*fill
	behind map[string]bool // objects being fetched in the background (fillBehind)
	// behindWG counts the background fetches' goroutines (tests wait on it).
	behindWG sync.WaitGroup

	loads        singleflight.Group // disk -> verify / memory, per entry
	offlineUntil atomic.Int64       // unix nanoseconds
	n            counters
	now          func() time.Time // the wall clock of validations (tests set their own)
	causes       sync.Map         // write failures logged: cause -> true
	// recent holds the Stats of objects the cache held no copy of, by key: an open
	// within ValidateWithin of one (the loader's Stat for its estimates, an open
	// joining a fill in flight) is served the version it found without asking the
	// source again, as a check of a cached copy is.
	recent *simplelru.LRU[string, recentStat]
}

// recentStat is a Stat of an object with no cached copy, and when it was sent.
type recentStat struct {
	info source.Info
	at   int64
}

// maxRecent bounds the Stats of uncached objects kept for their opens.
const maxRecent = 4096

var (
	_ source.Source      = (*Cache)(nil)
	_ source.RangeReader = (*Cache)(nil)
	_ source.Source      = (*View)(nil)
	_ source.RangeReader = (*View)(nil)
)

// New returns a cache in front of upstream. With a Dir it creates the directory
// (0700), takes its shared lock, and reads the index from the files there, deleting
// what it cannot verify and what dead processes left (see the package
// documentation). Any number of processes may use one directory at once.
func New(opts Options, upstream source.Source) (*Cache, error) {
	if upstream == nil {
		return nil, errors.New("cache: nil upstream source")
	}
	if opts.DiskBytes < 0 || opts.MemoryBytes < 0 {
		return nil, fmt.Errorf("cache: negative budget (disk %d, memory %d)", opts.DiskBytes, opts.MemoryBytes)
	}
	opts = opts.withDefaults()
	c := &Cache{opts: opts, up: upstream, fills: make(map[string]*fill), behind: make(map[string]bool), now: time.Now}
	c.recent, _ = simplelru.NewLRU[string, recentStat](maxRecent, nil)
	c.ctx, c.cancel = context.WithCancel(context.Background())
	if opts.MemoryBytes > 0 {
		per := opts.MemoryBytes / int64(opts.Nodes)
		for i := range opts.Nodes {
			c.mem = append(c.mem, newMemTier(i, per))
		}
	}
	if opts.Dir != "" {
		d, err := openDisk(opts.Dir, opts.DiskBytes, &c.mu, opts.Logf)
		if err != nil {
			c.cancel()
			return nil, err
		}
		c.disk = d
	}
	return c, nil
}

// Close cancels fetches in flight, waits for them, and releases the directory. Streams
// already open from the memory or disk tier stay readable. It is idempotent.
func (c *Cache) Close() error {
	c.once.Do(func() {
		c.mu.Lock()
		c.closed = true
		c.mu.Unlock()
		c.cancel()
		c.wg.Wait()
		c.behindWG.Wait()
		if c.disk != nil {
			c.disk.close()
		}
	})
	return nil
}

// Stats returns the counts so far and the tiers' sizes.
func (c *Cache) Stats() Stats {
	s := Stats{
		MemoryHits: c.n.memHits.Load(), DiskHits: c.n.diskHits.Load(), Fetches: c.n.fetches.Load(),
		Joined: c.n.joined.Load(), Bypassed: c.n.bypassed.Load(), Stale: c.n.stale.Load(),
		Corrupt: c.n.corrupt.Load(), Unvalidated: c.n.unvalidated.Load(), Evicted: c.n.evicted.Load(),
		Failed: c.n.failed.Load(), WriteErrors: c.n.writeErrs.Load(), BlocksChecked: c.n.checked.Load(),
		ValidationsShared: c.n.shared.Load(),
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.disk != nil {
		s.DiskBytes, s.DiskEntries = c.disk.used, c.disk.lru.Len()
	}
	for _, m := range c.mem {
		s.MemoryBytes += m.used
		s.MemoryEntries += m.lru.Len()
	}
	return s
}

// Node returns a view of the cache whose reads use the memory tier of NUMA node i
// (taken modulo Options.Nodes).
func (c *Cache) Node(i int) *View {
	if i < 0 {
		i = -i
	}
	return &View{c: c, node: i % c.opts.Nodes}
}

// View is the cache as seen from one NUMA node: see Cache.Node.
type View struct {
	c    *Cache
	node int
}

// Stat is Cache.Stat.
func (v *View) Stat(ctx context.Context, url string) (source.Info, error) {
	return v.c.Stat(ctx, url)
}

// Open is Cache.Open using this node's memory tier.
func (v *View) Open(ctx context.Context, url string) (io.ReadCloser, error) {
	r, _, err := v.c.open(ctx, url, v.node, 0)
	return r, err
}

// OpenRange is Cache.OpenRange using this node's memory tier.
func (v *View) OpenRange(ctx context.Context, url string, off, length int64) (io.ReadCloser, error) {
	return v.c.openRange(ctx, url, v.node, off, length)
}

// Stat returns the source's Info for url. When the cache holds a copy of the object
// that a check of the node found at the source less than Options.ValidateWithin ago,
// it returns that copy's Info (ModTime unknown) without asking, as an Open of the
// copy would serve it; a Stat that finds the copy's version serves the node's opens
// in turn, and one that finds another version drops the copy. When the source
// cannot be reached and the cache holds the object, it returns the cached object's
// Info.
func (c *Cache) Stat(ctx context.Context, url string) (source.Info, error) {
	var cached source.Info
	have := false
	if c.sharing() {
		if cached, have = c.cachedVersion(url); have && c.sharedCheck(key(url), cached) {
			c.n.shared.Add(1)
			cached.URL, cached.ModTime = url, time.Time{}
			return cached, nil
		}
	}
	if !have {
		if r, ok := c.recentStat(url, ""); ok {
			c.n.shared.Add(1)
			return r.info, nil
		}
	}
	at := c.now().UnixNano()
	info, err := c.up.Stat(ctx, url)
	if err == nil && !have {
		c.noteStat(url, info, at)
	}
	if err == nil && have {
		if info.Size != cached.Size || info.Version != cached.Version {
			c.n.stale.Add(1)
			c.drop(url)
		} else {
			c.recordCheck(key(url), info, at)
		}
	}
	if err != nil && unreachable(ctx, err) {
		if v, ok := c.cachedVersion(url); ok {
			c.n.unvalidated.Add(1)
			return v, nil
		}
	}
	return info, err
}

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
// per object.
func (c *Cache) OpenRange(ctx context.Context, url string, off, length int64) (io.ReadCloser, error) {
	return c.openRange(ctx, url, 0, off, length)
}

// OpenVersion is OpenRange provided the object is still at version (an earlier
// Info.Version): otherwise it fails with an error wrapping source.ErrChanged. The
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
		if _, ok := c.cachedVersion(url); !ok && (off > 0 || length >= 0) {
			if rr := c.rangeReader(url); rr != nil {
				c.n.bypassed.Add(1)
				c.fillBehind(url)
				return rr.OpenRange(ctx, url, off, length)
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
		if rr := c.rangeReader(url); rr != nil {
			c.n.bypassed.Add(1)
			c.fillBehind(url)
			return rr.OpenRange(ctx, url, off, length)
		}
	}
	r, _, err := c.open(ctx, url, node, 0)
	if err != nil {
		return nil, err
	}
	return section(url, r, off, length)
}

// section returns length bytes of r from off (the rest, when length < 0), seeking
// where r can; r is closed when that fails.
func section(url string, r io.ReadCloser, off, length int64) (io.ReadCloser, error) {
	if sk, ok := r.(io.Seeker); ok {
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

// fillBehind starts fetching url into the cache in the background, unless a fetch of
// it is in flight, the cache is closing, or maxBehind are running. The fetch is an
// open with no reader: the fill it starts runs to its end whether read or not.
func (c *Cache) fillBehind(url string) {
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
		r, _, err := c.open(c.ctx, url, 0, 0)
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

// cachedVersion returns the Info of a cached copy of url in any tier.
func (c *Cache) cachedVersion(url string) (source.Info, bool) {
	k := key(url)
	c.loadDisk(k)
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, m := range c.mem {
		if e, ok := m.lru.Peek(k); ok {
			return source.Info{URL: url, Size: int64(len(e.data)), Version: e.version}, true
		}
	}
	if c.disk != nil {
		if e, ok := c.disk.peek(k); ok {
			return source.Info{URL: url, Size: e.meta.Size, Version: e.meta.Version, ModTime: e.meta.Fetched}, true
		}
	}
	return source.Info{}, false
}

// unreachable reports whether a Stat error means the source could not be asked, as
// opposed to an answer (not found, access denied) or the caller giving up.
func unreachable(ctx context.Context, err error) bool {
	if ctx.Err() != nil {
		return false
	}
	return !errors.Is(err, source.ErrNotFound) && !errors.Is(err, source.ErrPermission)
}

// check says how an open's version was settled.
type check struct {
	ok     bool  // the source was asked (false: unreachable, the cached copy is served as is)
	at     int64 // when the Stat that found the version was sent (wall-clock nanoseconds; 0: none)
	shared bool  // a recent check served the open (see validate.go): a cached copy, or nothing
}

// errUnshared is openAt's answer to an open whose version a shared check settled
// when the copy checked is no longer cached: the open asks the source after all,
// rather than fetch an object at a version no Stat has just found.
var errUnshared = errors.New("cache: the entry checked is gone")

// validate asks the source for url's Info when a copy is cached, unless share and a
// check of the copy made less than Options.ValidateWithin ago (by this process or
// another one of the node) serves (see validate.go); want, when not empty, is the
// version the caller wants: a copy of another one is not served from a shared
// check. chk.ok is false when the source could not be reached and the cached copy
// (info) is to be served as is.
func (c *Cache) validate(ctx context.Context, url, want string, share bool) (info source.Info, chk check, err error) {
	cached, have := c.cachedVersion(url)
	if !have {
		if r, ok := c.recentStat(url, want); share && ok {
			c.n.shared.Add(1)
			return r.info, check{ok: true, at: r.at}, nil
		}
		at := c.now().UnixNano()
		info, err = c.up.Stat(ctx, url)
		if err == nil {
			c.noteStat(url, info, at)
		}
		return info, check{ok: err == nil, at: at}, err
	}
	if share && (want == "" || want == cached.Version) && c.sharedCheck(key(url), cached) {
		c.n.shared.Add(1)
		return cached, check{ok: true, shared: true}, nil
	}
	if c.opts.OfflineFor > 0 && time.Now().UnixNano() < c.offlineUntil.Load() {
		c.n.unvalidated.Add(1)
		return cached, check{}, nil
	}
	at := c.now().UnixNano()
	sctx, cancel := context.WithTimeout(ctx, c.opts.StatTimeout)
	info, err = c.up.Stat(sctx, url)
	cancel()
	switch {
	case err == nil:
		if info.Size != cached.Size || info.Version != cached.Version {
			c.n.stale.Add(1)
			c.drop(url)
		} else {
			c.recordCheck(key(url), info, at)
		}
		return info, check{ok: true, at: at}, nil
	case unreachable(ctx, err):
		if c.opts.OfflineFor > 0 {
			c.offlineUntil.Store(time.Now().Add(c.opts.OfflineFor).UnixNano())
		}
		c.opts.Logf("cache: serving cached %s without validation: %v", key(url), err)
		c.n.unvalidated.Add(1)
		return cached, check{}, nil
	case errors.Is(err, source.ErrNotFound):
		c.drop(url)
	}
	return info, check{}, err
}

// noteStat keeps info, what a Stat sent at at found of url while no copy was
// cached, for the opens of the next ValidateWithin.
func (c *Cache) noteStat(url string, info source.Info, at int64) {
	if !c.sharing() {
		return
	}
	c.mu.Lock()
	c.recent.Add(key(url), recentStat{info: info, at: at})
	c.mu.Unlock()
}

// recentStat returns what a Stat of url found less than ValidateWithin ago while
// no copy was cached, if one did (and found version want, when want is not empty).
func (c *Cache) recentStat(url, want string) (recentStat, bool) {
	if !c.sharing() {
		return recentStat{}, false
	}
	now := c.now().UnixNano()
	c.mu.Lock()
	r, ok := c.recent.Get(key(url))
	c.mu.Unlock()
	if !ok || !c.fresh(r.at, now) || want != "" && r.info.Version != want {
		return recentStat{}, false
	}
	r.info.URL = url
	return r, true
}

// drop removes every cached copy of url (files of entries being read go when their
// last reader closes).
func (c *Cache) drop(url string) {
	k := key(url)
	c.mu.Lock()
	c.recent.Remove(k)
	var victims []*diskEntry
	for _, m := range c.mem {
		m.remove(k)
	}
	if c.disk != nil {
		if e, ok := c.disk.lru.Peek(hashURL(k)); ok {
			victims = c.disk.remove(e)
		}
	}
	c.mu.Unlock()
	c.reap(victims)
}

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
		return &memReader{Reader: bytes.NewReader(me.data), c: c, e: me}, fromMemory, nil
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
		r, err := c.up.Open(ctx, url)
		return r, fromSource, err
	}
	if f := c.fills[k]; f != nil && f.info.Version == info.Version && f.info.Size == info.Size {
		f.readers++
		f.fileRefs++
		c.mu.Unlock()
		c.n.joined.Add(1)
		return &fillReader{ctx: ctx, f: f}, fromJoin, nil
	}
	if chk.shared {
		c.mu.Unlock()
		return nil, 0, errUnshared
	}
	if (c.disk == nil && c.mem == nil) || info.Size < 0 {
		// No tier, or a size the source cannot tell: nothing to reserve.
		c.mu.Unlock()
		c.n.bypassed.Add(1)
		r, err := c.up.Open(ctx, url)
		return r, fromSource, err
	}
	f := &fill{c: c, url: url, key: k, info: info, node: node, readers: 1, fileRefs: 2, wake: make(chan struct{}),
		redirect: source.RedirectCheck(ctx), checkedAt: chk.at}
	if _, busy := c.fills[k]; !busy {
		c.fills[k] = f // an older fill of another version keeps running unregistered
		f.registered = true
	}
	c.wg.Add(1)
	c.mu.Unlock()
	go f.run()
	return &fillReader{ctx: ctx, f: f}, fromFetch, nil
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
				return &memReader{Reader: bytes.NewReader(me.data), c: c, e: me}, nil
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
	return &blockReader{c: c, e: de, fh: fh, path: path, at: -1, open: func(off int64) (io.ReadCloser, error) {
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
	c.mu.Lock()
	if e, ok := m.lru.Peek(de.meta.URL); ok && e.version == de.meta.Version && int64(len(e.data)) == size {
		c.mu.Unlock()
		return e, nil
	}
	ok := m.reserve(size, &c.n)
	c.mu.Unlock()
	if !ok {
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

// cannotWrite counts a fetch that could not write the disk tier and logs why, once
// per cause (the error number: disk full, read-only, permission denied, ...).
func (c *Cache) cannotWrite(url string, err error) {
	c.n.writeErrs.Add(1)
	c.logOnce(writeCause(err), "cache: cannot write the cache: %v; shards are read from their source without caching while this lasts (logged once per cause, counted in Stats.WriteErrors)",
		&source.Error{Op: "caching", URL: url, Err: err})
}

// logOnce logs a warning the first time its key is seen.
func (c *Cache) logOnce(key, format string, args ...any) {
	if _, seen := c.causes.LoadOrStore(key, true); !seen {
		c.opts.Logf(format, args...)
	}
}

// writeCause names what made a write fail, leaving out which file it was.
func writeCause(err error) string {
	var errno syscall.Errno
	if errors.As(err, &errno) {
		return errno.Error()
	}
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Op + ": " + pe.Err.Error()
	}
	return err.Error()
}

// sourceAt opens url from off straight from the source, at the version info
// describes: the bytes before off, already served, were of that version. It fails
// with ErrChanged when the source holds another version.
func (c *Cache) sourceAt(ctx context.Context, url string, info source.Info, off int64) (io.ReadCloser, error) {
	if off == 0 {
		return c.openUp(ctx, url, info)
	}
	up, err := c.upstream(url)
	if err != nil {
		return nil, err
	}
	if vr, ok := up.(source.VersionReader); ok && info.Version != "" {
		r, err := vr.OpenVersion(ctx, url, info.Version, off, -1)
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
		return rr.OpenRange(ctx, url, off, -1)
	}
	r, err := c.up.Open(ctx, url)
	if err != nil {
		return nil, err
	}
	if _, err := io.CopyN(io.Discard, r, off); err != nil {
		r.Close()
		return nil, &source.Error{Op: "read", URL: url, Err: err}
	}
	return r, nil
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

// memReader streams a memory entry.
type memReader struct {
	*bytes.Reader
	c    *Cache
	e    *memEntry
	once sync.Once
}

func (r *memReader) Close() error {
	r.once.Do(func() {
		r.c.mu.Lock()
		r.e.unref()
		r.c.mu.Unlock()
	})
	return nil
}

// Wrap returns a Cache in front of reg and a registry that serves each of reg's
// schemes through it, except the schemes listed in uncached, which go to reg's own
// Source (for instance "file": local files gain nothing from a disk copy). Schemes
// registered in reg later are not in the returned registry.
func Wrap(opts Options, reg *source.Registry, uncached ...string) (*source.Registry, *Cache, error) {
	c, err := New(opts, reg)
	if err != nil {
		return nil, nil, err
	}
	skip := map[string]bool{}
	for _, s := range uncached {
		skip[strings.ToLower(s)] = true
	}
	out := &source.Registry{}
	for _, scheme := range reg.Schemes() {
		if skip[scheme] {
			src, _ := reg.Lookup(scheme + "://x")
			out.Register(scheme, src)
			continue
		}
		out.Register(scheme, c)
	}
	return out, c, nil
}

// List lists the objects under prefix through the upstream source, so that listing
// URLs (a trailing slash, a glob) expand the same with and without the cache.
// Listings are not cached. It fails with source.ErrNotLister when the upstream
// cannot list.
func (c *Cache) List(ctx context.Context, prefix string, fn func(source.Info) error) error {
	up, err := c.upstream(prefix)
	if err != nil {
		return err
	}
	l := source.ListerOf(up)
	if l == nil {
		return &source.Error{Op: "list", URL: prefix, Err: source.ErrNotLister}
	}
	return l.List(ctx, prefix, fn)
}

var _ source.Lister = (*Cache)(nil)

// key is what the cache files an object under: its URL with the secrets removed
// (user information, the signatures and tokens of a presigned URL), so that no
// secret is written to the cache's files and a presigned URL whose signature changed
// still finds its entry. The version check (see Options.ValidateWithin) tells
// objects apart.
func key(url string) string { return redact.URL(url) }

// Prepare starts the set-up of the upstream Source that serves url (see
// source.Preparer): a cache's first Open of a remote object asks the source for its
// version, whose client then need not be built at that moment.
func (c *Cache) Prepare(url string) { source.Prepare(c.up, url) }

var _ source.Preparer = (*Cache)(nil)
