package index

import (
	"context"
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
// cost: its count, its offsets and its members (shard.Members). A .npy member's type
// and element count come from its header: from the sample's data where the reader
// holds it, or from what Stream read of it where it does not (Scan); a read that
// holds neither records no members for a shard with .npy members.
type Recorder struct {
	offsets []int64
	samples int
	exact   bool // offsets are every sample's
	members shard.MembersBuilder
	lost    bool // a sample failed: its members are unknown
	// heads are the .npy headers Stream read of the members of the sample Next is
	// reading, in head's bytes.
	heads []npyHead
	head  []byte
}

// npyHead is the header of a sample's .npy member, read by Recorder.Stream.
type npyHead struct {
	key, ext   string
	start, end int // in Recorder.head
}

// NewRecorder returns a Recorder of a shard read from its start.
func NewRecorder() *Recorder { return &Recorder{exact: true} }

// Add records one result of Reader.Next: a sample, or an error of one sample alone
// (shard.Error.Skippable), which holds its place in the count but leaves the
// shard's offsets and members unknown.
// A nil Recorder records nothing.
func (c *Recorder) Add(s *shard.Sample, err error) {
	if c == nil {
		return
	}
	c.samples++
	if err != nil || s == nil {
		c.exact, c.offsets = false, nil
		c.lost = true
		c.members.Reset()
	} else {
		if c.exact {
			c.offsets = append(c.offsets, s.Offset)
		}
		if !c.lost {
			c.addMembers(s)
		}
	}
	c.heads, c.head = c.heads[:0], c.head[:0] // the next sample's, if any, are to come
}

// addMembers records the members of s.
func (c *Recorder) addMembers(s *shard.Sample) {
	c.members.Sample()
	for i := range s.Fields {
		f := &s.Fields[i]
		switch {
		case !shard.IsNPY(f.Ext):
			c.members.Member(f.Ext, f.Size)
		case int64(len(f.Data)) == f.Size:
			c.members.MemberHead(f.Ext, f.Size, f.Data)
		default:
			if h, ok := c.headOf(s.Key, f.Ext); ok {
				c.members.MemberHead(f.Ext, f.Size, h)
			} else {
				c.members.Member(f.Ext, f.Size)
			}
		}
	}
}

// headOf returns the header Stream read of the member ext of the sample key.
func (c *Recorder) headOf(key, ext string) ([]byte, bool) {
	for _, h := range c.heads {
		if h.key == key && h.ext == ext {
			return c.head[h.start:h.end], true
		}
	}
	return nil, false
}

// Stream returns what a Reader's Options.Stream (with SizesOnly: headers only,
// skipping data by seeking where the source can) calls for the Recorder to know the
// .npy members of the samples passed to Add: it reads the header of each .npy
// member (shard.ReadNPYHeader: at most shard.MaxNPYHeader bytes, nothing of the
// array) and leaves the rest of every member unread. A nil Recorder's reads nothing.
func (c *Recorder) Stream() func(key string, f shard.Field, data io.Reader) error {
	return func(key string, f shard.Field, data io.Reader) error {
		if c == nil || c.lost || !shard.IsNPY(f.Ext) {
			return nil
		}
		start := len(c.head)
		var err error
		c.head, err = shard.ReadNPYHeader(data, c.head)
		if err != nil {
			return nil // the reader fails on its own error, which it kept
		}
		c.heads = append(c.heads, npyHead{key: key, ext: f.Ext, start: start, end: len(c.head)})
		return nil
	}
}

// Info returns the shard's entry, for an object of that version and size: offsets
// only when r read an uncompressed tar (offsets count bytes of the tar, and a
// compressed shard cannot be entered in the middle); members when every sample's
// are known, whatever the compression (their sizes are those of the members in the
// tar).
func (c *Recorder) Info(url string, r *shard.Reader, version string, size int64) shard.Info {
	info := shard.Info{URL: url, Samples: c.samples, Version: version, Size: size}
	if c.exact && r.Compression() == shard.None {
		info.Offsets = c.offsets
	}
	if !c.lost {
		info.Members = c.members.Members()
	}
	return info
}

// Scan reads the shard at url once, headers only where the source can seek (local
// files) and the headers of .npy members, and returns its entry with version and
// size as given (those of the object the caller stat'ed). A sample that fails alone
// (a duplicate extension) still counts: it holds a place in the epoch.
func Scan(ctx context.Context, src Opener, url, version string, size int64, opts shard.Options) (shard.Info, error) {
	body, err := src.Open(ctx, url)
	if err != nil {
		return shard.Info{URL: url}, err
	}
	defer body.Close()
	rec := NewRecorder()
	opts.URL, opts.SizesOnly, opts.Stream = url, true, rec.Stream()
	r := shard.NewReader(body, opts)
	defer r.Close()
	for {
		s, err := r.Next()
		if err == io.EOF {
			return rec.Info(url, r, version, size), nil
		}
		if err != nil && !shard.SampleOnly(err) {
			return shard.Info{URL: url, Samples: rec.samples}, err
		}
		rec.Add(s, err)
	}
}
