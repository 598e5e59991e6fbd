package cache

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/golang-lru/v2/simplelru"
	"golang.org/x/sys/unix"

	"github.com/shardload/shardload/source"
)

// metaFormat is the version of the meta file's layout. Entries of another format are
// dropped on start and fetched again when next read (format 2 kept XXH64 sums).
const metaFormat = 3

// maxMetaBytes caps a meta file: a longer URL is not cached on disk.
const maxMetaBytes = 24 << 10

// meta is what a .meta file records about its .data file.
type meta struct {
	Format  int       `json:"format"`
	URL     string    `json:"url"`
	Version string    `json:"version"`
	Size    int64     `json:"size"`
	Block   int64     `json:"block"` // bytes per checksummed block: blockSize(Size)
	XXH3    string    `json:"xxh3"`  // per block, the 64-bit XXH3, 16 lower-case hex digits each
	Fetched time.Time `json:"fetched"`

	sums []uint64 // XXH3, parsed
}

// parseMeta parses a meta file and checks it against the hash its name carries.
func parseMeta(b []byte, urlHash string) (meta, error) {
	var m meta
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&m); err != nil {
		return meta{}, fmt.Errorf("%w: meta: %v", ErrCorrupt, err)
	}
	switch {
	case dec.More():
		return meta{}, fmt.Errorf("%w: meta: trailing data", ErrCorrupt)
	case m.Format != metaFormat:
		return meta{}, fmt.Errorf("%w: meta: format %d, want %d", ErrCorrupt, m.Format, metaFormat)
	case m.Size < 0:
		return meta{}, fmt.Errorf("%w: meta: size %d", ErrCorrupt, m.Size)
	case m.Block != blockSize(m.Size):
		return meta{}, fmt.Errorf("%w: meta: block size %d, want %d", ErrCorrupt, m.Block, blockSize(m.Size))
	case hashURL(m.URL) != urlHash:
		return meta{}, fmt.Errorf("%w: meta: URL %q does not hash to its file name", ErrCorrupt, m.URL)
	}
	sums, err := parseSums(m.XXH3, m.blocks())
	if err != nil {
		return meta{}, fmt.Errorf("%w: meta: %v", ErrCorrupt, err)
	}
	m.sums = sums
	return m, nil
}

// hashURL names an object's files: the SHA-256 of its URL in hex.
func hashURL(url string) string {
	h := sha256.Sum256([]byte(url))
	return hex.EncodeToString(h[:])
}

// newName returns a fresh HASH-GEN file name stem for url.
func newName(url string) string {
	var g [8]byte
	rand.Read(g[:])
	return hashURL(url) + "-" + hex.EncodeToString(g[:])
}

// fileRE matches every entry file the disk tier creates, and only those are ever
// deleted: HASH-GEN.data and .meta, and while a fetch runs tmp-HASH-GEN-RESERVED.data
// (RESERVED: the bytes it reserved, so that every process counts them) and
// tmp-HASH-GEN.meta.
var fileRE = regexp.MustCompile(`^(tmp-)?([0-9a-f]{64})-([0-9a-f]{16})(?:-([0-9]{1,19}))?\.(data|meta)$`)

// matchFile is fileRE.FindStringSubmatch(name) without the regular expression,
// which a directory of many entries would run twice for each of their files on
// every open: nil, or name, "tmp-" or "", the hash, the generation, the reserved
// bytes or "", and "data" or "meta".
func matchFile(name string) []string {
	rest, tmp := strings.CutPrefix(name, "tmp-")
	var ext string
	switch {
	case strings.HasSuffix(rest, ".data"):
		ext = "data"
	case strings.HasSuffix(rest, ".meta"):
		ext = "meta"
	default:
		return nil
	}
	rest = rest[:len(rest)-len(".data")]
	if len(rest) < 64+1+16 || rest[64] != '-' || !lowerHex(rest[:64]) || !lowerHex(rest[65:81]) {
		return nil
	}
	hash, gen, reserved := rest[:64], rest[65:81], ""
	if rest = rest[81:]; rest != "" {
		if rest[0] != '-' || len(rest) < 2 || len(rest) > 20 || strings.Trim(rest[1:], "0123456789") != "" {
			return nil
		}
		reserved = rest[1:]
	}
	prefix := ""
	if tmp {
		prefix = "tmp-"
	}
	return []string{name, prefix, hash, gen, reserved, ext}
}

// lowerHex reports whether s is lower-case hex digits only.
func lowerHex(s string) bool {
	for i := range len(s) {
		if c := s[i]; (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// lockRE matches an object's fill lock, HASH.lock: held by the process fetching it.
var lockRE = regexp.MustCompile(`^([0-9a-f]{64})\.lock$`)

// lockName is lockRE.FindStringSubmatch(name), checking the suffix first.
func lockName(name string) []string {
	if !strings.HasSuffix(name, ".lock") {
		return nil
	}
	return lockRE.FindStringSubmatch(name)
}

// diskEntry is one committed object. Fields other than opens and checkedAt are
// guarded by Cache.mu.
//
// An entry another process committed joins the index from its file names and sizes
// alone; its meta file is read when this process first looks the object up
// (Cache.loadDisk), so that opening a directory of many entries reads none of them.
type diskEntry struct {
	name     string // HASH-GEN
	meta     meta   // valid once loaded
	loaded   bool
	dataSize int64        // the data file's size when found, before loading: checked against the meta's
	bytes    int64        // data and meta file sizes
	refs     int          // open readers
	gone     bool         // removed from the index; files go when the last reader closes
	opens    atomic.Int32 // opens in this process: the memory tier admits the second
	// checkedAt is when a Stat last found the object at the entry's version, as this
	// process knows (wall-clock nanoseconds; 0: not known): see validate.go.
	checkedAt atomic.Int64
}

func newDiskEntry(name string, m meta, bytes int64) *diskEntry {
	e := &diskEntry{name: name, bytes: bytes}
	e.setMeta(m)
	return e
}

// setMeta makes m the entry's meta.
func (e *diskEntry) setMeta(m meta) {
	e.meta, e.loaded = m, true
}

// peek returns the entry of the object of key k, if the index has it loaded;
// get also marks it used. An entry not loaded yet is not found: Cache.loadDisk
// loads it. Called with Cache.mu held.
func (d *diskTier) peek(k string) (*diskEntry, bool) {
	e, ok := d.lru.Peek(hashURL(k))
	return e, ok && e.loaded
}

func (d *diskTier) get(k string) (*diskEntry, bool) {
	e, ok := d.lru.Get(hashURL(k))
	return e, ok && e.loaded
}

// hash is the index's key of the entry: the hash of its URL (see hashURL).
func (e *diskEntry) hash() string { return e.name[:64] }

func (e *diskEntry) matches(info source.Info) bool {
	return e.meta.Version == info.Version && e.meta.Size == info.Size
}

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
	d.evictTo(0, &counters{}) // the budget shrank since the last run
	return nil
}

func (d *diskTier) readMeta(stem string) (meta, error) {
	f, err := os.Open(d.metaPath(stem))
	if err != nil {
		return meta{}, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxMetaBytes+1))
	if err != nil {
		return meta{}, err
	}
	if len(b) > maxMetaBytes {
		return meta{}, fmt.Errorf("%w: meta larger than %d bytes", ErrCorrupt, maxMetaBytes)
	}
	return parseMeta(b, stem[:64])
}

// evictTo deletes least recently used entries no one reads, here or in another
// process, until n more bytes fit in the budget; it reports whether they do. Called
// inside shared (it bumps the generation before deleting).
func (d *diskTier) evictTo(n int64, cn *counters) bool {
	if n > d.budget {
		return false
	}
	tried := map[*diskEntry]bool{}
	for {
		d.mu.Lock()
		if d.used+n <= d.budget {
			d.mu.Unlock()
			return true
		}
		var victim *diskEntry
		for _, k := range d.lru.Keys() { // oldest first
			e, _ := d.lru.Peek(k)
			if e.refs == 0 && !tried[e] {
				victim = e
				break
			}
		}
		d.mu.Unlock()
		if victim == nil {
			return false
		}
		tried[victim] = true
		d.bump()
		if !d.tryDelete(victim.name) {
			continue // another process reads it
		}
		d.mu.Lock()
		if cur, ok := d.lru.Peek(victim.hash()); ok && cur == victim {
			d.lru.Remove(victim.hash())
		}
		delete(d.stems, victim.name)
		victim.gone = true
		d.used -= victim.bytes
		d.mu.Unlock()
		cn.evicted.Add(1)
	}
}

// reserve makes room for n bytes (evicting) and counts them as used, then runs
// create, which makes the file that holds the reservation (its name says how much,
// for the other processes); a create error undoes the reservation. It reports false
// when there cannot be room.
func (d *diskTier) reserve(n int64, cn *counters, create func() error) (ok bool, err error) {
	serr := d.shared(false, func() {
		if !d.evictTo(n, cn) {
			return
		}
		d.bump()
		if err = create(); err != nil {
			return
		}
		d.mu.Lock()
		d.used += n
		d.mu.Unlock()
		ok = true
	})
	if serr != nil {
		return false, serr
	}
	return ok, err
}

// change runs fn, which changes the directory's files, inside shared with the
// generation bumped.
func (d *diskTier) change(fn func()) {
	if err := d.shared(false, func() { d.bump(); fn() }); err != nil {
		d.logf("%v", err)
	}
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

// readVerified reads an entry's data into buf (its size) and checks every block,
// counting them in cn.
func (d *diskTier) readVerified(e *diskEntry, buf []byte, cn *counters) error {
	path := d.dataPath(e.name)
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return errVanished
	}
	if err != nil {
		return &source.Error{Op: "open", URL: e.meta.URL, Err: fmt.Errorf("%w: %v", ErrCorrupt, err)}
	}
	defer f.Close()
	if !lockRead(f) {
		return errVanished
	}
	if _, err := io.ReadFull(f, buf); err != nil {
		return &source.Error{Op: "read", URL: e.meta.URL, Err: fmt.Errorf("%w: %s: %v", ErrCorrupt, path, err)}
	}
	if n, _ := f.Read(make([]byte, 1)); n != 0 {
		return &source.Error{Op: "read", URL: e.meta.URL, Err: fmt.Errorf("%w: %s is longer than %d bytes", ErrCorrupt, path, e.meta.Size)}
	}
	for i := range e.meta.blocks() {
		off, n := e.meta.blockRange(i)
		cn.checked.Add(1)
		if err := e.meta.checkBlock(i, buf[off:off+n], path); err != nil {
			return err
		}
	}
	return nil
}

// checkFile reads f from its start and compares its size and every block's checksum
// with m.
func checkFile(f *os.File, m meta, path string) error {
	buf := getBlock(m.Block)
	defer putBlock(buf)
	for i := range m.blocks() {
		off, n := m.blockRange(i)
		k, err := f.ReadAt(buf[:n], off)
		if int64(k) < n {
			if err == nil || err == io.EOF {
				err = fmt.Errorf("%w: %s is %d bytes, recorded %d", ErrCorrupt, path, off+int64(k), m.Size)
			}
			return &source.Error{Op: "read", URL: m.URL, Err: err}
		}
		if err := m.checkBlock(i, buf[:n], path); err != nil {
			return err
		}
	}
	if k, _ := f.ReadAt(buf[:1], m.Size); k != 0 {
		return &source.Error{Op: "read", URL: m.URL, Err: fmt.Errorf("%w: %s is longer than %d bytes", ErrCorrupt, path, m.Size)}
	}
	return nil
}

// inject returns the error the fault hook gives op on path, if any.
func (d *diskTier) inject(op, path string) error {
	if d.fault == nil {
		return nil
	}
	return d.fault(op, path)
}

// create creates a new file of the tier for writing and reading.
func (d *diskTier) create(path string) (*os.File, error) {
	if err := d.inject("create", path); err != nil {
		return nil, err
	}
	return os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
}

// writeAt writes all of b at off of fh.
func (d *diskTier) writeAt(fh *os.File, b []byte, off int64) error {
	if err := d.inject("write", fh.Name()); err != nil {
		return err
	}
	_, err := fh.WriteAt(b, off)
	return err
}

// sync makes fh durable.
func (d *diskTier) sync(fh *os.File, path string) error {
	if err := d.inject("sync", path); err != nil {
		return err
	}
	return fh.Sync()
}

// rename moves a file of the tier into place.
func (d *diskTier) rename(from, to string) error {
	if err := d.inject("rename", to); err != nil {
		return err
	}
	return os.Rename(from, to)
}

// syncDir makes renames in the tier's directory durable.
func (d *diskTier) syncDir() error {
	f, err := os.Open(d.root)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}
