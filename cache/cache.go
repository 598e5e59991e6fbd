package cache

// The Cache type: options, errors, stats, New and Close, node views, and Wrap.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/golang-lru/v2/simplelru"
	"golang.org/x/sync/singleflight"

	"github.com/shardload/shardload/redact"
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
	// Policy is how the tiers choose what to evict and whether to admit an object:
	// PolicyOrder (the zero value, the default) by the next use the node's readers
	// announce with Hint, least recently used first among the entries no reader
	// announced; PolicyLRU by recency alone. See "Eviction by next use" in the
	// package documentation.
	Policy Policy
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
	Bypassed    int64 // opens read straight from the source: no room in the budget, or not admitted (Declined)
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
	// Declined counts fetches the policy did not admit (PolicyOrder): the object's
	// next use was further away than that of every entry its room would have taken,
	// so its readers read it from the source and it was not cached. Each such reader
	// is counted in Bypassed too.
	Declined int64
	// MemoryDeclined counts loads of a disk entry into the memory tier that the
	// policy did not admit, for the same reason: the entry was served from disk.
	MemoryDeclined int64

	// BytesFromMemory counts bytes served to readers from the memory tier.
	BytesFromMemory int64
	// BytesFromDisk counts bytes served to readers from committed entries of the
	// disk tier: this process's, every block checked, and those another process
	// sharing the directory committed while this one waited to fetch the object.
	BytesFromDisk int64
	// BytesJoined counts bytes served to readers from a fetch in flight that
	// another reader had started: the store sent them once, for that reader
	// (counted in BytesFetched). Readers of one Tally (WithTally) are one reader.
	BytesJoined int64
	// BytesFetched counts bytes read from the source by the cache's fetches, once
	// per fetch however many readers it served (committed or not: a fetch that
	// failed or could not be written counts what it read). The readers of a fetch
	// in flight are served these bytes, not counted again.
	BytesFetched int64
	// BytesBypassed counts bytes readers read straight from the source, not
	// through a fetch of the cache: no room, not admitted, the disk tier not
	// writable, a range of an object not cached, no tier. BytesFetched +
	// BytesBypassed is what the cache read from the source. Stats.Served sums the
	// bytes served to readers by where they came from.
	BytesBypassed int64

	// HintsIgnored counts hint files of other processes that were not counted, once
	// per version of a file and why, each also logged through Options.Logf: a file
	// that does not parse (truncated, overwritten, of another format), of a reader
	// whose process is gone (the file is deleted), or with no heartbeat within the
	// reader's lifetime.
	HintsIgnored int64
	// HintReaders is the number of readers whose hints counted at the last choice of
	// the policy: this process's open Hints that published, and the live ones of the
	// other processes sharing Dir.
	HintReaders int

	DiskBytes     int64 // bytes the disk tier holds or has reserved
	DiskEntries   int   // entries in the disk tier
	MemoryBytes   int64 // bytes the memory tiers hold or have reserved
	MemoryEntries int   // entries in the memory tiers
}

type counters struct {
	memHits, diskHits, fetches, joined, bypassed, stale, corrupt, unvalidated, evicted, failed, writeErrs, checked, shared atomic.Int64
	// The policy, the hints, and bytes by where they came from.
	declined, memDeclined, hintsIgnored, hintReaders              atomic.Int64
	bytesMem, bytesDisk, bytesFetched, bytesBypassed, bytesJoined atomic.Int64
}

// Served returns the bytes the readers read, all of them together, by where they
// came from (see Bytes): what the readers' Tallies (WithTally) add up to, with
// the reads made without one. Its Store is StoreBytes.
func (s Stats) Served() Bytes {
	return Bytes{Memory: s.BytesFromMemory, Disk: s.BytesFromDisk, Joined: s.BytesJoined, Store: s.StoreBytes()}
}

// StoreBytes is what the cache read from the store: BytesFetched + BytesBypassed.
func (s Stats) StoreBytes() int64 { return s.BytesFetched + s.BytesBypassed }

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
	now          func() time.Time // the wall clock of validations and hints (tests set their own)
	// fetchTime is the fetch time recorded in a new entry's meta file (tests set
	// their own, for meta files of a known size).
	fetchTime func() time.Time
	causes    sync.Map // write failures logged: cause -> true
	// recent holds the Stats of objects the cache held no copy of, by key: an open
	// within ValidateWithin of one (the loader's Stat for its estimates, an open
	// joining a fill in flight) is served the version it found without asking the
	// source again, as a check of a cached copy is.
	recent *simplelru.LRU[string, recentStat]
	// hints are the node's readers' announcements the policy ranks entries by.
	hints *hintBook
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
	if opts.Policy != PolicyOrder && opts.Policy != PolicyLRU {
		return nil, fmt.Errorf("cache: unknown eviction policy %d", int(opts.Policy))
	}
	if opts.DiskBytes < 0 || opts.MemoryBytes < 0 {
		return nil, fmt.Errorf("cache: negative budget (disk %d, memory %d)", opts.DiskBytes, opts.MemoryBytes)
	}
	opts = opts.withDefaults()
	c := &Cache{opts: opts, up: upstream, fills: make(map[string]*fill), behind: make(map[string]bool), now: time.Now,
		fetchTime: func() time.Time { return time.Now().UTC() }}
	c.hints = newHintBook(c, opts.Dir)
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
		c.hints.close()
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
		ValidationsShared: c.n.shared.Load(), Declined: c.n.declined.Load(), MemoryDeclined: c.n.memDeclined.Load(),
		BytesFromMemory: c.n.bytesMem.Load(), BytesFromDisk: c.n.bytesDisk.Load(), BytesFetched: c.n.bytesFetched.Load(),
		BytesBypassed: c.n.bytesBypassed.Load(), BytesJoined: c.n.bytesJoined.Load(),
		HintsIgnored: c.n.hintsIgnored.Load(), HintReaders: int(c.n.hintReaders.Load()),
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
