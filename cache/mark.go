package cache

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"os"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// A data file whose every block was checked in the node's current boot carries a
// mark, an extended attribute, so that the processes that read it later in the same
// boot serve it as checked (straight into the caller's buffer, no hash), as a local
// file. The mark lives with the file's inode: a file that replaces it has none. It
// records the boot and the file's size and modification time when it was set, so
// that a reboot, or a write to the file after the mark (which moves its modification
// time), has the blocks checked again. The cache itself never changes a committed
// data file: a hit records its use on the meta file (diskTier.touch).

// markAttr is the extended attribute of the mark.
const markAttr = "user.shardload.checked"

// markLen is the mark's length: the boot's digest (16 bytes), the data file's size
// and its modification time in nanoseconds (8 bytes each, little-endian). Short
// enough for ext4 to keep it in the inode, not in a block of its own.
const markLen = 32

// bootIDPath is where Linux gives the boot's random identifier.
const bootIDPath = "/proc/sys/kernel/random/boot_id"

// bootID returns the digest of the current boot's identifier, read once per
// process; empty when it cannot be read (then no mark is read or set).
var bootID = sync.OnceValue(func() string {
	b, err := os.ReadFile(bootIDPath)
	if err != nil {
		return ""
	}
	return bootDigest(strings.TrimSpace(string(b)))
})

// bootDigest returns the 16 bytes of a boot identifier a mark records; empty for
// an empty identifier.
func bootDigest(id string) string {
	if id == "" {
		return ""
	}
	h := sha256.Sum256([]byte(id))
	return string(h[:16])
}

// markValue returns the mark of a file of size bytes modified at mtime
// (nanoseconds) in the boot boot.
func markValue(boot string, size, mtime int64) []byte {
	v := make([]byte, 0, markLen)
	v = append(v, boot...)
	v = binary.LittleEndian.AppendUint64(v, uint64(size))
	return binary.LittleEndian.AppendUint64(v, uint64(mtime))
}

// fileMark returns the mark fh should carry if it was checked in this boot at its
// present size and modification time.
func fileMark(boot string, fh *os.File) ([]byte, error) {
	var st unix.Stat_t
	if err := unix.Fstat(int(fh.Fd()), &st); err != nil {
		return nil, err
	}
	return markValue(boot, st.Size, st.Mtim.Nano()), nil
}

// marksOn reports whether marks are read and set: the boot is known and the file
// system has not refused extended attributes.
func (d *diskTier) marksOn() bool { return d.boot != "" && !d.noMarks.Load() }

// hasMark reports whether fh, an entry's data file of size bytes, carries the mark
// of this boot at its present size and modification time: every block of it was
// checked in this boot and the file was not written since.
func (d *diskTier) hasMark(fh *os.File, size int64) bool {
	if !d.marksOn() {
		return false
	}
	var got [markLen + 1]byte
	n, err := 0, d.inject("getxattr", fh.Name())
	if err == nil {
		n, err = unix.Fgetxattr(int(fh.Fd()), markAttr, got[:])
	}
	if err != nil {
		d.markFailed("reading", err)
		return false
	}
	want, err := fileMark(d.boot, fh)
	return err == nil && bytes.Equal(got[:n], want) && int64(binary.LittleEndian.Uint64(want[16:])) == size
}

// setMark marks fh, a data file every block of which was just checked.
func (d *diskTier) setMark(fh *os.File) {
	if !d.marksOn() {
		return
	}
	v, err := fileMark(d.boot, fh)
	if err == nil {
		err = d.inject("setxattr", fh.Name())
	}
	if err == nil {
		err = unix.Fsetxattr(int(fh.Fd()), markAttr, v, 0)
	}
	if err != nil {
		d.markFailed("setting", err)
	}
}

// markFailed handles an error reading or setting a mark. A file system without
// extended attributes (tmpfs before Linux 6.6, some network file systems) turns the
// marks off for this process, silently: each process then checks the blocks it
// reads, as without marks. Another error (a read-only directory, a full disk) is
// logged once; an entry without its mark is only checked again.
func (d *diskTier) markFailed(op string, err error) {
	switch {
	case errors.Is(err, unix.ENODATA), errors.Is(err, unix.ERANGE):
		// No mark, or not one of ours.
	case errors.Is(err, unix.ENOTSUP), errors.Is(err, unix.EOPNOTSUPP):
		d.noMarks.Store(true)
	default:
		d.markErr.Do(func() {
			d.logf("cache: %s the mark of a checked entry (extended attribute %s) in %s: %v; entries without it are checked again on their first read in each process (logged once)",
				op, markAttr, d.root, err)
		})
	}
}
