package cache

// Bytes by where they came from: the cache's totals (Stats.Served) and one
// reader's (Tally, given to its opens' context with WithTally).

import (
	"context"
	"fmt"
	"sync/atomic"
)

// Bytes are what reads through the cache cost the store and what the cache spared
// it, by where the bytes came from. A reader's Tally counts its own; Stats.Served
// the cache's, all readers together.
type Bytes struct {
	// Memory: served from the memory tier.
	Memory int64 `json:"memory_bytes"`
	// Disk: served from the disk tier (an entry this process committed, or one
	// another process sharing the directory committed).
	Disk int64 `json:"disk_bytes"`
	// Joined: served from a fetch another reader had started and was still
	// reading: the store sent them once, for that reader.
	Joined int64 `json:"joined_bytes"`
	// Store: sent by the store for these reads: the fetches into the cache they
	// started (each byte once, however many of the reads read it; a fetch started
	// in the background after a range read counts for that read), and the reads
	// that went around the cache (not admitted by the policy, no room, the disk
	// tier not writable, a range of an object not cached, the source unreachable
	// to validate).
	Store int64 `json:"store_bytes"`
}

// Total is Store + Cached: the bytes read, a fetch's counted once.
func (b Bytes) Total() int64 { return b.Memory + b.Disk + b.Joined + b.Store }

// Cached is the bytes served without the store sending them for these reads:
// Memory, Disk and Joined.
func (b Bytes) Cached() int64 { return b.Memory + b.Disk + b.Joined }

// HitRate is the share of the bytes read that the store did not send for them,
// Cached / Total; 0 when nothing was read.
func (b Bytes) HitRate() float64 {
	if t := b.Total(); t > 0 {
		return float64(b.Cached()) / float64(t)
	}
	return 0
}

// Sub returns b less a (the counts of an interval, from two readings).
func (b Bytes) Sub(a Bytes) Bytes {
	return Bytes{Memory: b.Memory - a.Memory, Disk: b.Disk - a.Disk, Joined: b.Joined - a.Joined, Store: b.Store - a.Store}
}

// Add returns b plus a.
func (b Bytes) Add(a Bytes) Bytes {
	return Bytes{Memory: b.Memory + a.Memory, Disk: b.Disk + a.Disk, Joined: b.Joined + a.Joined, Store: b.Store + a.Store}
}

// String says the bytes in one line: "1.2 GB read: 0.3 GB from the store, 0.6 GB
// from memory, 0.3 GB from disk (hit rate 75.0%)", with the joined fetches when
// there are any.
func (b Bytes) String() string {
	joined := ""
	if b.Joined > 0 {
		joined = fmt.Sprintf(", %s from fetches of other reads", mb(b.Joined))
	}
	return fmt.Sprintf("%s read: %s from the store, %s from memory, %s from disk%s (hit rate %.1f%%)",
		mb(b.Total()), mb(b.Store), mb(b.Memory), mb(b.Disk), joined, 100*b.HitRate())
}

func mb(n int64) string { return fmt.Sprintf("%.1f MB", float64(n)/1e6) }

// Tally counts the bytes the cache serves to the opens whose context carries it
// (WithTally), by where they came from: a loader's, a session's. It is safe for
// concurrent use; the zero value is ready.
type Tally struct {
	memory, disk, joined, store atomic.Int64
}

// Bytes returns the counts so far.
func (t *Tally) Bytes() Bytes {
	if t == nil {
		return Bytes{}
	}
	return Bytes{Memory: t.memory.Load(), Disk: t.disk.Load(), Joined: t.joined.Load(), Store: t.store.Load()}
}

type tallyKey struct{}

// WithTally returns ctx carrying t: the cache counts in t the bytes it serves to
// the streams of opens made with the context (or one derived from it), as well as
// in its own Stats. A nil t leaves ctx as it is.
func WithTally(ctx context.Context, t *Tally) context.Context {
	if t == nil {
		return ctx
	}
	return context.WithValue(ctx, tallyKey{}, t)
}

// tallyOf returns the Tally ctx carries, nil if none.
func tallyOf(ctx context.Context) *Tally {
	t, _ := ctx.Value(tallyKey{}).(*Tally)
	return t
}

// where says which of a cache's and a tally's counters bytes go to.
type where int

const (
	wMemory where = iota
	wDisk
	wJoined
	wOwn    // read from a fetch of the reader's own: counted when fetched (fill.fetched)
	wBypass // read around the cache: counted in BytesBypassed
)

// served counts n bytes served from w, in the cache's counters and t (if not nil).
func (c *Cache) served(t *Tally, w where, n int64) {
	if n == 0 || w == wOwn {
		return
	}
	switch w {
	case wMemory:
		c.n.bytesMem.Add(n)
	case wDisk:
		c.n.bytesDisk.Add(n)
	case wJoined:
		c.n.bytesJoined.Add(n)
	case wBypass:
		c.n.bytesBypassed.Add(n)
	}
	if t == nil {
		return
	}
	switch w {
	case wMemory:
		t.memory.Add(n)
	case wDisk:
		t.disk.Add(n)
	case wJoined:
		t.joined.Add(n)
	case wBypass:
		t.store.Add(n)
	}
}
