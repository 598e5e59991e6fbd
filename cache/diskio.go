package cache

// Reading and writing the disk tier's files: verified reads, writes through the fault hook.

import (
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/shardload/shardload/source"
)

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
