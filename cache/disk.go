package cache

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"sync/atomic"
	"time"

	"github.com/hashicorp/golang-lru/v2/simplelru"
	"golang.org/x/sys/unix"

	"github.com/shardload/shardload/source"
)

// metaFormat is the version of the meta file's layout. Entries of another format are
// dropped on start and fetched again when next read.
const metaFormat = 2

// maxMetaBytes caps a meta file: a longer URL is not cached on disk.
const maxMetaBytes = 24 << 10

// meta is what a .meta file records about its .data file.
type meta struct {
	Format  int       `json:"format"`
	URL     string    `json:"url"`
	Version string    `json:"version"`
	Size    int64     `json:"size"`
	Block   int64     `json:"block"` // bytes per checksummed block: blockSize(Size)
	XXH64   string    `json:"xxh64"` // per block, 16 lower-case hex digits each
	Fetched time.Time `json:"fetched"`

	sums []uint64 // XXH64, parsed
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
	sums, err := parseSums(m.XXH64, m.blocks())
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

// fileRE matches every name the disk tier creates, and only those are ever deleted.
var fileRE = regexp.MustCompile(`^(tmp-)?([0-9a-f]{64})-([0-9a-f]{16})\.(data|meta)$`)

// diskEntry is one committed object. Fields other than checked and opens are
// guarded by Cache.mu.
type diskEntry struct {
	name    string // HASH-GEN
	meta    meta
	bytes   int64           // data and meta file sizes
	refs    int             // open readers
	gone    bool            // removed from the index; files go when the last reader closes
	checked []atomic.Uint64 // a bit per block: its checksum matched in this process
	opens   atomic.Int32    // opens in this process: the memory tier admits the second
}

func newDiskEntry(name string, m meta, bytes int64) *diskEntry {
	return &diskEntry{name: name, meta: m, bytes: bytes, checked: make([]atomic.Uint64, (m.blocks()+63)/64)}
}

func (e *diskEntry) matches(info source.Info) bool {
	return e.meta.Version == info.Version && e.meta.Size == info.Size
}

// setVerified marks every block checked.
func (e *diskEntry) setVerified() {
	for i := range e.checked {
		e.checked[i].Store(^uint64(0))
	}
}

// isChecked reports whether block i was checked in this process.
func (e *diskEntry) isChecked(i int64) bool { return e.checked[i/64].Load()&(1<<(i%64)) != 0 }

// setChecked records that block i was checked.
func (e *diskEntry) setChecked(i int64) { e.checked[i/64].Or(1 << (i % 64)) }

// diskTier is the disk tier: an LRU index of entries in root with a byte budget.
// Its fields are guarded by Cache.mu; file I/O happens outside that lock.
type diskTier struct {
	root   string
	budget int64
	used   int64 // committed entries, reservations, and removed entries not yet deleted
	lru    *simplelru.LRU[string, *diskEntry]
	lock   *os.File
	logf   func(string, ...any)
	// fault, when set (by tests), is asked before each write of the tier's files
	// (op "create", "write", "sync" or "rename") and fails it with the error it
	// returns: a disk that fills up, a directory that turns read-only.
	fault func(op, path string) error
}

// openDisk creates dir/v1, locks it, and rebuilds the index from its files.
func openDisk(dir string, budget int64, logf func(string, ...any)) (*diskTier, error) {
	root := filepath.Join(dir, "v1")
	if err := os.MkdirAll(root, 0o700); err != nil {
		return nil, fmt.Errorf("cache: %w", err)
	}
	lock, err := os.OpenFile(filepath.Join(root, "lock"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("cache: %w", err)
	}
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		lock.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("%w: %s (one process per cache directory; use another --cache-dir)", ErrBusy, root)
		}
		return nil, fmt.Errorf("cache: locking %s: %w", root, err)
	}
	lru, err := simplelru.NewLRU[string, *diskEntry](math.MaxInt32, nil)
	if err != nil {
		panic(err)
	}
	d := &diskTier{root: root, budget: budget, lru: lru, lock: lock, logf: logf}
	if err := d.rebuild(); err != nil {
		d.close()
		return nil, err
	}
	return d, nil
}

func (d *diskTier) close() { d.lock.Close() }

func (d *diskTier) dataPath(name string) string { return filepath.Join(d.root, name+".data") }
func (d *diskTier) metaPath(name string) string { return filepath.Join(d.root, name+".meta") }
func (d *diskTier) tmpData(name string) string  { return filepath.Join(d.root, "tmp-"+name+".data") }
func (d *diskTier) tmpMeta(name string) string  { return filepath.Join(d.root, "tmp-"+name+".meta") }

// rebuild reads the index from the directory, deleting (of its own files only) what
// cannot be verified without reading the data: see the package documentation.
func (d *diskTier) rebuild() error {
	ents, err := os.ReadDir(d.root)
	if err != nil {
		return fmt.Errorf("cache: %w", err)
	}
	type found struct {
		meta, data bool
		size       int64
		mtime      time.Time
	}
	names := map[string]*found{}
	for _, de := range ents {
		m := fileRE.FindStringSubmatch(de.Name())
		if m == nil || !de.Type().IsRegular() {
			continue // not ours
		}
		if m[1] != "" {
			d.removePath(filepath.Join(d.root, de.Name())) // a fetch cut short
			continue
		}
		stem := m[2] + "-" + m[3]
		f := names[stem]
		if f == nil {
			f = &found{}
			names[stem] = f
		}
		if m[4] == "meta" {
			f.meta = true
			continue
		}
		fi, err := de.Info()
		if err != nil {
			continue
		}
		f.data, f.size, f.mtime = true, fi.Size(), fi.ModTime()
	}
	type cand struct {
		e     *diskEntry
		mtime time.Time
	}
	byURL := map[string]cand{}
	for stem, f := range names {
		var m meta
		err := errors.New("data without meta")
		if f.meta {
			m, err = d.readMeta(stem)
		}
		if err == nil && !f.data {
			err = errors.New("meta without data")
		}
		if err == nil && f.size != m.Size {
			err = fmt.Errorf("data is %d bytes, meta says %d", f.size, m.Size)
		}
		if err != nil {
			d.logf("cache: dropping entry %s: %v", stem, err)
			d.removeFiles(stem)
			continue
		}
		mb, _ := os.Stat(d.metaPath(stem))
		e := newDiskEntry(stem, m, f.size)
		if mb != nil {
			e.bytes += mb.Size()
		}
		if old, ok := byURL[m.URL]; ok {
			// Two generations of one object: a crash between commits. Keep the newer.
			if old.e.meta.Fetched.After(m.Fetched) {
				d.removeFiles(stem)
				continue
			}
			d.removeFiles(old.e.name)
		}
		byURL[m.URL] = cand{e, f.mtime}
	}
	cands := make([]cand, 0, len(byURL))
	for _, c := range byURL {
		cands = append(cands, c)
	}
	sort.Slice(cands, func(i, j int) bool { return cands[i].mtime.Before(cands[j].mtime) })
	for _, c := range cands {
		d.lru.Add(c.e.meta.URL, c.e)
		d.used += c.e.bytes
	}
	for d.used > d.budget { // the budget shrank since the last run
		_, e, _ := d.lru.RemoveOldest()
		d.removeFiles(e.name)
		d.used -= e.bytes
	}
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

// reserve makes room for n bytes by removing least recently used entries no one is
// reading, and counts the n bytes as used. The victims' files are still on disk and
// counted: the caller must reap them before writing. It removes nothing and returns
// false when there cannot be room. Called with Cache.mu held.
func (d *diskTier) reserve(n int64, cn *counters) (victims []*diskEntry, ok bool) {
	if n > d.budget {
		return nil, false
	}
	need := d.used + n - d.budget
	if need > 0 {
		var free int64
		for _, k := range d.lru.Keys() { // oldest first
			e, _ := d.lru.Peek(k)
			if e.refs > 0 {
				continue
			}
			victims = append(victims, e)
			if free += e.bytes; free >= need {
				break
			}
		}
		if free < need {
			return nil, false
		}
		for _, e := range victims {
			d.lru.Remove(e.meta.URL)
			e.gone = true
			cn.evicted.Add(1)
		}
	}
	d.used += n
	return victims, true
}

// remove takes e out of the index and returns it for reaping if no one reads it.
// Called with Cache.mu held.
func (d *diskTier) remove(e *diskEntry) []*diskEntry {
	if cur, ok := d.lru.Peek(e.meta.URL); ok && cur == e {
		d.lru.Remove(e.meta.URL)
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

// removeFiles deletes an entry's two files.
func (d *diskTier) removeFiles(stem string) {
	d.removePath(d.dataPath(stem))
	d.removePath(d.metaPath(stem))
}

// removePath deletes one of this tier's files; the name is checked against the
// pattern of the files it creates.
func (d *diskTier) removePath(path string) {
	if filepath.Dir(path) != d.root || !fileRE.MatchString(filepath.Base(path)) {
		d.logf("cache: refusing to delete %s: not a cache file", path)
		return
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		d.logf("cache: %v", err)
	}
}

// touch records a use in the data file's modification time, the LRU order the next
// start rebuilds.
func (d *diskTier) touch(e *diskEntry) {
	now := time.Now()
	os.Chtimes(d.dataPath(e.name), now, now)
}

// readVerified reads an entry's data into buf (its size) and checks every block.
func (d *diskTier) readVerified(e *diskEntry, buf []byte) error {
	path := d.dataPath(e.name)
	f, err := os.Open(path)
	if err != nil {
		return &source.Error{Op: "open", URL: e.meta.URL, Err: fmt.Errorf("%w: %v", ErrCorrupt, err)}
	}
	defer f.Close()
	if _, err := io.ReadFull(f, buf); err != nil {
		return &source.Error{Op: "read", URL: e.meta.URL, Err: fmt.Errorf("%w: %s: %v", ErrCorrupt, path, err)}
	}
	if n, _ := f.Read(make([]byte, 1)); n != 0 {
		return &source.Error{Op: "read", URL: e.meta.URL, Err: fmt.Errorf("%w: %s is longer than %d bytes", ErrCorrupt, path, e.meta.Size)}
	}
	for i := range e.meta.blocks() {
		off, n := e.meta.blockRange(i)
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
