package cache

// The disk tier's budget: eviction, reservations, deletion, and the locks that guard them.

import (
	"errors"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"
)

// evictTo deletes entries no one reads, here or in another process, until n more
// bytes fit in the budget, in the order of the policy r (nil: PolicyLRU, least
// recently used first). Under PolicyOrder it first checks that the entries it would
// delete are all to be evicted before the object n bytes are for: if one is not
// (notWanted), or if all of them would not make the room (noRoom), it deletes
// nothing. Under PolicyLRU it deletes until the room is made or no entry is left to
// delete. Called inside shared (it bumps the generation before deleting).
func (d *diskTier) evictTo(n int64, cn *counters, r *ranker) evictResult {
	if n > d.budget {
		return noRoom
	}
	tried := map[*diskEntry]bool{}
	for {
		d.mu.Lock()
		need := d.used + n - d.budget
		if need <= 0 {
			d.mu.Unlock()
			return roomMade
		}
		var cands []victim[*diskEntry]
		for i, k := range d.lru.Keys() { // oldest first
			e, _ := d.lru.Peek(k)
			if e.refs == 0 && !tried[e] {
				cands = append(cands, victim[*diskEntry]{e: e, rank: r.rankOf(e.hintKey(), i), bytes: e.bytes})
				if r == nil {
					break // the least recently used
				}
			}
		}
		d.mu.Unlock()
		if len(cands) == 0 {
			return noRoom
		}
		if r != nil {
			var res evictResult
			if cands, res = plan(r, cands, need); res != roomMade {
				return res
			}
		}
		v := cands[0].e
		tried[v] = true
		d.bump()
		if !d.tryDelete(v.name) {
			continue // another process reads it
		}
		d.mu.Lock()
		if cur, ok := d.lru.Peek(v.hash()); ok && cur == v {
			d.lru.Remove(v.hash())
		}
		delete(d.stems, v.name)
		v.gone = true
		d.used -= v.bytes
		d.mu.Unlock()
		cn.evicted.Add(1)
	}
}

// reserve makes room for n bytes (evicting as r orders; nil: least recently used
// first) and counts them as used, then runs create, which makes the file that holds
// the reservation (its name says how much, for the other processes); a create error
// undoes the reservation. It reports why when there is no room made.
func (d *diskTier) reserve(n int64, cn *counters, r *ranker, create func() error) (res evictResult, err error) {
	res = noRoom
	serr := d.shared(false, func() {
		if res = d.evictTo(n, cn, r); res != roomMade {
			return
		}
		d.bump()
		if err = create(); err != nil {
			res = noRoom
			return
		}
		d.mu.Lock()
		d.used += n
		d.mu.Unlock()
	})
	if serr != nil {
		return noRoom, serr
	}
	return res, err
}

// remove takes e out of the index and returns it for reaping if no one reads it.
// Called with Cache.mu held.
func (d *diskTier) remove(e *diskEntry) []*diskEntry {
	if cur, ok := d.lru.Peek(e.hash()); ok && cur == e {
		d.lru.Remove(e.hash())
	}
	if e.gone {
		return nil
	}
	e.gone = true
	if e.refs == 0 {
		return []*diskEntry{e}
	}
	return nil
}

// tryDelete deletes an entry's files unless a process reads its data file (holds a
// shared lock on it): it takes the data file's lock exclusive, without waiting, and
// deletes both files holding it. It reports whether the files are gone. Called
// inside shared.
func (d *diskTier) tryDelete(stem string) bool {
	fh, err := os.Open(d.dataPath(stem))
	if errors.Is(err, os.ErrNotExist) {
		d.removePath(d.metaPath(stem))
		return true
	}
	if err != nil {
		d.logf("cache: %v", err)
		return false
	}
	defer fh.Close()
	if err := unix.Flock(int(fh.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		return false
	}
	d.removeFiles(stem)
	return true
}

// errVanished means an entry's files were deleted by another process after this one
// indexed it: the entry is dropped from the index and the object opened again.
var errVanished = errors.New("cache: entry deleted by another process")

// lockRead takes a shared lock on an entry's open data file, so that no process
// deletes it while it is read, and reports whether the file is still the entry's
// (another process may have deleted it between the open and the lock).
func lockRead(fh *os.File) bool {
	if err := unix.Flock(int(fh.Fd()), unix.LOCK_SH); err != nil {
		return false
	}
	var st unix.Stat_t
	return unix.Fstat(int(fh.Fd()), &st) == nil && st.Nlink > 0
}

// objectLock is an object's fill lock, held.
type objectLock struct {
	f    *os.File
	path string
}

// tryObjectLock takes the fill lock of the object whose URL hashes to hash, without
// waiting; false when another process holds it (it is fetching the object). An
// error means the lock file cannot be created (the directory cannot be written).
func (d *diskTier) tryObjectLock(hash string) (*objectLock, bool, error) {
	path := d.lockPath(hash)
	for {
		if err := d.inject("create", path); err != nil {
			return nil, false, err
		}
		f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
		if err != nil {
			return nil, false, err
		}
		if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
			f.Close()
			return nil, false, nil
		}
		// The holder before removes the file holding the lock: the lock taken is the
		// file's at path only if path still names it.
		var a, b unix.Stat_t
		if unix.Fstat(int(f.Fd()), &a) == nil && unix.Stat(path, &b) == nil && a.Ino == b.Ino && a.Dev == b.Dev {
			return &objectLock{f: f, path: path}, true, nil
		}
		f.Close()
	}
}

// release removes the lock file, still holding it, then lets it go.
func (l *objectLock) release() {
	os.Remove(l.path)
	l.f.Close()
}

// removeFiles deletes an entry's two files.
func (d *diskTier) removeFiles(stem string) {
	d.removePath(d.dataPath(stem))
	d.removePath(d.metaPath(stem))
}

// removePath deletes one of this tier's files; the name is checked against the
// pattern of the files it creates.
func (d *diskTier) removePath(path string) {
	if filepath.Dir(path) != d.root || matchFile(filepath.Base(path)) == nil {
		d.logf("cache: refusing to delete %s: not a cache file", path)
		return
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		d.logf("cache: %v", err)
	}
}

// touch records a use in the meta file's modification time, the LRU order the next
// start rebuilds. A committed data file is never changed, its times included.
func (d *diskTier) touch(e *diskEntry) {
	now := time.Now()
	os.Chtimes(d.metaPath(e.name), now, now)
}
