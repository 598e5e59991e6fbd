package index

import (
	"context"
	"errors"
	"io"

	"github.com/shardload/shardload/shard"
)

// Opener opens an object by URL (a *source.Registry).
type Opener interface {
	Open(ctx context.Context, url string) (io.ReadCloser, error)
}

// Recorder collects the entry of a shard while a reader goes through it: pass each
// result of Reader.Next to Add, then take Info once Next returned io.EOF. It is how
// every full read of a shard (an epoch, ls, cat) records the shard's entry at no extra
// cost.
type Recorder struct {
	offsets []int64
	samples int
	exact   bool // offsets are every sample's
}

// NewRecorder returns a Recorder of a shard read from its start.
func NewRecorder() *Recorder { return &Recorder{exact: true} }

// Add records one result of Reader.Next: a sample, or an error of one sample alone
// (shard.Error.Skippable), which holds its place in the count but leaves the
// shard's offsets unknown.
// A nil Recorder records nothing.
func (c *Recorder) Add(s *shard.Sample, err error) {
	if c == nil {
		return
	}
	c.samples++
	if err != nil || s == nil {
		c.exact, c.offsets = false, nil
		return
	}
	if c.exact {
		c.offsets = append(c.offsets, s.Offset)
	}
}

// Info returns the shard's entry, for an object of that version and size: offsets
// only when r read an uncompressed tar (offsets count bytes of the tar, and a
// compressed shard cannot be entered in the middle).
func (c *Recorder) Info(url string, r *shard.Reader, version string, size int64) shard.Info {
	info := shard.Info{URL: url, Samples: c.samples, Version: version, Size: size}
	if c.exact && r.Compression() == shard.None {
		info.Offsets = c.offsets
	}
	return info
}

// Scan reads the shard at url once, headers only where the source can seek (local
// files), and returns its entry with version and size as given (those of the object
// the caller stat'ed). A sample that fails alone (a duplicate extension) still counts:
// it holds a place in the epoch.
func Scan(ctx context.Context, src Opener, url, version string, size int64, opts shard.Options) (shard.Info, error) {
	body, err := src.Open(ctx, url)
	if err != nil {
		return shard.Info{URL: url}, err
	}
	defer body.Close()
	opts.URL, opts.SizesOnly = url, true
	r := shard.NewReader(body, opts)
	defer r.Close()
	rec := NewRecorder()
	for {
		s, err := r.Next()
		if err == io.EOF {
			return rec.Info(url, r, version, size), nil
		}
		var se *shard.Error
		if err != nil && !(errors.As(err, &se) && se.Skippable()) {
			return shard.Info{URL: url, Samples: rec.samples}, err
		}
		rec.Add(s, err)
	}
}
