package index

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"github.com/shardload/shardload/redact"
	"github.com/shardload/shardload/source"
)

// An index object (Lookup.Index, or the one beside the shards) is read by every
// rank of a job as it starts: at 10,000 nodes of 8 ranks, 80,000 reads of one key at
// once. Where the ranks of a node can share a copy, they read it once per node:
//
//   - through the node cache, when the index's scheme is read through one (a
//     source with OpenAt, as cache.Wrap registers): one fetch of the whole object
//     into the cache, which every process sharing the cache's directory joins or
//     waits for, and the counts and blocks read from the cached copy;
//   - otherwise into the Store's directory, DIR/objects/<hash of the URL>-<hash of
//     the version>.idx, fetched by one process at a time under an exclusive flock on
//     DIR/objects/<hash of the URL>.lock (the others wait, then read the copy), and
//     the copies of the object's other versions removed then.
//
// Each rank first learns the object's version and size (a Stat: no body), so a copy
// of another version is never read. With a Store, the ranks of a node that start
// together share that Stat too: one made by a process of the node in the last
// statFresh (DIR/objects/<hash of the URL>.stat, written under the lock) serves the
// others, so that 10,000 nodes of 8 ranks send 10,000 HEADs of the index at the
// start, not 80,000. A local index, an object whose source tells no version, and a
// Lookup with neither a cache nor a Store read the object itself, as before.

// atOpener is a node cache in front of a source (cache.Cache): it opens an object at
// a version already known, fetching it once per node.
type atOpener interface {
	OpenAt(ctx context.Context, info source.Info, off, length int64) (io.ReadCloser, error)
}

// indexSources returns the sources to read the index object at url through:
// lk.Sources, or, where the ranks of a node can share a copy of the object (see
// above), sources that serve url (whole, and its parts, an addressable index's
// blocks) from that copy, and every other URL as lk.Sources does.
func (lk Lookup) indexSources(ctx context.Context, url string) (*source.Registry, error) {
	if isLocal(url) || lk.Sources == nil {
		return lk.Sources, nil
	}
	src, err := lk.Sources.Lookup(url)
	if err != nil {
		return lk.Sources, nil
	}
	at, cached := src.(atOpener)
	if !cached && lk.Store == nil {
		return lk.Sources, nil
	}
	var info source.Info
	if lk.Store != nil {
		info, err = lk.Store.statShared(ctx, lk.Sources, url)
	} else {
		info, err = lk.Sources.Stat(ctx, url)
	}
	switch {
	case errors.Is(err, source.ErrNotFound) || ctx.Err() != nil:
		if err == nil {
			err = ctx.Err()
		}
		return nil, fmt.Errorf("shardload: index: %w", err)
	case err != nil || info.Version == "" || info.Size < 0:
		return lk.Sources, nil // nothing to check a copy against: the object itself
	}
	info.URL = url
	shared := sharedIndex{Source: src, orig: lk.Sources, url: url}
	if cached {
		shared.parts = cachedIndex{at, info}
	} else {
		path, err := lk.Store.objectCopy(ctx, lk.Sources, info)
		if err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			lk.once("index copy", func() {
				lk.Logf("shardload: warning: index %s not kept on the node (%v): every process reads it from its source", redact.URL(url), err)
			})
			return lk.Sources, nil
		}
		shared.parts = nodeCopy{path: path, info: info, src: lk.Sources}
	}
	reg := &source.Registry{}
	for _, scheme := range lk.Sources.Schemes() {
		if s, err := lk.Sources.Lookup(scheme + "://x"); err == nil {
			reg.Register(scheme, s)
		}
	}
	reg.Register(source.Scheme(url), shared)
	return reg, nil
}

// sharedIndex serves the index object url from parts, a node's copy of it, and the
// other objects of url's scheme as orig does.
type sharedIndex struct {
	source.Source
	orig  *source.Registry
	url   string
	parts rangeOpener
}

func (s sharedIndex) Open(ctx context.Context, url string) (io.ReadCloser, error) {
	return s.OpenRange(ctx, url, 0, -1)
}

func (s sharedIndex) OpenRange(ctx context.Context, url string, off, length int64) (io.ReadCloser, error) {
	if url != s.url {
		if off == 0 && length < 0 {
			return s.Source.Open(ctx, url)
		}
		return s.orig.OpenRange(ctx, url, off, length)
	}
	return s.parts.OpenRange(ctx, url, off, length)
}

// cachedIndex reads an index object's parts at one version through a node cache.
type cachedIndex struct {
	at   atOpener
	info source.Info
}

func (o cachedIndex) OpenRange(ctx context.Context, _ string, off, length int64) (io.ReadCloser, error) {
	return o.at.OpenAt(ctx, o.info, off, length)
}

// nodeCopy reads an index object's parts from its copy in a Store, or, when the copy
// went (a later version's replaced it), from the object pinned to the copy's
// version.
type nodeCopy struct {
	path string
	info source.Info
	src  *source.Registry
}

func (c nodeCopy) OpenRange(ctx context.Context, url string, off, length int64) (io.ReadCloser, error) {
	f, err := os.Open(c.path)
	if err != nil {
		return c.src.OpenVersion(ctx, url, c.info.Version, off, length)
	}
	if length < 0 {
		length = max(c.info.Size-off, 0)
	}
	return struct {
		io.Reader
		io.Closer
	}{io.NewSectionReader(f, off, length), f}, nil
}

// objectsDir is the directory of a Store's copies of index objects.
const objectsDir = "objects"

// objectCopy returns the path of a copy of the object info describes (its URL,
// version and size) in the store's directory, fetching it unless the node has one:
// one process at a time, under the object's lock, so that the processes of a node
// fetch it once.
func (s *Store) objectCopy(ctx context.Context, src *source.Registry, info source.Info) (string, error) {
	dir := filepath.Join(s.dir, objectsDir)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", err
	}
	base := hashHex(key(info.URL))
	path := filepath.Join(dir, base+"-"+hashHex(fmt.Sprintf("%s\x00%d", info.Version, info.Size))+".idx")
	if hasSize(path, info.Size) {
		return path, nil
	}
	unlock, err := lockPath(ctx, filepath.Join(dir, base+".lock"))
	if err != nil {
		return "", err
	}
	defer unlock()
	if hasSize(path, info.Size) { // another process fetched it while this one waited
		return path, nil
	}
	// Under the lock nothing else writes this object's files: what is left of an
	// interrupted fetch, and the copies of other versions, go.
	if olds, _ := filepath.Glob(filepath.Join(dir, "tmp-"+base+"-*")); len(olds) > 0 {
		for _, o := range olds {
			os.Remove(o)
		}
	}
	body, err := src.OpenVersion(ctx, info.URL, info.Version, 0, -1)
	if err != nil {
		return "", err
	}
	defer body.Close()
	tmp, err := os.CreateTemp(dir, "tmp-"+base+"-*")
	if err != nil {
		return "", err
	}
	n, err := io.Copy(tmp, body)
	if err == nil && n != info.Size {
		err = fmt.Errorf("%w: read %d bytes of version %s, its size is %d", source.ErrChanged, n, info.Version, info.Size)
	}
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		os.Remove(tmp.Name())
		return "", err
	}
	olds, _ := filepath.Glob(filepath.Join(dir, base+"-*.idx"))
	for _, o := range olds {
		if o != path {
			os.Remove(o) // a reader of it keeps its open file
		}
	}
	return path, nil
}

// statFresh is how long a Stat of an index object made by one process of a node
// serves the node's other processes (statShared): long enough for the ranks of a job
// that start together, short enough that a job started after the index was written
// again sees the new version.
var statFresh = 5 * time.Second

// sharedStat is what statShared records of a Stat.
type sharedStat struct {
	Version string    `json:"version"`
	Size    int64     `json:"size"`
	At      time.Time `json:"at"`
}

// statShared returns the Info of the object at url: from a Stat that a process of
// this node made in the last statFresh, or from a Stat of its own, which it then
// records for the others. One process at a time, under the object's lock; when the
// record cannot be kept (the store's directory not writable), a Stat of its own.
func (s *Store) statShared(ctx context.Context, src *source.Registry, url string) (source.Info, error) {
	dir := filepath.Join(s.dir, objectsDir)
	base := hashHex(key(url))
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return src.Stat(ctx, url)
	}
	unlock, err := lockPath(ctx, filepath.Join(dir, base+".lock"))
	if err != nil {
		if ctx.Err() != nil {
			return source.Info{}, ctx.Err()
		}
		return src.Stat(ctx, url)
	}
	defer unlock()
	path := filepath.Join(dir, base+".stat")
	var rec sharedStat
	if b, err := os.ReadFile(path); err == nil && json.Unmarshal(b, &rec) == nil && rec.Version != "" {
		if age := time.Since(rec.At); age >= 0 && age < statFresh {
			return source.Info{URL: url, Version: rec.Version, Size: rec.Size}, nil
		}
	}
	info, err := src.Stat(ctx, url)
	if err != nil || info.Version == "" {
		os.Remove(path)
		return info, err
	}
	if b, err := json.Marshal(sharedStat{Version: info.Version, Size: info.Size, At: time.Now()}); err == nil {
		tmp := path + ".tmp"
		if os.WriteFile(tmp, b, 0o600) == nil {
			os.Rename(tmp, path)
		}
	}
	return info, nil
}

// hashHex is the first 16 bytes of the SHA-256 of s, in hex.
func hashHex(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:16])
}

// hasSize reports whether the file at path exists with size bytes.
func hasSize(path string, size int64) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode().IsRegular() && fi.Size() == size
}

// lockPath takes an exclusive flock on the file at path (created if needed), waiting
// for another process's to go (polling, so that ctx can end the wait), and returns
// what lets it go. A process that dies lets its lock go.
func lockPath(ctx context.Context, path string) (func(), error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	wait := 2 * time.Millisecond
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			return func() { f.Close() }, nil
		}
		if !errors.Is(err, unix.EWOULDBLOCK) && !errors.Is(err, unix.EINTR) {
			f.Close()
			return nil, fmt.Errorf("locking %s: %w", path, err)
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			f.Close()
			return nil, ctx.Err()
		case <-t.C:
		}
		wait = min(2*wait, 100*time.Millisecond)
	}
}
