package cache

// Hints: the reads each reader of the node will make, and when; the eviction policy
// ranks entries by them (see policy.go and hintfile.go).

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"
)

// HintEntry is one read a reader will make: the object at URL, expected at At.
type HintEntry struct {
	URL string
	// At is when the read is expected to start, in nanoseconds of the node's wall
	// clock since the Unix epoch (time.Time.UnixNano), as the reader estimates it
	// from its position in its order and its rate. It must be more than 0.
	At int64
}

// Default values of HintOptions.
const (
	DefaultHintLifetime = 2 * time.Minute
	DefaultHintSlack    = 30 * time.Second
)

// maxHintDuration bounds HintOptions' durations, here and in the files read.
const maxHintDuration = 24 * time.Hour

// maxHintAt bounds HintEntry.At: a time of this century, in unix nanoseconds, with
// room for differences.
const maxHintAt = 1 << 62

// HintOptions configure a reader's Hints. The zero value takes the defaults.
type HintOptions struct {
	// Lifetime is how long a reader's hints count for the other processes of the
	// directory after the reader's last heartbeat. An open Hints beats by itself every
	// Lifetime/4, so this only ends the hints of a process that stopped running
	// (frozen, stopped by a debugger); one that exits loses them at once. Default 2 min
	// (DefaultHintLifetime), at most 24 h.
	Lifetime time.Duration
	// Slack is how late a read may come after its At and still count as announced:
	// a hint counts until At + Slack, so that a reader slower than it estimated does
	// not lose its next shards to eviction. It also tells an admission which hint the
	// read being admitted answers (the one nearest to now within Slack), so that an
	// object's next use is the one after that read. Default 30 s (DefaultHintSlack),
	// at most 24 h.
	Slack time.Duration
	// WriteEvery is the least time between two writes of the reader's file for the
	// directory's other processes: a publish sooner after the last write counts in
	// this process at once and is written when WriteEvery has passed since that
	// write, by the Hints' own goroutine, only the last of several such publishes
	// (Close writes nothing more). It bounds what a reader that publishes often
	// costs the node (a file created and renamed into place, a few hundred
	// microseconds of system time, more on a busy disk) at the price of the other
	// processes seeing its hints up to WriteEvery late. 0: every publish is written
	// at once. At most 24 h.
	WriteEvery time.Duration
}

func (o HintOptions) withDefaults() HintOptions {
	if o.Lifetime <= 0 {
		o.Lifetime = DefaultHintLifetime
	}
	if o.Slack <= 0 {
		o.Slack = DefaultHintSlack
	}
	o.WriteEvery = min(max(o.WriteEvery, 0), maxHintDuration)
	o.Lifetime = min(o.Lifetime, maxHintDuration)
	o.Slack = min(o.Slack, maxHintDuration)
	return o
}

// Hints is one reader's announcement of its next reads to the cache of the node:
// to this process's Cache in memory and, with a disk tier, to every process using
// the directory through a file (see the package documentation). It is safe for
// concurrent use. Close withdraws it.
type Hints struct {
	c      *Cache
	reader string
	opts   HintOptions
	id     string // the name of its files: 16 hex digits, random

	mu     sync.Mutex // serializes Publish and Close
	wmu    sync.Mutex // serializes the files' writes, the heartbeat and their removal; taken after mu, never before
	lock   *os.File   // id.lock, held exclusively while open; nil: not created (yet); guarded by wmu
	closed bool
	stop   chan struct{}
	done   chan struct{}

	list *hintList // the last published; guarded by the book's mu
	st   HintStats // guarded by mu

	// With WriteEvery: when the file was last written, the publish still to write
	// and the timer that writes it. Guarded by mu.
	written time.Time
	pending *hintList
	flush   *time.Timer
	closedW bool // Close has begun: nothing more is written; guarded by wmu
}

// HintStats is what a Hints published (Hints.Stats).
type HintStats struct {
	Publishes int64 // publishes that counted
	Entries   int64 // the entries they held
	// FileBytes is the bytes of the hint files written for the directory's other
	// processes (none with no disk tier, nor for a publish whose file could not be
	// written).
	FileBytes int64
}

// Add adds o to s.
func (s *HintStats) Add(o HintStats) {
	s.Publishes += o.Publishes
	s.Entries += o.Entries
	s.FileBytes += o.FileBytes
}

// Hint returns a new Hints of the reader named reader (a name for log lines: a job,
// a rank; two Hints may have the same one). Its hints count from its first Publish
// until its Close, or until Cache.Close. It fails only on a closed cache; a directory
// whose hints cannot be written is reported by Publish.
func (c *Cache) Hint(reader string, opts HintOptions) (*Hints, error) {
	c.mu.Lock()
	closed := c.closed
	c.mu.Unlock()
	if closed {
		return nil, ErrClosed
	}
	h := &Hints{c: c, reader: reader, opts: opts.withDefaults(), id: newHintID(), stop: make(chan struct{}), done: make(chan struct{})}
	if !c.hints.add(h) {
		return nil, ErrClosed
	}
	if c.hints.dir == "" {
		close(h.done)
		return h, nil
	}
	h.wmu.Lock()
	h.lockFile() // an error is Publish's to report
	h.wmu.Unlock()
	go h.beat()
	return h, nil
}

// Publish replaces the reader's hints with next: every read it will make that it
// knows of, each with its expected time (see HintEntry), usually in the order it
// will make them. A reader publishes its order when an epoch starts (and the next
// epoch's as soon as it is known), and again as it advances, with the reads done
// left out and the times estimated again from its position and rate: at least
// every few minutes, at most about a hundred times an epoch (each publish writes
// about 13 bytes per entry).
//
// The hints count in this process at once. With a disk tier they are written to
// the reader's file for the directory's other processes; when that fails (a full
// disk, a read-only directory), they still count here, the error (wrapping
// ErrUnwritable) is returned and logged once per cause, and the other processes
// evict without them. An entry with At not more than 0 fails the whole publish,
// changing nothing.
func (h *Hints) Publish(next []HintEntry) error {
	return h.publish(next, false)
}

// Announce is Publish, but written for the directory's other processes at once
// whatever HintOptions.WriteEvery (by the Hints' own goroutine, as WriteEvery's
// writes are), a publish held back by it replaced: for the publish that changes
// the order itself (an epoch's open), which they must not see late, where the
// publishes that follow only estimate the times again.
func (h *Hints) Announce(next []HintEntry) error {
	return h.publish(next, true)
}

func (h *Hints) publish(next []HintEntry, now bool) error {
	l := &hintList{reader: h.reader, pid: os.Getpid(), slack: int64(h.opts.Slack), keys: make([]uint64, len(next)), ats: make([]int64, len(next))}
	for i, e := range next {
		if e.At <= 0 || e.At >= maxHintAt {
			return fmt.Errorf("cache: hint of %s at %d: not a time", key(e.URL), e.At)
		}
		l.keys[i], l.ats[i] = hintKey(key(e.URL)), e.At
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return ErrClosed
	}
	h.c.hints.publish(h, l)
	h.st.Publishes++
	h.st.Entries += int64(len(next))
	if h.c.hints.dir == "" {
		return nil
	}
	if w := h.opts.WriteEvery; w > 0 {
		// Written by the timer's goroutine, never by the publisher's: an Announce
		// at once (the timer, if set, fires now; if it has fired, its write takes
		// this list).
		h.pending = l
		wait := max(w-time.Since(h.written), 0)
		if now {
			wait = 0
		}
		switch {
		case h.flush == nil:
			h.flush = time.AfterFunc(wait, h.writePending)
		case now:
			h.flush.Reset(0)
		}
		return nil
	}
	h.wmu.Lock()
	defer h.wmu.Unlock()
	h.written = time.Now()
	n, err := h.write(l)
	h.st.FileBytes += int64(n)
	return h.writeFailed(err)
}

// writePending writes the last publish WriteEvery held back, outside h.mu: a
// Publish meanwhile only waits for the list to be taken.
func (h *Hints) writePending() {
	h.mu.Lock()
	l := h.pending
	h.pending, h.flush = nil, nil
	h.written = time.Now()
	h.mu.Unlock()
	if l == nil {
		return
	}
	h.wmu.Lock()
	if h.closedW {
		h.wmu.Unlock()
		return
	}
	n, err := h.write(l)
	h.wmu.Unlock()
	h.mu.Lock()
	h.st.FileBytes += int64(n)
	h.writeFailed(err) // logged once per cause
	h.mu.Unlock()
}

// writeFailed logs a write's error once per cause and returns it for Publish.
// Called with h.mu held.
func (h *Hints) writeFailed(err error) error {
	if err != nil {
		h.c.logOnce("hints: "+writeCause(err), "cache: cannot write the hints of reader %q: %v; they count in this process only, the directory's other processes evict without them (logged once per cause)",
			h.reader, err)
		return fmt.Errorf("%w: hints of %q: %w", ErrUnwritable, h.reader, err)
	}
	return nil
}

// Stats returns what the reader published so far.
func (h *Hints) Stats() HintStats {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.st
}

// Close withdraws the reader's hints, here and from the directory. It is
// idempotent.
func (h *Hints) Close() error {
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return nil
	}
	h.closed = true
	h.pending = nil
	if h.flush != nil {
		h.flush.Stop()
		h.flush = nil
	}
	close(h.stop)
	h.c.hints.remove(h)
	var err error
	h.wmu.Lock()
	h.closedW = true
	if h.lock != nil {
		dir := h.c.hints.dir
		if rerr := os.Remove(filepath.Join(dir, h.id+hintExt)); rerr != nil && !errors.Is(rerr, os.ErrNotExist) {
			err = rerr
		}
		os.Remove(filepath.Join(dir, h.id+lockExt))
		h.lock.Close()
		h.lock = nil
	}
	h.wmu.Unlock()
	h.mu.Unlock()
	<-h.done
	return err
}

// beat refreshes the reader's heartbeat (its lock file's modification time) every
// Lifetime/4 until Close.
func (h *Hints) beat() {
	defer close(h.done)
	t := time.NewTicker(h.opts.Lifetime / 4)
	defer t.Stop()
	for {
		select {
		case <-h.stop:
			return
		case <-t.C:
		}
		h.wmu.Lock()
		if !h.closedW && h.lock != nil {
			now := time.Now()
			if err := os.Chtimes(h.lock.Name(), now, now); err != nil {
				h.c.logOnce("hints heartbeat: "+writeCause(err), "cache: heartbeat of the hints of reader %q: %v (logged once per cause)", h.reader, err)
			}
		}
		h.wmu.Unlock()
	}
}

// lockFile creates and locks the reader's lock file, if it is not held yet: its
// lock tells the other processes that the reader lives, its modification time when
// it last beat. Called with h.wmu held.
func (h *Hints) lockFile() error {
	if h.lock != nil {
		return nil
	}
	d := h.c.disk
	dir := h.c.hints.dir
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	path := filepath.Join(dir, h.id+lockExt)
	if err := d.inject("create", path); err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return err
	}
	if err := flockEx(f); err != nil {
		f.Close()
		os.Remove(path)
		return err
	}
	h.lock = f
	return nil
}

// write writes l to the reader's file: a temporary file renamed into place, so that
// a process reading the directory finds the last whole file or the one before.
// It returns the bytes of the file, 0 when it was not written. Called with h.wmu held.
func (h *Hints) write(l *hintList) (int, error) {
	if err := h.lockFile(); err != nil {
		return 0, err
	}
	d := h.c.disk
	dir := h.c.hints.dir
	now := time.Now()
	b := encodeHints(l, h.c.now().UnixNano(), int64(h.opts.Lifetime))
	tmp := filepath.Join(dir, "tmp-"+h.id+"-"+newHintID()+hintExt)
	if err := d.inject("create", tmp); err != nil {
		return 0, err
	}
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return 0, err
	}
	if err = d.inject("write", tmp); err == nil {
		_, err = f.Write(b)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = d.rename(tmp, filepath.Join(dir, h.id+hintExt))
	}
	if err != nil {
		os.Remove(tmp)
		return 0, err
	}
	os.Chtimes(h.lock.Name(), now, now) // a publish is a heartbeat
	return len(b), nil
}

// Schedule returns the hints of reading urls in their order, the first at start and
// each next every after the one before: what a reader with shards of about equal
// size publishes from its plan and its measured rate.
func Schedule(urls []string, start time.Time, every time.Duration) []HintEntry {
	out := make([]HintEntry, len(urls))
	t := start.UnixNano()
	for i, u := range urls {
		out[i] = HintEntry{URL: u, At: t + int64(i)*int64(every)}
	}
	return out
}

// hintKey is what hints and entries are matched by: the first 8 bytes of the
// SHA-256 of the object's key, as the disk tier's file names begin (hashURL). Two
// objects of one key could only share a rank, never bytes.
func hintKey(k string) uint64 {
	s := sha256.Sum256([]byte(k))
	return binary.BigEndian.Uint64(s[:8])
}

// hintList is one reader's published hints.
type hintList struct {
	reader string
	pid    int
	slack  int64
	keys   []uint64
	ats    []int64
}

// span is one hint of an object: a read at at, which counts until at+slack.
type span struct{ at, slack int64 }

// hintSet is the hints of the node's live readers merged by object, at one moment.
// It is not changed once built.
type hintSet struct {
	spans   map[uint64][]span
	readers int
}

func mergeHints(lists []*hintList) *hintSet {
	n := 0
	for _, l := range lists {
		n += len(l.keys)
	}
	s := &hintSet{spans: make(map[uint64][]span, n), readers: len(lists)}
	for _, l := range lists {
		for i, k := range l.keys {
			s.spans[k] = append(s.spans[k], span{l.ats[i], l.slack})
		}
	}
	return s
}

// next returns when the object of hint key h is next read by some reader, as seen
// at now: the earliest hint not past (At + Slack not before now), a late one
// counting as now. false: no reader announced a read of it still to come.
func (s *hintSet) next(h uint64, now int64) (int64, bool) {
	return s.earliest(s.spans[h], now, -1)
}

// after is next for an object being read at now: the hint that read answers, the
// one nearest to now within its slack, does not count.
func (s *hintSet) after(h uint64, now int64) (int64, bool) {
	sps := s.spans[h]
	cur, dist := -1, int64(0)
	for i, sp := range sps {
		if sp.at < now-sp.slack || sp.at > now+sp.slack {
			continue
		}
		d := sp.at - now
		if d < 0 {
			d = -d
		}
		if cur < 0 || d < dist {
			cur, dist = i, d
		}
	}
	return s.earliest(sps, now, cur)
}

// earliest returns the earliest of sps, but the one at skip, that is not past at now.
func (s *hintSet) earliest(sps []span, now int64, skip int) (int64, bool) {
	best, ok := int64(0), false
	for i, sp := range sps {
		if i == skip || sp.at < now-sp.slack {
			continue
		}
		t := max(sp.at, now)
		if !ok || t < best {
			best, ok = t, true
		}
	}
	return best, ok
}
