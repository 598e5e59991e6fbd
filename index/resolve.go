package index

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strings"
	"sync"

	"github.com/shardload/shardload/redact"
	"github.com/shardload/shardload/shard"
	"github.com/shardload/shardload/source"
)

// Lookup finds the entries of a dataset's shards, reading as little as it can:
//
//  1. the objects' versions and sizes, by listing their directories (one request per
//     thousand objects on an object store) or, where a source cannot list, by a
//     Stat per object;
//  2. the entries of Index when it is set; otherwise those of the Store, and for
//     shards the Store lacks, those of the index object named FileName beside the
//     shards when they share one directory;
//  3. shards without an entry, or whose entry is for another version of the object
//     (the object was overwritten), are read once (Scan), Workers at a time, with
//     one log line that says how many and why, and their entries go to the Store.
type Lookup struct {
	Sources *source.Registry
	// Index is an index file or URL; "" looks in the Store and beside the shards.
	Index string
	// Store is the node's store; nil for none.
	Store *Store
	// NoBeside does not look for an index object beside the shards.
	NoBeside bool
	// Workers bounds the stats and scans running at once. Default 16.
	Workers int
	// Reader holds the limits of the shard readers of scans.
	Reader shard.Options
	// CheckUpTo is the most shards whose objects are checked against their entries'
	// versions before planning (a listing, or a Stat each); beyond it entries are
	// trusted, and a loader reads each shard pinned to its entry's version, so that an
	// object overwritten since fails its reader (source.ErrChanged) instead of being
	// counted again. Local files are checked up to LocalCheckFactor times as many (a
	// stat each is cheap, but 100,000 of them take most of a second). Default 1000:
	// one listing page on S3.
	CheckUpTo int
	// Progress, when set, is called after each shard scanned, with the number done
	// and the number to scan.
	Progress func(done, total int)
	Logf     func(format string, args ...any)
	// Once, when set, calls f unless a line of the kind what went to Logf's logger
	// already; nil calls f always.
	Once func(what string, f func())

	// Answered, when set, is called once the store has answered for the shards'
	// objects (their listing or Stats, or the index), before any shard is read to
	// count it: a caller's bound on the start (Config.StartTimeout) ends there.
	Answered func()

	// WantMembers makes Resolve read again the shards whose entries have no members
	// (shard.Info.Members: an index or a store entry written by an earlier release,
	// or by a read that did not record them), as it reads stale ones, so that every
	// entry it returns has them where a read can record them ("shardload index").
	WantMembers bool

	// LazyOffsets makes Quick read only the counts of an index whose offsets are
	// addressable (WriteAddressable), leaving the offsets for Plan to read: those of
	// the shards a rank's plan reads, where otherwise every process holds every
	// sample's offset. Resolve reads every offset all the same.
	LazyOffsets bool

	// lazy, set by Quick, leaves the offsets of an addressable index unread (Plan).
	lazy *deferred
}

// statBatch is the fewest shards in one directory for which Resolve lists the
// directory instead of stat'ing each.
const statBatch = 16

// Resolve returns the exact entries of urls (brace-expanded and listed already), in
// order.
func (lk Lookup) Resolve(ctx context.Context, urls []string) ([]shard.Info, error) {
	lk = lk.withDefaults()
	known, from, err := lk.known(ctx, urls)
	if err != nil {
		return nil, err
	}
	return lk.resolve(ctx, urls, known, from)
}

// Quick returns entries of urls for planning an epoch at once: exact ones when an
// index (Index, or the index object beside the shards) is there, reading only the
// shards it lacks or that changed; otherwise estimated ones (see Estimate), except
// that a job of one rank (world 1) also takes the exact entries of the Store. The
// choice between exact and estimated depends on nothing a node keeps for itself, so
// the ranks of a job on several nodes plan alike.
//
// With LazyOffsets, the entries of an index whose offsets are addressable
// (WriteAddressable) come without their sample offsets, which stay in the index:
// Plan reads those of the shards a plan reads.
func (lk Lookup) Quick(ctx context.Context, urls []string, world int) ([]shard.Info, error) {
	lk = lk.withDefaults()
	if lk.LazyOffsets {
		lk.lazy = &deferred{}
	}
	known, from, err := lk.global(ctx, urls)
	if err != nil {
		return nil, err
	}
	if known == nil { // lazy, and the index's shards are urls, in order
		infos, err := lk.lazy.resolve(urls, from, lk.Reader.MaxRatio)
		if err != nil {
			return nil, err
		}
		lk.answered() // the index was read
		remember(infos, lk.lazy)
		return infos, nil
	}
	if from != "" {
		infos, err := lk.resolve(ctx, urls, known, from)
		if d := lk.lazy; d != nil && err == nil && d.pos != nil {
			d.ord = nil
			remember(infos, d)
		}
		return infos, err
	}
	lk.lazy = nil
	known = nil
	if world == 1 && lk.Store != nil {
		if known = lk.stored(ctx, urls); len(known) == len(urls) {
			return lk.resolve(ctx, urls, known, "")
		}
	}
	return lk.Estimate(ctx, urls, known)
}

// LocalCheckFactor: local files' entries are checked against their files up to this
// many times Lookup.CheckUpTo (20,000 by default: about 0.1 s of stats), and trusted
// beyond it, as remote ones are beyond CheckUpTo.
const LocalCheckFactor = 20

func (lk Lookup) withDefaults() Lookup {
	if lk.Workers <= 0 {
		lk.Workers = 16
	}
	if lk.CheckUpTo <= 0 {
		lk.CheckUpTo = 1000
	}
	if lk.Logf == nil {
		lk.Logf = func(string, ...any) {}
	}
	return lk
}

// resolve returns the entries of urls from known, reading the shards it lacks or
// whose object changed. from names where known came from, for the log ("" the
// store or nothing). The entries read again or found under another URL go to the
// Store (as one segment per directory of shards every keepEvery reads, and at the
// end), so that the next lookup on this node finds them, and an interrupted one
// keeps most of what it read.
func (lk Lookup) resolve(ctx context.Context, urls []string, known map[string]shard.Info, from string) ([]shard.Info, error) {
	// The objects' versions and sizes: to know which entries are stale, and to check
	// every count against its object's size (a bare count, without a version or a
	// size, is checked up to CheckUpTo shards: a listing per thousand).
	var check []int
	local := true
	keys := keysOf(urls) // each URL made canonical once
	for i, u := range urls {
		e, ok := known[keys[i]]
		if !ok || e.Version != "" || e.Size <= 0 {
			check = append(check, i)
		}
		if ok && !isLocal(u) {
			local = false
		}
	}
	if len(check) > lk.CheckUpTo && (!local || len(check) > LocalCheckFactor*lk.CheckUpTo) {
		// Too many to check first: only the shards without an entry are stat'ed (to
		// be counted); the others are trusted, and read pinned to their versions.
		check = check[:0]
		for i := range urls {
			if _, ok := known[keys[i]]; !ok {
				check = append(check, i)
			}
		}
	}
	objs := make([]source.Info, len(urls))
	checked := make([]bool, len(urls))
	if len(check) > 0 {
		if err := lk.objects(ctx, urls, check, objs); err != nil {
			return nil, err
		}
		for _, i := range check {
			checked[i] = true
		}
	}
	infos := make([]shard.Info, len(urls))
	var todo []int
	missing, stale, moved, noMembers := 0, 0, 0, 0
	ids := lk.identities(urls, keys, known, objs, checked)
	var keep []shard.Info // entries found under another URL, for the store
	lazy := lk.lazy
	if lazy != nil && lazy.table != nil && from != "" {
		lazy.pos = make([]int32, len(urls))
	} else {
		lazy = nil
	}
	for i, u := range urls {
		e, ok := known[keys[i]]
		orig := e.URL // as the index has it
		if !ok && checked[i] {
			// No entry under this URL: one of the same object elsewhere (a dataset
			// moved with its index, or counted on this node under another path).
			if id := identity(u, objs[i].Version, objs[i].Size); id != "" {
				if e, ok = ids[id]; ok {
					orig = e.URL
					moved++
					e.URL = u
					// Kept under this URL for the next lookup on the node, with its
					// offsets: not an entry of an index read lazily, whose offsets are
					// still in the index's blocks (a store entry without offsets is a
					// shard that has none, and every later lookup would take it so).
					if _, deferred := lazy.ordinal(orig); !deferred || e.Offsets != nil {
						keep = append(keep, e)
					}
				}
			}
		}
		if lazy != nil {
			lazy.pos[i] = -1
		}
		switch {
		case !ok:
			missing++
			todo = append(todo, i)
		case e.Version != "" && checked[i] && (objs[i].Version != "" && e.Version != objs[i].Version || (e.Size > 0 && objs[i].Size >= 0 && e.Size != objs[i].Size)):
			// (A store that gives no version for an object, as AIStore's listings for a
			// multipart object, says nothing of a change: its size still does.)
			stale++
			todo = append(todo, i)
		case lk.WantMembers && e.Members == nil:
			noMembers++
			todo = append(todo, i)
		default:
			e.URL = u
			if e.Version == "" {
				// A count without a version: its offsets and members cannot be trusted.
				e.Offsets, e.Members = nil, nil
			}
			size := int64(-1)
			if checked[i] && objs[i].Size >= 0 {
				size = objs[i].Size
			}
			if err := e.Check(size, lk.Reader.MaxRatio); err != nil {
				if from == "" {
					// The node's own store: counted again, as a stale entry.
					stale++
					todo = append(todo, i)
					continue
				}
				return nil, fmt.Errorf("shardload: index %s: %w; rebuild it (shardload index)", from, err)
			}
			if o, ok := lazy.ordinal(orig); ok && e.Version != "" && e.Offsets == nil {
				lazy.pos[i] = o
			}
			infos[i] = e
		}
	}
	// Counts checked from below: a count too low for its object's size (0 for a
	// shard that is not empty, or fewer samples than the largest sample the index
	// knows of could fill it with) would leave samples out of every epoch unseen.
	largest := shard.LargestSamples(infos)
	for i := range infos {
		e := &infos[i]
		if e.URL == "" {
			continue // to be counted
		}
		size := int64(-1)
		if checked[i] && objs[i].Size >= 0 {
			size = objs[i].Size
		}
		if err := e.CheckBelow(size, largest.For(i, *e)); err != nil {
			if from == "" {
				stale++ // the node's own store: counted again
				todo = append(todo, i)
				*e = shard.Info{}
				continue
			}
			return nil, fmt.Errorf("shardload: index %s: %w; rebuild it (shardload index)", from, err)
		}
	}
	if moved > 0 {
		lk.Logf("shardload: %d shards have no index entry under their URLs, but one under another (the same objects: base name, version and size), which is used", moved)
		lk.keep(keep)
	}
	lk.answered()
	if len(todo) == 0 {
		return infos, nil
	}
	switch counted := len(todo) - noMembers; {
	case counted == 0:
	case from != "":
		lk.Logf("shardload: index %s: %d of %d shards have no entry and %d changed since it was written; reading those %d to count their samples",
			from, missing, len(urls), stale, counted)
	case counted == len(urls):
		lk.Logf("shardload: no index for these %d shards (give one with --index, or write one with \"shardload index\"): reading every shard once to count its samples", len(urls))
	default:
		lk.Logf("shardload: %d of %d shards have no index entry and %d changed since it was taken; reading those %d to count their samples", missing, len(urls), stale, counted)
	}
	if noMembers > 0 {
		lk.Logf("shardload: %d of %d shards have entries without member sizes (written by an earlier release, or by a read that did not record them): reading those %d to record them", noMembers, len(urls), noMembers)
	}
	var mu sync.Mutex
	done := 0
	var scanned []shard.Info // read since the last write to the store
	defer func() { lk.keep(scanned) }()
	err := lk.each(ctx, len(todo), func(ctx context.Context, k int) error {
		i := todo[k]
		info, err := Scan(ctx, lk.Sources, urls[i], objs[i].Version, objs[i].Size, lk.Reader)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("shardload: counting the samples of %s stopped after %d: %w (every rank plans from the counts, so a shard that cannot be counted fails the job under either error policy)", redact.URL(urls[i]), info.Samples, err)
		}
		infos[i] = info
		mu.Lock()
		defer mu.Unlock()
		done++
		if lk.Store != nil {
			if scanned = append(scanned, info); len(scanned) >= keepEvery {
				lk.keep(scanned)
				scanned = nil
			}
		}
		if lk.Progress != nil {
			lk.Progress(done, len(todo))
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return infos, nil
}

// keepEvery is the number of shards read between two writes of their entries to the
// Store: an interrupted lookup keeps all but the last few.
const keepEvery = 256

// keep writes entries to the Store, if there is one, saying once if it cannot.
func (lk Lookup) keep(entries []shard.Info) {
	if lk.Store == nil || len(entries) == 0 {
		return
	}
	if err := lk.Store.PutMany(entries); err != nil {
		lk.once("store", func() { lk.Logf("shardload: warning: %v (entries are not kept for the next run)", err) })
	}
}

// identities returns the entries, by object identity (see identity), of the checked
// objects of urls that have no entry in known under their URL: from the entries of
// known under other URLs, and from the Store, looked through once for all.
func (lk Lookup) identities(urls, keys []string, known map[string]shard.Info, objs []source.Info, checked []bool) map[string]shard.Info {
	want := map[string]bool{}
	for i, u := range urls {
		if _, ok := known[keys[i]]; !ok && checked[i] {
			if id := identity(u, objs[i].Version, objs[i].Size); id != "" {
				want[id] = true
			}
		}
	}
	ids := map[string]shard.Info{}
	if len(want) == 0 {
		return ids
	}
	for _, k := range known {
		if id := identity(k.URL, k.Version, k.Size); id != "" && want[id] {
			ids[id] = k
			delete(want, id)
		}
	}
	if lk.Store != nil && len(want) > 0 {
		for id, e := range lk.Store.Identities(want) {
			ids[id] = e
		}
	}
	return ids
}

// answered calls Answered, if set.
func (lk Lookup) answered() {
	if lk.Answered != nil {
		lk.Answered()
	}
}

// once is Once, or f.
func (lk Lookup) once(what string, f func()) {
	if lk.Once != nil {
		lk.Once(what, f)
		return
	}
	f()
}

// known returns the entries the index, the store or the index beside the shards
// have, by key, and the name of the index they came from ("" for the store).
func (lk Lookup) known(ctx context.Context, urls []string) (map[string]shard.Info, string, error) {
	if lk.Index != "" {
		return lk.global(ctx, urls)
	}
	known := lk.stored(ctx, urls)
	if lk.Store != nil && len(known) == len(urls) {
		return known, "", nil
	}
	g, from, err := lk.global(ctx, urls)
	if err != nil {
		return nil, "", err
	}
	for k, e := range g {
		if _, ok := known[k]; !ok {
			known[k] = e
		}
	}
	return known, from, nil
}

// global returns the entries of the index every node sees: Index, or else the index
// object beside the shards, by key, and its name; no entries and "" when there is
// none.
func (lk Lookup) global(ctx context.Context, urls []string) (map[string]shard.Info, string, error) {
	known := map[string]shard.Info{}
	if lk.Index != "" {
		infos, err := lk.readIndex(ctx, lk.Index, urls)
		if err != nil {
			return nil, "", err
		}
		if lk.inOrder(urls, infos) {
			return nil, redact.URL(lk.Index), nil
		}
		known = make(map[string]shard.Info, len(infos))
		addEntries(known, infos, lk.Index)
		lk.lazy.ordinals(infos)
		return known, redact.URL(lk.Index), nil
	}
	if lk.NoBeside || len(urls) == 0 {
		return known, "", nil
	}
	// As the user wrote the shards' directory, for messages, unless they are bare
	// names; none when they do not share one, or when a presigned URL's signature
	// would not cover an index beside it.
	name := Beside(urls)
	if name == "" {
		return known, "", nil
	}
	infos, err := lk.readIndex(ctx, name, urls)
	if errors.Is(err, source.ErrNotFound) {
		return known, "", nil
	}
	if ctx.Err() != nil {
		return nil, "", ctx.Err()
	}
	if errors.Is(err, ErrFormat) || errors.Is(err, ErrChecksum) {
		// An index that is there but broken or edited is an error, not a reason to
		// plan without it: its counts may be what someone meant to change.
		return nil, "", fmt.Errorf("shardload: the index beside the shards: %w", err)
	}
	if err != nil {
		lk.Logf("shardload: warning: the index beside the shards is not used: %v", err)
		return known, "", nil
	}
	if lk.inOrder(urls, infos) {
		return nil, redact.URL(name), nil
	}
	known = make(map[string]shard.Info, len(infos))
	addEntries(known, infos, name)
	lk.lazy.ordinals(infos)
	return known, redact.URL(name), nil
}

// Beside returns the URL of the index a loader looks for beside urls (brace-expanded
// shard URLs, or listing prefixes and globs: their directory counts), or "" when they
// do not share a directory where one can be looked for. Shards in sibling
// directories (hashed key prefixes: DIR/{hash:P}/NAME) have theirs in the directories'
// parent, DIR/.
func Beside(urls []string) string {
	if len(urls) == 0 {
		return ""
	}
	canon := besideDir(urls[0])
	last := dirOf(urls[0])
	parent := "" // the canonical directories' parent, once two differ
	for _, u := range urls {
		// The same directory as written is the same directory canonically: each
		// directory is made canonical once, not each shard.
		if d := dirOf(u); d != last {
			if c := besideDir(u); c != canon {
				if parent == "" {
					parent = parentDir(canon)
				}
				if parent == "" || parentDir(c) != parent {
					return ""
				}
			}
			last = d
		}
	}
	dir := dirOf(urls[0])
	if parent != "" {
		dir = parentDir(dir)
	}
	if dir == "" {
		dir = canon
		if parent != "" {
			dir = parent
		}
	}
	if dir == "" || strings.HasPrefix(dir, "http://") || strings.HasPrefix(dir, "https://") {
		return ""
	}
	return dir + FileName
}

// parentDir returns the parent of dir (a directory ending in "/"), or "" where there
// is none: above a bucket, or of a bare relative name.
func parentDir(dir string) string {
	d := strings.TrimSuffix(dir, "/")
	i := strings.LastIndex(d, "/")
	if i < 0 {
		return ""
	}
	if j := strings.Index(d, "://"); j >= 0 && !strings.Contains(d[j+3:i+1], "/") {
		return "" // s3://bucket/ has none
	}
	return d[:i+1]
}

// besideDir is the directory of url where an index beside it would be: url's own
// for remote URLs, the canonical one (file:///abs/dir/) for local paths, so that a
// bare relative name has one too.
func besideDir(url string) string {
	if source.Scheme(url) == "file" {
		return dirOf(source.Canonical(url))
	}
	return dirOf(url)
}

// addEntries adds the entries of the index named name to known, by key. The relative
// paths of an index written by an older release are taken both as they were given
// (from the directory it was run in, if it is this one) and from the index's own
// directory; the objects' versions tell which is right.
func addEntries(known map[string]shard.Info, infos []shard.Info, name string) {
	dir := ""
	if source.Scheme(name) == "file" {
		dir = strings.TrimPrefix(dirOf(source.Canonical(name)), "file://")
	}
	for _, e := range infos {
		known[key(e.URL)] = e
		if dir != "" && source.Scheme(e.URL) == "file" && !strings.Contains(e.URL, "://") && !filepath.IsAbs(e.URL) {
			if k := key(filepath.Join(dir, e.URL)); !hasKey(known, k) {
				known[k] = e
			}
		}
	}
}

func hasKey(m map[string]shard.Info, k string) bool { _, ok := m[k]; return ok }

// readIndex reads the index at url: whole, or for Quick (lazy) the counts of an
// addressable one; through the node's copy of it where there is one (indexSources).
func (lk Lookup) readIndex(ctx context.Context, url string, urls []string) (_ []shard.Info, err error) {
	if lk.Sources, err = lk.indexSources(ctx, url); err != nil {
		return nil, err
	}
	if lk.lazy != nil {
		return lk.readDeferred(ctx, url, lk.lazy, urls)
	}
	return lk.read(ctx, url)
}

func (lk Lookup) read(ctx context.Context, url string) ([]shard.Info, error) {
	body, err := lk.Sources.Open(ctx, url)
	if err != nil {
		return nil, fmt.Errorf("shardload: index: %w", err)
	}
	defer body.Close()
	infos, err := Read(body, url)
	if err != nil {
		return nil, fmt.Errorf("shardload: %w", err)
	}
	return infos, nil
}

// objects sets objs[i] to the size and version of the objects urls[i], i in which.
func (lk Lookup) objects(ctx context.Context, urls []string, which []int, objs []source.Info) error {
	found := make([]bool, len(urls))
	byDir := map[string][]int{}
	for _, i := range which {
		byDir[dirOf(urls[i])] = append(byDir[dirOf(urls[i])], i)
	}
	for dir, idx := range byDir {
		if len(idx) < statBatch || dir == "" {
			continue
		}
		src, err := lk.Sources.Lookup(urls[idx[0]])
		if err != nil {
			continue
		}
		l := source.ListerOf(src)
		if l == nil {
			continue
		}
		want := make(map[string]int, len(idx))
		names := make([]string, 0, len(idx))
		for _, i := range idx {
			want[urls[i]] = i
			names = append(names, urls[i][len(dir):])
		}
		// Listings of narrower prefixes, in parallel: a listing's pages come one
		// after the other, a thousand keys each. A local directory is read whole
		// by any listing of it, so it is listed once.
		limit := listPage
		if isLocal(urls[idx[0]]) {
			limit = len(names)
		}
		prefixes := listPrefixes(names, limit)
		var mu sync.Mutex
		err = lk.each(ctx, len(prefixes), func(ctx context.Context, k int) error {
			err := l.List(ctx, dir+prefixes[k], func(info source.Info) error {
				if i, ok := want[info.URL]; ok {
					mu.Lock()
					objs[i], found[i] = info, true
					mu.Unlock()
				}
				return nil
			})
			if ctx.Err() != nil {
				return ctx.Err()
			}
			_ = err // any other failure: the objects not found are stat'ed below
			return nil
		})
		if err != nil {
			return err
		}
	}
	var todo []int
	for _, i := range which {
		if !found[i] {
			todo = append(todo, i)
		}
	}
	return lk.each(ctx, len(todo), func(ctx context.Context, k int) error {
		i := todo[k]
		info, err := lk.Sources.Stat(ctx, urls[i])
		if err != nil {
			return fmt.Errorf("shardload: %w", err)
		}
		objs[i] = info
		return nil
	})
}

// each runs fn(0..n-1), Workers at a time, and returns the first error: the first
// call to fail ends the others (their context is cancelled) and starts no more, so
// that a store that refuses every request (a missing bucket, a wrong key) or does
// not answer fails a lookup of 10^5 shards as soon as its first request fails, not
// after every shard was tried. A panic in fn is an error.
func (lk Lookup) each(ctx context.Context, n int, fn func(ctx context.Context, k int) error) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var (
		mu    sync.Mutex
		first error
	)
	fail := func(err error) {
		mu.Lock()
		defer mu.Unlock()
		if first == nil {
			first = err
			cancel(err)
		}
	}
	sem := make(chan struct{}, lk.Workers)
	var wg sync.WaitGroup
	for k := range n {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break
		}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			defer func() {
				if r := recover(); r != nil {
					fail(fmt.Errorf("index: internal error (panic): %v\n%s", r, debug.Stack()))
				}
			}()
			if err := fn(ctx, k); err != nil {
				fail(err)
			}
		}()
	}
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	if first != nil {
		return first
	}
	return context.Cause(ctx) // the caller's context ended
}

// dirOf returns url up to its last "/" (the query of an http(s) URL aside), or "".
func dirOf(url string) string {
	u := pathOf(url)
	return u[:strings.LastIndex(u, "/")+1]
}

// pathOf returns url without the query and fragment of an http(s) URL (a presigned
// URL's signature), which are not part of its path.
func pathOf(url string) string {
	if strings.HasPrefix(url, "http://") || strings.HasPrefix(url, "https://") {
		if i := strings.IndexAny(url, "?#"); i >= 0 {
			return url[:i]
		}
	}
	return url
}

// isLocal reports whether url names a local file.
func isLocal(url string) bool { return source.Scheme(url) == "file" }

// stored returns the Store's entries of urls, by key.
func (lk Lookup) stored(_ context.Context, urls []string) map[string]shard.Info {
	if lk.Store == nil {
		return map[string]shard.Info{}
	}
	return lk.Store.GetMany(urls)
}

// listPage is the number of keys a listing returns per page on S3 and GCS.
const listPage = 1000

// listPrefixes returns prefixes that together cover names (the objects' names in one
// directory), each the start of at most about limit of them where names allow: the
// shortest common start of all names, lengthened until no prefix covers more than
// limit. Names of a brace pattern ("train-000000".."train-009999") give one prefix per
// thousand.
func listPrefixes(names []string, limit int) []string {
	if len(names) == 0 {
		return nil
	}
	sorted := slices.Clone(names)
	slices.Sort(sorted)
	lcp := sorted[0]
	for _, n := range sorted[1:] {
		for !strings.HasPrefix(n, lcp) {
			lcp = lcp[:len(lcp)-1]
		}
	}
	longest := 0
	for _, n := range sorted {
		longest = max(longest, len(n))
	}
	for l := len(lcp); ; l++ {
		var out []string
		count, most := 0, 0
		for i, n := range sorted {
			p := n[:min(l, len(n))]
			if i == 0 || p != out[len(out)-1] {
				out = append(out, p)
				count = 0
			}
			count++
			most = max(most, count)
		}
		if most <= limit || l >= longest {
			return out
		}
	}
}
