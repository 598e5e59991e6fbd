package cache

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/shardload/shardload/source"
)

// A Stat that confirms a cached entry's version serves the opens of the entry that
// follow within Options.ValidateWithin, in this process and in every process of
// the node that shares the directory, as the index package shares one Stat of an
// index object: a node's ranks opening one shard send one HEAD, not one each.
//
// In this process the check's time is kept on the entry (checkedAt, wall-clock
// nanoseconds). For the other processes it is recorded on the entry's meta file,
// in the extended attribute user.shardload.validated: a digest of the version and
// size the Stat found and the time the Stat was sent. The meta file, not the data
// file: the cache never changes a committed data file; an extended attribute changes
// neither file's modification time (the meta file's is the LRU order). A fetch records the Stat
// that preceded it on the meta file before the entry is committed, so the entry
// appears with its check.
//
// A record whose time is in the future (the clock went back since) is stale, as is
// one of another version or size. A file system that keeps no extended attributes
// turns the records off for this process, silently: each process then asks the
// source on its own, once per interval per entry.

// checkAttr is the extended attribute of the record.
const checkAttr = "user.shardload.validated"

// checkLen is the record's length: a digest of the version and size (16 bytes) and
// the time of the check in nanoseconds since 1970 (8 bytes, little-endian).
const checkLen = 24

// versionDigest returns the 16 bytes a record holds of a version of size bytes.
func versionDigest(version string, size int64) []byte {
	h := sha256.Sum256([]byte(version + "\x00" + strconv.FormatInt(size, 10)))
	return h[:16]
}

// checkValue returns the record of a check at at (nanoseconds) that found version
// and size.
func checkValue(version string, size, at int64) []byte {
	v := make([]byte, 0, checkLen)
	v = append(v, versionDigest(version, size)...)
	return binary.LittleEndian.AppendUint64(v, uint64(at))
}

// fresh reports whether a check made at at (nanoseconds, 0: none) still serves at
// now: not older than the interval, and not in the future.
func (c *Cache) fresh(at, now int64) bool {
	w := int64(c.opts.ValidateWithin)
	return w > 0 && at > 0 && at <= now && now-at < w
}

// sharing reports whether checks are shared at all.
func (c *Cache) sharing() bool { return c.opts.ValidateWithin > 0 }

// sharedCheck reports whether a check of the cached entry of key k (cached: its
// version and size) made by this process or another one of the node is recent
// enough to serve an open without a Stat.
func (c *Cache) sharedCheck(k string, cached source.Info) bool {
	if !c.sharing() {
		return false
	}
	now := c.now().UnixNano()
	c.mu.Lock()
	for _, m := range c.mem {
		if e, ok := m.lru.Peek(k); ok && e.matches(cached) && c.fresh(e.checkedAt, now) {
			c.mu.Unlock()
			return true
		}
	}
	var de *diskEntry
	if c.disk != nil {
		if e, ok := c.disk.peek(k); ok && !e.gone && e.matches(cached) {
			de = e
		}
	}
	c.mu.Unlock()
	if de == nil {
		return false
	}
	if c.fresh(de.checkedAt.Load(), now) {
		return true
	}
	at := c.disk.readCheck(de)
	if !c.fresh(at, now) {
		return false
	}
	de.checkedAt.Store(at)
	return true
}

// recordCheck records that a Stat sent at at (nanoseconds) found the cached entry
// of key k at info's version and size: on the entries of this process, and on the
// disk entry's meta file for the node's other processes.
func (c *Cache) recordCheck(k string, info source.Info, at int64) {
	if !c.sharing() {
		return
	}
	c.mu.Lock()
	for _, m := range c.mem {
		if e, ok := m.lru.Peek(k); ok && e.matches(info) {
			e.checkedAt = at
		}
	}
	var de *diskEntry
	if c.disk != nil {
		if e, ok := c.disk.peek(k); ok && !e.gone && e.matches(info) {
			de = e
		}
	}
	c.mu.Unlock()
	if de != nil {
		de.checkedAt.Store(at)
		c.disk.writeCheck(c.disk.metaPath(de.name), info.Version, info.Size, at)
	}
}

// checksOn reports whether records are read and written on meta files.
func (d *diskTier) checksOn() bool { return !d.noChecks.Load() }

// readCheck returns the time of the check recorded on e's meta file, if the
// record is of e's version and size; 0 otherwise.
func (d *diskTier) readCheck(e *diskEntry) int64 {
	if !d.checksOn() {
		return 0
	}
	path := d.metaPath(e.name)
	var got [checkLen + 1]byte
	n, err := 0, d.inject("getxattr", path)
	if err == nil {
		n, err = unix.Getxattr(path, checkAttr, got[:])
	}
	if err != nil {
		d.checkFailed("reading", err)
		return 0
	}
	if n != checkLen || string(got[:16]) != string(versionDigest(e.meta.Version, e.meta.Size)) {
		return 0
	}
	return int64(binary.LittleEndian.Uint64(got[16:checkLen]))
}

// writeCheck records on the meta file at path a check made at at that found
// version and size.
func (d *diskTier) writeCheck(path, version string, size, at int64) {
	if !d.checksOn() {
		return
	}
	err := d.inject("setxattr", path)
	if err == nil {
		err = unix.Setxattr(path, checkAttr, checkValue(version, size, at), 0)
	}
	if err != nil {
		d.checkFailed("writing", err)
	}
}

// checkFailed handles an error reading or writing a record. A file system without
// extended attributes turns the records off for this process, silently; a file
// deleted meanwhile (evicted, replaced by another process) needs none; another
// error is logged once. Without a record the node's other processes ask the source
// themselves.
func (d *diskTier) checkFailed(op string, err error) {
	switch {
	case errors.Is(err, unix.ENODATA), errors.Is(err, unix.ERANGE), errors.Is(err, unix.ENOENT):
	case errors.Is(err, unix.ENOTSUP), errors.Is(err, unix.EOPNOTSUPP):
		d.noChecks.Store(true)
	default:
		d.checkErr.Do(func() {
			d.logf("cache: %s the time of an entry's version check (extended attribute %s) in %s: %v; the node's other processes ask the source themselves (logged once)",
				op, checkAttr, d.root, err)
		})
	}
}
