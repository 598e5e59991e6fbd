package cache

// Counting and logging, once per cause, the fetches that could not write the disk tier.

import (
	"errors"
	"os"
	"syscall"

	"github.com/shardload/shardload/source"
)

// cannotWrite counts a fetch that could not write the disk tier and logs why, once
// per cause (the error number: disk full, read-only, permission denied, ...).
func (c *Cache) cannotWrite(url string, err error) {
	c.n.writeErrs.Add(1)
	c.logOnce(writeCause(err), "cache: cannot write the cache: %v; shards are read from their source without caching while this lasts (logged once per cause, counted in Stats.WriteErrors)",
		&source.Error{Op: "caching", URL: url, Err: err})
}

// logOnce logs a warning the first time its key is seen.
func (c *Cache) logOnce(key, format string, args ...any) {
	if _, seen := c.causes.LoadOrStore(key, true); !seen {
		c.opts.Logf(format, args...)
	}
}

// writeCause names what made a write fail, leaving out which file it was.
func writeCause(err error) string {
	var errno syscall.Errno
	if errors.As(err, &errno) {
		return errno.Error()
	}
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Op + ": " + pe.Err.Error()
	}
	return err.Error()
}
