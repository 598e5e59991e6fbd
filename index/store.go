package index

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/shardload/shardload/shard"
)

// Store is a node's local store of index entries, keyed by the shard's URL without
// secrets and valid for one version of its object. Nothing in it is trusted beyond
// what Read checks: an entry that does not parse, or is for another URL or version,
// is a miss.
//
// # Layout
//
// The entries of the shards of one directory (a dataset: "s3://b/train/" for
// "s3://b/train/train-000123.tar") are kept together in a few segment files, each an
// index in the format of Write, under DIR/v2/<hash of the directory>/. A segment's
// name says when it was written and how many entries it holds:
// "<nanoseconds, 16 hex digits>.<entries>.<random>.idx"; the entries of a later
// segment replace those of an earlier one. Writing an entry, or many, adds a
// segment; then, whenever a segment holds no more entries than all the segments
// written after it together, those are merged into one, so that each segment holds
// more entries than all later ones together: a directory of n shards has at most
// about log2(n) segments, each entry is rewritten O(log n) times however its
// entries came (one by one or all at once), and the store of 100,000 shards is a
// few files of a few MB (zstd) rather than a file of a 4 KiB block per shard.
//
// Every process on a node may use the store at once: a segment is written to a
// temporary file and renamed into place (synced first when it holds many entries),
// so a reader sees a whole segment or none, and a segment whose entries are fewer
// than its name says (cut short by a crash) is ignored. A merge removes its inputs
// only after its output is in place; a reader that finds a segment gone lists
// again; two processes merging at once write the same entries twice, which the next
// merge folds.
//
// The store of earlier releases (a file per shard and per object identity, and sets
// of a whole list of URLs, in DIR/xx/ and DIR/sets/) is still read when present, and
// what is found there is written in the new layout.
type Store struct {
	dir string

	legacyOnce sync.Once
	legacy     bool // the directory holds a store of the layout of earlier releases
}

// StoreDirEnv names the environment variable that sets DefaultStoreDir.
const StoreDirEnv = "SHARDLOAD_INDEX_DIR"

// DefaultStoreDir returns the node's store directory: $SHARDLOAD_INDEX_DIR, else
// "shardload/index" in the user's cache directory ($XDG_CACHE_HOME, ~/.cache), else
// "" (none).
func DefaultStoreDir() string {
	if d := os.Getenv(StoreDirEnv); d != "" {
		return d
	}
	if d, err := os.UserCacheDir(); err == nil {
		return filepath.Join(d, "shardload", "index")
	}
	return ""
}

// OpenStore opens the store in dir, creating it (0700) if needed.
func OpenStore(dir string) (*Store, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("index: store: %w", err)
	}
	return &Store{dir: dir}, nil
}

// Dir returns the store's directory.
func (s *Store) Dir() string { return s.dir }

// segmentsDir is the directory of the segments of the shards of directory dir (a
// key's dirOf).
func (s *Store) segmentsDir(dir string) string {
	sum := sha256.Sum256([]byte(dir))
	return filepath.Join(s.dir, "v2", hex.EncodeToString(sum[:12]))
}

// syncAtLeast is the fewest entries of a segment that is synced before it is renamed
// into place; a smaller one cut short by a crash is ignored all the same.
const syncAtLeast = 64

// compressAtLeast is the fewest entries of a segment written zstd-compressed: an
// encoder costs more than a few lines are worth.
const compressAtLeast = 64

// segment is one segment file of a directory's entries.
type segment struct {
	name    string
	seq     uint64 // when it was written (nanoseconds); order of precedence
	entries int
}

// parseSegment parses a segment's file name; ok is false for other files (temporary
// ones).
func parseSegment(name string) (segment, bool) {
	rest, ok := strings.CutSuffix(name, ".idx")
	if !ok {
		return segment{}, false
	}
	parts := strings.Split(rest, ".")
	if len(parts) != 3 || len(parts[0]) != 16 {
		return segment{}, false
	}
	seq, err1 := strconv.ParseUint(parts[0], 16, 64)
	n, err2 := strconv.Atoi(parts[1])
	if err1 != nil || err2 != nil || n < 0 {
		return segment{}, false
	}
	return segment{name: name, seq: seq, entries: n}, true
}

// segments returns the segments of the directory at d, in order of precedence
// (earliest first).
func segments(d string) ([]segment, error) {
	des, err := os.ReadDir(d)
	if err != nil {
		return nil, err
	}
	var out []segment
	for _, de := range des {
		if sg, ok := parseSegment(de.Name()); ok {
			out = append(out, sg)
		}
	}
	slices.SortFunc(out, func(a, b segment) int {
		if a.seq != b.seq {
			return cmpUint(a.seq, b.seq)
		}
		return strings.Compare(a.name, b.name)
	})
	return out, nil
}

func cmpUint(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// readSegment reads the entries of segment sg in d; a segment whose entries are not
// as many as its name says is an error (ErrFormat).
func readSegment(d string, sg segment) ([]shard.Info, error) {
	f, err := os.Open(filepath.Join(d, sg.name))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	infos, err := Read(f, f.Name())
	if err != nil {
		return nil, err
	}
	if len(infos) != sg.entries {
		return nil, fmt.Errorf("%w: %s: %d entries, its name says %d", ErrFormat, f.Name(), len(infos), sg.entries)
	}
	return infos, nil
}

// load returns the entries of the shards of directory dir, by key, the later
// segments' replacing the earlier's. A segment removed while it is read (merged by
// another process) makes it list again; one that does not parse is skipped.
func (s *Store) load(dir string) map[string]shard.Info {
	d := s.segmentsDir(dir)
	for try := 0; ; try++ {
		segs, err := segments(d)
		if err != nil {
			return map[string]shard.Info{}
		}
		out := make(map[string]shard.Info, total(segs))
		gone := false
		for _, sg := range segs {
			infos, err := readSegment(d, sg)
			if errors.Is(err, fs.ErrNotExist) {
				gone = true
				break
			}
			if err != nil {
				continue
			}
			for _, in := range infos {
				if in.Version != "" {
					out[in.URL] = in
				}
			}
		}
		if !gone || try >= 4 {
			return out
		}
	}
}

func total(segs []segment) int {
	n := 0
	for _, sg := range segs {
		n += sg.entries
	}
	return n
}

// PutMany stores infos, replacing the shards' previous entries: a segment per
// directory of shards. Entries without a version cannot be checked against their
// objects later and are not stored.
func (s *Store) PutMany(infos []shard.Info) error {
	byDir := map[string][]shard.Info{}
	var dirs []string
	for _, in := range infos {
		if in.Version == "" {
			continue
		}
		in.URL = key(in.URL)
		d := dirOf(in.URL)
		if _, ok := byDir[d]; !ok {
			dirs = append(dirs, d)
		}
		byDir[d] = append(byDir[d], in)
	}
	var first error
	for _, d := range dirs {
		if err := s.add(d, byDir[d]); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// Put stores info, replacing the shard's previous entry (see PutMany).
func (s *Store) Put(info shard.Info) error { return s.PutMany([]shard.Info{info}) }

// add writes entries (of directory dir, keyed) as a new segment, and merges.
func (s *Store) add(dir string, entries []shard.Info) error {
	d := s.segmentsDir(dir)
	if err := os.MkdirAll(d, 0o700); err != nil {
		return fmt.Errorf("index: store: %w", err)
	}
	seq := uint64(time.Now().UnixNano())
	if err := writeSegment(d, seq, entries); err != nil {
		return err
	}
	return s.merge(d)
}

// writeSegment writes entries as the segment of seq in d, through a temporary file.
func writeSegment(d string, seq uint64, entries []shard.Info) error {
	var rnd [4]byte
	rand.Read(rnd[:])
	name := fmt.Sprintf("%016x.%d.%s.idx", seq, len(entries), hex.EncodeToString(rnd[:]))
	return replace(filepath.Join(d, name), len(entries) >= syncAtLeast, func(w io.Writer) error {
		return Write(w, entries, len(entries) >= compressAtLeast)
	})
}

// merge merges the latest segments of d while one holds no more entries than all
// those after it together (see Store). An input that cannot be read leaves them
// as they are.
func (s *Store) merge(d string) error {
	segs, err := segments(d)
	if err != nil {
		return fmt.Errorf("index: store: %w", err)
	}
	// The earliest segment that holds no more than all later ones together.
	j := -1
	after := 0
	for i := len(segs) - 1; i >= 0; i-- {
		if i < len(segs)-1 && segs[i].entries <= after {
			j = i
		}
		after += segs[i].entries
	}
	if j < 0 {
		return nil
	}
	in := segs[j:]
	merged := map[string]shard.Info{}
	for _, sg := range in {
		infos, err := readSegment(d, sg)
		if errors.Is(err, fs.ErrNotExist) {
			return nil // merged by another process meanwhile
		}
		if err != nil {
			continue // dropped: what does not parse is a miss anyway
		}
		for _, e := range infos {
			merged[e.URL] = e
		}
	}
	keys := make([]string, 0, len(merged))
	for k := range merged {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	entries := make([]shard.Info, len(keys))
	for i, k := range keys {
		entries[i] = merged[k]
	}
	// The merged segment takes the place of the latest of its inputs: after every
	// segment it merged, before any written since.
	if err := writeSegment(d, in[len(in)-1].seq, entries); err != nil {
		return err
	}
	for _, sg := range in {
		os.Remove(filepath.Join(d, sg.name))
	}
	return nil
}

// replace writes the file at p through a temporary file beside it, synced first when
// sync is set, renamed into place: a reader sees the old file or the whole new one.
func replace(p string, sync bool, write func(io.Writer) error) error {
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		return fmt.Errorf("index: store: %w", err)
	}
	f, err := os.CreateTemp(filepath.Dir(p), ".tmp-*")
	if err != nil {
		return fmt.Errorf("index: store: %w", err)
	}
	err = write(f)
	if err == nil && sync {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), p)
	}
	if err != nil {
		os.Remove(f.Name())
		return fmt.Errorf("index: store: %w", err)
	}
	return nil
}

// GetMany returns the store's entries of urls, by key (see Store), for whichever
// version of each object they were taken from (compare Version with the object's):
// one read of a few files per directory of shards.
func (s *Store) GetMany(urls []string) map[string]shard.Info {
	byDir := map[string][]string{}
	for _, k := range keysOf(urls) {
		byDir[dirOf(k)] = append(byDir[dirOf(k)], k)
	}
	out := make(map[string]shard.Info, len(urls))
	for d, keys := range byDir {
		entries := s.load(d)
		for _, k := range keys {
			if e, ok := entries[k]; ok {
				out[k] = e
			}
		}
	}
	if s.hasLegacy() && len(out) < len(urls) {
		s.getLegacy(urls, out)
	}
	return out
}

// Get returns the store's entry of url, for whichever version of the object it was
// taken from (compare Version with the object's).
func (s *Store) Get(url string) (shard.Info, bool) {
	e, ok := s.GetMany([]string{url})[key(url)]
	if ok {
		e.URL = url
	}
	return e, ok
}

// GetSet returns the entries of exactly urls, in order, when the store has every
// one of them.
func (s *Store) GetSet(urls []string) ([]shard.Info, bool) {
	got := s.GetMany(urls)
	infos := make([]shard.Info, len(urls))
	keys := keysOf(urls)
	for i, u := range urls {
		e, ok := got[keys[i]]
		if !ok {
			return nil, false
		}
		e.URL = u
		infos[i] = e
	}
	return infos, true
}

// PutSet stores the entries of a whole list of URLs (PutMany).
func (s *Store) PutSet(infos []shard.Info) error { return s.PutMany(infos) }

// GetIdentity returns the entry of the object named url (by its base name) at version
// and size, stored under whichever URL it was counted: the entry of a dataset that
// moved. Its URL is url.
func (s *Store) GetIdentity(url, version string, size int64) (shard.Info, bool) {
	id := identity(url, version, size)
	if id == "" {
		return shard.Info{}, false
	}
	e, ok := s.Identities(map[string]bool{id: true})[id]
	if ok {
		e.URL = url
	}
	return e, ok
}

// Identities returns the store's entries of the object identities in want (see
// identity), by identity, looking through every directory's segments until each is
// found with sample offsets. Of the entries of one identity (the same object counted
// under several URLs), one with offsets is taken over one without: a copy's entry
// kept without them (as earlier releases kept a loader's, whose offsets it left in
// an index) would otherwise make the next copy's index one without offsets.
func (s *Store) Identities(want map[string]bool) map[string]shard.Info {
	out := map[string]shard.Info{}
	withOffsets := 0
	des, _ := os.ReadDir(filepath.Join(s.dir, "v2"))
	for _, de := range des {
		if withOffsets == len(want) {
			break
		}
		d := filepath.Join(s.dir, "v2", de.Name())
		segs, err := segments(d)
		if err != nil {
			continue
		}
		for _, sg := range segs {
			infos, err := readSegment(d, sg)
			if err != nil {
				continue
			}
			for _, e := range infos {
				id := identity(e.URL, e.Version, e.Size)
				if id == "" || e.Size <= 0 || !want[id] {
					continue
				}
				if prev, ok := out[id]; ok && len(prev.Offsets) > 0 {
					continue
				}
				out[id] = e
				if len(e.Offsets) > 0 {
					withOffsets++
				}
			}
		}
	}
	if s.hasLegacy() {
		for id := range want {
			if _, ok := out[id]; ok {
				continue
			}
			if e, ok := s.legacyIdentity(id); ok {
				out[id] = e
			}
		}
	}
	return out
}

// shared holds the stores Shared opened, by directory.
var shared sync.Map // string -> *Store

// Shared returns the store in dir (DefaultStoreDir when ""), opened once per process;
// nil and no error when there is no directory to use.
func Shared(dir string) (*Store, error) {
	if dir == "" {
		dir = DefaultStoreDir()
	}
	if dir == "" {
		return nil, nil
	}
	if s, ok := shared.Load(dir); ok {
		return s.(*Store), nil
	}
	s, err := OpenStore(dir)
	if err != nil {
		return nil, err
	}
	got, _ := shared.LoadOrStore(dir, s)
	return got.(*Store), nil
}

// Keep returns what a loader calls with the true entry of each shard of infos whose
// count was estimated, once it read the shard whole: it keeps the entries (PutMany)
// a batch at a time, so that the next run on the node counts none of them again.
// A batch is written once it holds an eighth of the entries written before it (the
// first ones one by one) or keepBatch, once keepDelay passed since the last write
// (at the next entry), and when the last estimated shard of infos is in; what a
// process leaves unwritten when it stops (at most about an eighth of what it wrote,
// or keepBatch) is counted again by a later run. A failure to write is said once
// through logf. The returned function is safe for concurrent use; nil for a nil
// Store.
func (s *Store) Keep(infos []shard.Info, logf func(string, ...any)) func(shard.Info) {
	if s == nil {
		return nil
	}
	var once sync.Once
	var mu sync.Mutex
	left := 0
	for _, in := range infos {
		if in.Estimated {
			left++
		}
	}
	var pending []shard.Info
	written := 0
	last := time.Now()
	return func(info shard.Info) {
		mu.Lock()
		defer mu.Unlock()
		pending = append(pending, info)
		left--
		batch := min(keepBatch, max(1, written/8))
		if left > 0 && len(pending) < batch && time.Since(last) < keepDelay {
			return
		}
		if err := s.PutMany(pending); err != nil {
			once.Do(func() { logf("shardload: warning: %v (entries are not kept for the next run)", err) })
		}
		written += len(pending)
		pending, last = nil, time.Now()
	}
}

// keepBatch and keepDelay bound the entries Keep holds before it writes them.
const (
	keepBatch = 256
	keepDelay = time.Second
)

// The layout of earlier releases, read only.

// hasLegacy reports whether the store's directory holds entries of the layout of
// earlier releases (a directory of two hex digits, or "sets").
func (s *Store) hasLegacy() bool {
	s.legacyOnce.Do(func() {
		des, _ := os.ReadDir(s.dir)
		for _, de := range des {
			n := de.Name()
			if de.IsDir() && (n == "sets" || len(n) == 2 && isHex(n)) {
				s.legacy = true
				return
			}
		}
	})
	return s.legacy
}

func isHex(s string) bool {
	_, err := hex.DecodeString(s)
	return err == nil
}

// legacyFile is the file of name in the layout of earlier releases.
func (s *Store) legacyFile(name string) string {
	sum := sha256.Sum256([]byte(name))
	h := hex.EncodeToString(sum[:16])
	return filepath.Join(s.dir, h[:2], h+".json")
}

// legacySet is the file of the entries of a whole list of URLs in the layout of
// earlier releases.
func (s *Store) legacySet(urls []string) string {
	h := sha256.New()
	for _, k := range keysOf(urls) {
		h.Write([]byte(k))
		h.Write([]byte{0})
	}
	return filepath.Join(s.dir, "sets", hex.EncodeToString(h.Sum(nil)[:16])+".index")
}

// readLegacy reads one entry file of the layout of earlier releases.
func readLegacy(p string) (shard.Info, bool) {
	b, err := os.ReadFile(p)
	if err != nil {
		return shard.Info{}, false
	}
	infos, err := Read(bytes.NewReader(b), p)
	if err != nil || len(infos) != 1 || infos[0].Version == "" {
		return shard.Info{}, false
	}
	return infos[0], true
}

// getLegacy adds to out (by key) the entries of urls that the layout of earlier
// releases holds and out lacks, and writes those it found in the new layout. A
// store that has none of the first few shards is taken to have none: a look for
// each of many shards costs a file system call each.
func (s *Store) getLegacy(urls []string, out map[string]shard.Info) {
	var found []shard.Info
	if f, err := os.Open(s.legacySet(urls)); err == nil {
		infos, err := Read(f, f.Name())
		f.Close()
		if err == nil && len(infos) == len(urls) {
			for i, u := range urls {
				if k := key(u); infos[i].URL == k && infos[i].Version != "" {
					if _, ok := out[k]; !ok {
						out[k] = infos[i]
						found = append(found, infos[i])
					}
				}
			}
		}
	}
	const probe = 16
	var missing []string
	for _, u := range urls {
		if _, ok := out[key(u)]; !ok {
			missing = append(missing, key(u))
		}
	}
	if len(missing) > 4*probe {
		hit := false
		for _, k := range missing[:probe] {
			if _, ok := readLegacy(s.legacyFile(k)); ok {
				hit = true
				break
			}
		}
		if !hit {
			missing = nil
		}
	}
	for _, k := range missing {
		if e, ok := readLegacy(s.legacyFile(k)); ok && e.URL == k {
			out[k] = e
			found = append(found, e)
		}
	}
	if len(found) > 0 {
		s.PutMany(found) // a miss next time costs a count; nothing to report
	}
}

// legacyIdentity returns the entry of identity id in the layout of earlier releases.
func (s *Store) legacyIdentity(id string) (shard.Info, bool) {
	e, ok := readLegacy(s.legacyFile("identity\x00" + id))
	if !ok || identity(e.URL, e.Version, e.Size) != id {
		return shard.Info{}, false
	}
	return e, true
}
