package cache

// The hints of a node's readers: this process's in memory, the other processes' in
// files of Dir/hints, read, checked and merged when a tier evicts.

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/zeebo/xxh3"
	"golang.org/x/sys/unix"
)

// A hint file, Dir/hints/ID.hint (ID: 16 hex digits, random per Hints), is written
// whole to tmp-ID-RANDOM.hint and renamed into place. Its layout, little-endian:
//
//	0   8  magic "SLHINT01"
//	8   8  XXH3 (64 bits) of every byte from offset 16 to the end
//	16  8  when it was published (unix nanoseconds)
//	24  8  the reader's Lifetime (nanoseconds)
//	32  8  the reader's Slack (nanoseconds)
//	40  4  the writer's process id (for log lines)
//	44  4  number of entries
//	48  2  length of the reader's name, then the name
//	       then each entry: the hint key (8 bytes: the first 8 of the SHA-256 of
//	       the object's key, big-endian as a number) and At as a signed varint,
//	       the difference from the entry before (the first: from the publish time)
//
// Dir/hints/ID.lock is held with an exclusive flock by the process while its Hints
// is open; its modification time is the reader's heartbeat.
const (
	hintMagic     = "SLHINT01"
	hintHeader    = 50
	hintExt       = ".hint"
	lockExt       = ".lock"
	maxHintFile   = 256 << 20
	maxHintReader = 1 << 10
	// orphanAge is how old a lock or temporary file of a reader whose process is gone
	// must be before it is deleted: younger, it may be a Hints being created.
	orphanAge = time.Minute
)

// encodeHints returns the file of l, published at pub by a reader of lifetime life.
func encodeHints(l *hintList, pub, life int64) []byte {
	name := l.reader
	if len(name) > maxHintReader {
		name = name[:maxHintReader]
	}
	b := make([]byte, hintHeader, hintHeader+len(name)+13*len(l.keys))
	copy(b, hintMagic)
	binary.LittleEndian.PutUint64(b[16:], uint64(pub))
	binary.LittleEndian.PutUint64(b[24:], uint64(life))
	binary.LittleEndian.PutUint64(b[32:], uint64(l.slack))
	binary.LittleEndian.PutUint32(b[40:], uint32(l.pid))
	binary.LittleEndian.PutUint32(b[44:], uint32(len(l.keys)))
	binary.LittleEndian.PutUint16(b[48:], uint16(len(name)))
	b = append(b, name...)
	prev := pub
	for i, k := range l.keys {
		b = binary.BigEndian.AppendUint64(b, k)
		b = binary.AppendVarint(b, l.ats[i]-prev)
		prev = l.ats[i]
	}
	binary.LittleEndian.PutUint64(b[8:], xxh3.Hash(b[16:]))
	return b
}

// errHintFile is the error of a hint file that is not one.
var errHintFile = errors.New("not a hint file")

// parseHints parses a hint file; it returns the reader's hints and its lifetime.
func parseHints(b []byte) (*hintList, int64, error) {
	bad := func(format string, args ...any) (*hintList, int64, error) {
		return nil, 0, fmt.Errorf("%w: %s", errHintFile, fmt.Sprintf(format, args...))
	}
	if len(b) >= 8 && string(b[:8]) != hintMagic {
		return bad("format %q, want %q", b[:8], hintMagic)
	}
	if len(b) < hintHeader {
		return bad("cut short at %d bytes", len(b))
	}
	if sum := binary.LittleEndian.Uint64(b[8:]); sum != xxh3.Hash(b[16:]) {
		return bad("checksum mismatch (truncated or overwritten)")
	}
	pub := int64(binary.LittleEndian.Uint64(b[16:]))
	life := int64(binary.LittleEndian.Uint64(b[24:]))
	slack := int64(binary.LittleEndian.Uint64(b[32:]))
	pid := int(binary.LittleEndian.Uint32(b[40:]))
	n := int(binary.LittleEndian.Uint32(b[44:]))
	rlen := int(binary.LittleEndian.Uint16(b[48:]))
	switch {
	case pub <= 0 || pub >= maxHintAt:
		return bad("publish time %d", pub)
	case life <= 0 || life > int64(maxHintDuration):
		return bad("lifetime %d ns", life)
	case slack < 0 || slack > int64(maxHintDuration):
		return bad("slack %d ns", slack)
	case rlen > maxHintReader || hintHeader+rlen > len(b):
		return bad("reader name of %d bytes", rlen)
	case n > (len(b)-hintHeader-rlen)/9:
		return bad("%d entries in %d bytes", n, len(b))
	}
	l := &hintList{reader: string(b[hintHeader : hintHeader+rlen]), pid: pid, slack: slack, keys: make([]uint64, n), ats: make([]int64, n)}
	p := b[hintHeader+rlen:]
	prev := pub
	for i := range n {
		if len(p) < 9 {
			return bad("entry %d cut short", i)
		}
		l.keys[i] = binary.BigEndian.Uint64(p)
		d, k := binary.Varint(p[8:])
		if k <= 0 {
			return bad("entry %d: bad time", i)
		}
		p = p[8+k:]
		at := prev + d
		if (d > 0 && at < prev) || (d < 0 && at > prev) || at <= 0 || at >= maxHintAt {
			return bad("entry %d: time out of range", i)
		}
		l.ats[i], prev = at, at
	}
	if len(p) != 0 {
		return bad("%d bytes after the entries", len(p))
	}
	return l, life, nil
}

// newHintID returns 16 random hex digits.
func newHintID() string {
	var b [8]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// hintName parses a name of the hints directory: ID.hint, ID.lock or
// tmp-ID-RANDOM.hint. ok is false for any other name, which is never touched.
func hintName(name string) (id, kind string, ok bool) {
	switch {
	case strings.HasPrefix(name, "tmp-") && strings.HasSuffix(name, hintExt):
		rest := strings.TrimSuffix(strings.TrimPrefix(name, "tmp-"), hintExt)
		if len(rest) == 33 && rest[16] == '-' && lowerHex(rest[:16]) && lowerHex(rest[17:]) {
			return rest[:16], "tmp", true
		}
	case strings.HasSuffix(name, hintExt), strings.HasSuffix(name, lockExt):
		ext := filepath.Ext(name)
		rest := strings.TrimSuffix(name, ext)
		if len(rest) == 16 && lowerHex(rest) {
			return rest, ext[1:], true
		}
	}
	return "", "", false
}

// flockEx takes f's lock exclusively, without waiting.
func flockEx(f *os.File) error {
	return unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
}

// hintBook holds the hints of the node's readers: this process's Hints, and what
// was read of the other processes' files.
type hintBook struct {
	c   *Cache
	dir string // Dir/hints; empty: no disk tier, no files

	mu     sync.Mutex
	closed bool
	local  []*Hints             // this process's, open
	files  map[string]*hintFile // the other processes' files read, by ID
	logged map[string]string    // ID -> the state last logged of its file
	set    *hintSet             // the last merge
	from   []*hintList          // what it merged
	warned map[string]bool      // directory errors logged
}

// hintFile is what was read of one hint file.
type hintFile struct {
	sig  fileSig
	list *hintList
	life int64
	err  error // it does not parse
}

// fileSig tells versions of a file apart: each publish renames a new file into
// place (another inode) written at another time.
type fileSig struct {
	ino         uint64
	size, mtime int64
}

func (s fileSig) String() string { return fmt.Sprintf("%d/%d/%d", s.ino, s.size, s.mtime) }

func newHintBook(c *Cache, dir string) *hintBook {
	b := &hintBook{c: c, files: map[string]*hintFile{}, logged: map[string]string{}, warned: map[string]bool{}}
	if dir != "" {
		b.dir = filepath.Join(dir, "hints")
	}
	return b
}

// add records an open Hints of this process; false once the cache is closed.
func (b *hintBook) add(h *Hints) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return false
	}
	b.local = append(b.local, h)
	return true
}

// publish makes l h's hints.
func (b *hintBook) publish(h *Hints, l *hintList) {
	b.mu.Lock()
	h.list = l
	b.mu.Unlock()
}

// remove withdraws h's hints.
func (b *hintBook) remove(h *Hints) {
	b.mu.Lock()
	b.local = slices.DeleteFunc(b.local, func(x *Hints) bool { return x == h })
	h.list = nil
	b.mu.Unlock()
}

// close closes this process's Hints; none can be made after.
func (b *hintBook) close() {
	b.mu.Lock()
	b.closed = true
	local := slices.Clone(b.local)
	b.mu.Unlock()
	for _, h := range local {
		h.Close()
	}
}

// view returns the hints of the node's live readers now: this process's and, with a
// directory, those of the other processes' files that are whole, of a live process
// and not expired. It reads the directory (a few small reads per reader, a file
// read again only when it changed); files of readers whose process is gone are
// deleted, other files that do not count are logged once per version.
func (b *hintBook) view() *hintSet {
	b.mu.Lock()
	defer b.mu.Unlock()
	var lists []*hintList
	for _, h := range b.local {
		if h.list != nil {
			lists = append(lists, h.list)
		}
	}
	if b.dir != "" {
		lists = append(lists, b.scan()...)
	}
	if b.set == nil || !slices.Equal(lists, b.from) {
		b.set, b.from = mergeHints(lists), lists
	}
	b.c.n.hintReaders.Store(int64(len(lists)))
	return b.set
}

// readerFiles is what the directory holds of one reader.
type readerFiles struct {
	hint     fs.DirEntry
	lock     bool
	tmps     []string
	youngest time.Time // of its lock and temporary files
}

// scan reads the other processes' hint files. Called with b.mu held.
func (b *hintBook) scan() []*hintList {
	ents, err := os.ReadDir(b.dir)
	if err != nil {
		if !errors.Is(err, os.ErrNotExist) {
			b.warnOnce("read", "cache: reading %s: %v; evicting without the other processes' hints", b.dir, err)
		}
		return nil
	}
	own := map[string]bool{}
	for _, h := range b.local {
		own[h.id] = true
	}
	readers := map[string]*readerFiles{}
	for _, de := range ents {
		id, kind, ok := hintName(de.Name())
		if !ok || own[id] || !de.Type().IsRegular() {
			continue
		}
		r := readers[id]
		if r == nil {
			r = &readerFiles{}
			readers[id] = r
		}
		switch kind {
		case "hint":
			r.hint = de
			continue
		case "lock":
			r.lock = true
		case "tmp":
			r.tmps = append(r.tmps, de.Name())
		}
		if fi, err := de.Info(); err == nil && fi.ModTime().After(r.youngest) {
			r.youngest = fi.ModTime()
		}
	}
	ids := make([]string, 0, len(readers))
	for id := range readers {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	var lists []*hintList
	for id := range b.files {
		if r := readers[id]; r == nil || r.hint == nil {
			delete(b.files, id)
			delete(b.logged, id)
		}
	}
	for _, id := range ids {
		r := readers[id]
		if r.hint == nil {
			// A lock or temporary files with no hints: a reader that has not published
			// yet, or what a dead one left.
			if time.Since(r.youngest) > orphanAge {
				if state, _, release := b.alive(id); state == lockFree {
					b.removeReader(id, r)
					release()
				}
			}
			continue
		}
		if l := b.reader(id, r); l != nil {
			lists = append(lists, l)
		}
	}
	return lists
}

// reader returns the hints of one reader's file if they count. Called with b.mu held.
func (b *hintBook) reader(id string, r *readerFiles) *hintList {
	path := filepath.Join(b.dir, id+hintExt)
	f := b.load(id, r.hint)
	if f == nil {
		return nil // gone meanwhile
	}
	state, beat, release := b.alive(id)
	if state == lockFree {
		// Its process is gone (or it never held its lock): the files go.
		why := "its process is gone"
		if f.err != nil {
			why += " (" + f.err.Error() + ")"
		}
		b.ignore(id, "dead", "cache: dropping hint file %s%s: %s", path, f.about(), why)
		b.removeReader(id, r)
		release()
		delete(b.files, id)
		return nil
	}
	if f.err != nil {
		b.ignore(id, "bad "+f.sig.String(), "cache: ignoring hint file %s: %v", path, f.err)
		return nil
	}
	if !beat.IsZero() {
		if late := time.Since(beat); late > time.Duration(f.life) {
			b.ignore(id, "expired "+f.sig.String(), "cache: ignoring hint file %s%s: no heartbeat for %s (its lifetime is %s)",
				path, f.about(), late.Round(time.Second), time.Duration(f.life))
			return nil
		}
	}
	if _, ok := b.logged[id]; ok {
		b.logged[id] = "counted" // a later state is logged again
	}
	return f.list
}

// about names a file's reader for a log line.
func (f *hintFile) about() string {
	if f.list == nil {
		return ""
	}
	return fmt.Sprintf(" (reader %q, pid %d)", f.list.reader, f.list.pid)
}

// load returns what the file of reader id holds, reading it again only when it
// changed. nil: the file is gone. Called with b.mu held.
func (b *hintBook) load(id string, de fs.DirEntry) *hintFile {
	fi, err := de.Info()
	if err != nil {
		return nil
	}
	sig := fileSig{size: fi.Size(), mtime: fi.ModTime().UnixNano()}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		sig.ino = st.Ino
	}
	if f := b.files[id]; f != nil && f.sig == sig {
		return f
	}
	f := &hintFile{sig: sig}
	fh, err := os.Open(filepath.Join(b.dir, id+hintExt))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err == nil {
		var data []byte
		data, err = io.ReadAll(io.LimitReader(fh, maxHintFile+1))
		fh.Close()
		if err == nil && len(data) > maxHintFile {
			err = fmt.Errorf("%w: larger than %d bytes", errHintFile, maxHintFile)
		}
		if err == nil {
			f.list, f.life, err = parseHints(data)
		}
	}
	f.err = err
	b.files[id] = f
	return f
}

// liveness is what a reader's lock file says of its process.
type liveness int

const (
	lockHeld    liveness = iota // the process lives
	lockFree                    // it is gone, or there is no lock file
	lockUnknown                 // the lock could not be tried
)

// alive tells whether reader id's process holds its lock file, and when it last
// beat (zero when not known). When the lock is free, release lets go of the lock
// taken to find out: the caller deletes the reader's files first.
func (b *hintBook) alive(id string) (state liveness, beat time.Time, release func()) {
	path := filepath.Join(b.dir, id+lockExt)
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return lockFree, time.Time{}, func() {}
	}
	if err != nil {
		b.warnOnce("lock "+writeCause(err), "cache: reading %s: %v; hints are counted without knowing whether their reader lives", path, err)
		return lockUnknown, time.Time{}, nil
	}
	err = unix.Flock(int(f.Fd()), unix.LOCK_SH|unix.LOCK_NB)
	if err == nil {
		return lockFree, time.Time{}, func() { f.Close() }
	}
	defer f.Close()
	if !errors.Is(err, unix.EWOULDBLOCK) {
		b.warnOnce("flock "+writeCause(err), "cache: locking %s: %v; hints are counted without knowing whether their reader lives", path, err)
		return lockUnknown, time.Time{}, nil
	}
	var st unix.Stat_t
	if unix.Fstat(int(f.Fd()), &st) != nil {
		return lockHeld, time.Time{}, nil
	}
	return lockHeld, time.Unix(st.Mtim.Unix()), nil
}

// removeReader deletes the files of a reader whose process is gone, holding its
// lock (no live process holds it, and its random name is used by no other).
func (b *hintBook) removeReader(id string, r *readerFiles) {
	for _, name := range append([]string{id + hintExt}, r.tmps...) {
		if err := os.Remove(filepath.Join(b.dir, name)); err != nil && !errors.Is(err, os.ErrNotExist) {
			b.warnOnce("remove "+writeCause(err), "cache: %v", err)
		}
	}
	os.Remove(filepath.Join(b.dir, id+lockExt))
}

// ignore logs why reader id's file does not count and counts it in
// Stats.HintsIgnored, once per state of the file (state names it).
func (b *hintBook) ignore(id, state, format string, args ...any) {
	if b.logged[id] == state {
		return
	}
	b.logged[id] = state
	b.c.n.hintsIgnored.Add(1)
	b.c.opts.Logf(format, args...)
}

// warnOnce logs a problem with the directory the first time its key is seen.
func (b *hintBook) warnOnce(key, format string, args ...any) {
	if b.warned[key] {
		return
	}
	b.warned[key] = true
	b.c.opts.Logf(format, args...)
}
