package cache

// The disk tier: its directory, shared lock and change generation, and index rebuild.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/golang-lru/v2/simplelru"
	"golang.org/x/sys/unix"
)

// diskTier is the disk tier: an LRU index of entries in root with a byte budget,
// shared with the other processes that use the directory (see the package
// documentation). Its index fields are guarded by mu (Cache.mu); file I/O happens
// outside that lock, and every change to the directory's files inside shared.
type diskTier struct {
	root   string
	budget int64
	mu     *sync.Mutex
	used   int64 // the directory's files: committed entries, reservations, files of other processes' fetches
	lru    *simplelru.LRU[string, *diskEntry]
	stems  map[string]*diskEntry // the index's entries and this process's gone ones still read, by file stem
	lock   *os.File              // root/lock, held shared while the tier is open
	gfile  *os.File              // root/budget: the generation, locked while the files change
	gmu    sync.Mutex            // this process's holder of gfile's lock
	gen    uint64                // the generation the index and used were read at
	logf   func(string, ...any)
	// noChecks: the file system refused extended attributes on a meta file, so
	// version checks are not shared with other processes (see validate.go).
	noChecks atomic.Bool
	checkErr sync.Once // logs the first other error with a check's record
	// fault, when set (by tests), is asked before each write of the tier's files
	// (op "create", "write", "sync" or "rename") and before each read or setting
	// of a check's record on a meta file ("getxattr", "setxattr") and fails it with
	// the error it returns: a disk that fills up, a directory that turns read-only,
	// a file system without extended attributes.
	fault func(op, path string) error
}

// openDisk creates dir/v1, takes its shared lock, and reads the index from its files.
func openDisk(dir string, budget int64, mu *sync.Mutex, logf func(string, ...any)) (*diskTier, error) {
	root := filepath.Join(dir, "v1")
	if err := os.MkdirAll(root, 0o700); err != nil {
		return nil, fmt.Errorf("cache: %w", err)
	}
	lock, err := os.OpenFile(filepath.Join(root, "lock"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("cache: %w", err)
	}
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_SH|unix.LOCK_NB); err != nil {
		lock.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("%w: %s (an older shardload holds it alone; stop it or use another --cache-dir)", ErrBusy, root)
		}
		return nil, fmt.Errorf("cache: locking %s: %w", root, err)
	}
	gfile, err := os.OpenFile(filepath.Join(root, "budget"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		lock.Close()
		return nil, fmt.Errorf("cache: %w", err)
	}
	lru, err := simplelru.NewLRU[string, *diskEntry](math.MaxInt32, nil)
	if err != nil {
		panic(err)
	}
	d := &diskTier{root: root, budget: budget, mu: mu, lru: lru, stems: map[string]*diskEntry{}, lock: lock, gfile: gfile, logf: logf}
	var rerr error
	if err := d.shared(true, func() { rerr = d.startup() }); err != nil {
		rerr = err
	}
	if rerr != nil {
		d.close()
		return nil, rerr
	}
	return d, nil
}

func (d *diskTier) close() {
	d.gfile.Close()
	d.lock.Close()
}

func (d *diskTier) dataPath(name string) string { return filepath.Join(d.root, name+".data") }
func (d *diskTier) metaPath(name string) string { return filepath.Join(d.root, name+".meta") }
func (d *diskTier) tmpData(name string, reserved int64) string {
	return filepath.Join(d.root, "tmp-"+name+"-"+strconv.FormatInt(reserved, 10)+".data")
}
func (d *diskTier) tmpMeta(name string) string  { return filepath.Join(d.root, "tmp-"+name+".meta") }
func (d *diskTier) lockPath(hash string) string { return filepath.Join(d.root, hash+".lock") }

// shared runs fn holding the directory's change lock: the other processes change
// no file meanwhile. When one did since this process last looked (the generation
// moved), the index and the bytes used are read again first. fn bumps the
// generation (d.bump) before it changes any file; force reads the directory in any
// case.
func (d *diskTier) shared(force bool, fn func()) error {
	d.gmu.Lock()
	defer d.gmu.Unlock()
	if err := unix.Flock(int(d.gfile.Fd()), unix.LOCK_EX); err != nil {
		return fmt.Errorf("cache: locking %s: %w", d.gfile.Name(), err)
	}
	defer unix.Flock(int(d.gfile.Fd()), unix.LOCK_UN)
	if g := d.readGen(); force || g != d.gen {
		d.rescan()
		d.gen = g
	}
	if fn != nil {
		fn()
	}
	return nil
}

func (d *diskTier) readGen() uint64 {
	var b [8]byte
	if n, _ := d.gfile.ReadAt(b[:], 0); n < 8 {
		return 0
	}
	return binary.LittleEndian.Uint64(b[:])
}

// bump records a change of the directory's files, so that the other processes read
// it again. Called inside shared, before the change.
func (d *diskTier) bump() {
	d.gen = d.readGen() + 1
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], d.gen)
	if _, err := d.gfile.WriteAt(b[:], 0); err != nil {
		d.logf("cache: %v", err)
	}
}

// refresh reads the index again if another process changed the directory.
func (d *diskTier) refresh() {
	d.gmu.Lock()
	stale := d.readGen() != d.gen
	d.gmu.Unlock()
	if stale {
		if err := d.shared(false, nil); err != nil {
			d.logf("%v", err)
		}
	}
}

// scanned is what rescan found of one entry's files.
type scanned struct {
	meta, data     bool
	size, metaSize int64
	mtime          time.Time // the meta file's: the last hit (see touch)
}

// rescan reads the directory: the committed entries other processes added join the
// index, the ones they removed leave it, and used becomes what the files take (a
// fetch in flight, here or elsewhere, counts what it reserved). Called inside shared.
func (d *diskTier) rescan() {
	ents, err := os.ReadDir(d.root)
	if err != nil {
		d.logf("cache: %v", err)
		return
	}
	names := map[string]*scanned{}
	var other int64 // bytes of files that are not entries of the index
	for _, de := range ents {
		m := matchFile(de.Name())
		if m == nil || !de.Type().IsRegular() {
			continue // not an entry's file
		}
		fi, err := de.Info()
		if err != nil {
			continue // removed meanwhile
		}
		if m[1] != "" {
			n := fi.Size()
			if r, err := strconv.ParseInt(m[4], 10, 64); err == nil && r > n {
				n = r
			}
			other += n
			continue
		}
		stem := m[2] + "-" + m[3]
		f := names[stem]
		if f == nil {
			f = &scanned{}
			names[stem] = f
		}
		if m[5] == "meta" {
			f.meta, f.metaSize, f.mtime = true, fi.Size(), fi.ModTime()
		} else {
			f.data, f.size = true, fi.Size()
		}
	}
	type cand struct {
		e       *diskEntry
		mtime   time.Time
		fetched time.Time // when two generations of an object are found
	}
	byHash := map[string]cand{}
	d.mu.Lock()
	known := maps.Clone(d.stems)
	d.mu.Unlock()
	// The complete generations of each object: only where there are several are
	// their metas read (to keep the newest) before the object is looked up.
	gens := map[string]int{}
	for stem, f := range names {
		if e := known[stem]; (e == nil && f.meta && f.data) || (e != nil && !e.gone) {
			gens[stem[:64]]++
		}
	}
	for stem, f := range names {
		e := known[stem]
		if e != nil && e.gone {
			other += f.size + f.metaSize // still read here; its files go when it closes
			continue
		}
		if e == nil {
			if !f.meta || !f.data {
				other += f.size + f.metaSize // being committed, or left by a crash: startup sees to it
				continue
			}
			e = &diskEntry{name: stem, dataSize: f.size, bytes: f.size + f.metaSize}
		}
		c := cand{e: e, mtime: f.mtime}
		if gens[stem[:64]] > 1 {
			m, err := d.readMeta(stem)
			if err != nil || f.size != m.Size {
				other += f.size + f.metaSize
				continue
			}
			c.fetched = m.Fetched
		}
		if old, ok := byHash[e.hash()]; ok && !c.fetched.After(old.fetched) {
			other += e.bytes // an older generation, to be deleted when no one reads it
			continue
		} else if ok {
			other += old.e.bytes
		}
		byHash[e.hash()] = c
	}
	cands := make([]cand, 0, len(byHash))
	for _, c := range byHash {
		cands = append(cands, c)
	}
	sort.Slice(cands, func(i, j int) bool { return cands[i].mtime.Before(cands[j].mtime) })
	d.mu.Lock()
	defer d.mu.Unlock()
	keep := map[string]*diskEntry{}
	for _, e := range d.stems {
		if e.gone {
			if e.refs > 0 {
				keep[e.name] = e
			}
		} else if _, ok := names[e.name]; !ok || byHash[e.hash()].e != e {
			// Removed by another process, or superseded: no longer served from here.
			e.gone = true
			if e.refs > 0 {
				keep[e.name] = e
			}
		}
	}
	d.lru.Purge()
	used := other
	for _, c := range cands {
		d.lru.Add(c.e.hash(), c.e)
		keep[c.e.name] = c.e
		used += c.e.bytes
	}
	d.stems = keep
	d.used = used
}

// startup deletes what a process that died left (its fetches' temporary files, an
// entry it did not finish committing, older generations of an object, stale fill
// locks), sparing what live processes are doing, and evicts down to the budget.
// Called inside shared, after rescan.
func (d *diskTier) startup() error {
	ents, err := os.ReadDir(d.root)
	if err != nil {
		return fmt.Errorf("cache: %w", err)
	}
	byHash := map[string][]string{}
	for _, de := range ents {
		if m := lockName(de.Name()); m != nil {
			byHash[m[1]] = append(byHash[m[1]], "")
			continue
		}
		m := matchFile(de.Name())
		if m == nil || !de.Type().IsRegular() {
			continue
		}
		stem := m[2] + "-" + m[3]
		d.mu.Lock()
		e := d.stems[stem]
		d.mu.Unlock()
		if m[1] == "" && e != nil {
			continue // an entry of the index
		}
		byHash[m[2]] = append(byHash[m[2]], de.Name())
	}
	changed := false
	logged := map[string]bool{}
	for hash, files := range byHash {
		l, ok, _ := d.tryObjectLock(hash)
		if !ok {
			continue // a live process is fetching the object (or the directory is read-only)
		}
		for _, name := range files {
			if name == "" {
				continue
			}
			if !changed {
				d.bump()
				changed = true
			}
			if strings.HasPrefix(name, "tmp-") {
				d.removePath(filepath.Join(d.root, name)) // a fetch cut short
				continue
			}
			stem := strings.TrimSuffix(strings.TrimSuffix(name, ".data"), ".meta")
			if !logged[stem] && d.tryDelete(stem) {
				logged[stem] = true
				d.logf("cache: dropping entry %s: incomplete, unreadable or an older generation", stem)
			}
		}
		l.release()
	}
	if changed {
		d.rescan()
	}
	d.evictTo(0, &counters{}, nil) // the budget shrank since the last run
	return nil
}

// change runs fn, which changes the directory's files, inside shared with the
// generation bumped.
func (d *diskTier) change(fn func()) {
	if err := d.shared(false, func() { d.bump(); fn() }); err != nil {
		d.logf("%v", err)
	}
}
