package cache

// The disk tier's entries: file names, meta files, and the index's record of an entry.

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

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

// hintKey is the key hints name the entry's object by: the first 16 hex digits of
// its hash (see hintKey).
func (e *diskEntry) hintKey() uint64 {
	k, _ := strconv.ParseUint(e.name[:16], 16, 64)
	return k
}

func (e *diskEntry) matches(info source.Info) bool {
	return e.meta.Version == info.Version && e.meta.Size == info.Size
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
