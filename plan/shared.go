package plan

import (
	"runtime"
	"sync"
	"weak"

	"github.com/shardload/shardload/shard"
)

// An epoch's order is the same for every rank of a job: the plans of the ranks that
// one process serves (the sessions of a loader process, all of them over one list of
// a dataset's shards) hold one order between them, made by the first, instead of one
// each (12 bytes a shard, 36 with node groups: 12 MB and 36 MB for 10^6 shards). An
// order is kept for others while some plan holds it, by the list of shards it was
// made of and its settings, and taken only when it is the order of the shards'
// counts as they are now: a list whose counts were changed in place since gets an
// order of its own.

// orderKey names an order: the shards it was made of (the list's first entry, and
// how many), its settings and, for a node order, its layout.
type orderKey struct {
	first   weak.Pointer[shard.Info]
	n       int
	cfg     OrderConfig
	world   int
	perNode int
}

// keyOf returns the key of the order of shards under cfg, with the node layout
// world and perNode (0 and 0 for an Order); false for no shards.
func keyOf(shards []shard.Info, cfg OrderConfig, world, perNode int) (orderKey, bool) {
	if len(shards) == 0 {
		return orderKey{}, false
	}
	return orderKey{first: weak.Make(&shards[0]), n: len(shards), cfg: cfg, world: world, perNode: perNode}, true
}

// sharedOrders are the orders of one kind that plans hold, by key.
type sharedOrders[T any] struct {
	mu sync.Mutex
	m  map[orderKey]*orderEntry[T]
}

// orderEntry is an order kept for others: made once ready is closed (v is then
// set, or nothing when it failed).
type orderEntry[T any] struct {
	ready chan struct{}
	v     weak.Pointer[T]
}

var (
	orders     sharedOrders[Order]
	nodeOrders sharedOrders[nodeOrder]
)

// get returns the order under k that fits (the order of the shards' counts as they
// are now), else the one build returns, kept under k until no one holds it. While one
// caller makes the order of a key, the others wait for it.
func (c *sharedOrders[T]) get(k orderKey, fits func(*T) bool, build func() (*T, error)) (*T, error) {
	for {
		c.mu.Lock()
		e := c.m[k]
		if e == nil {
			break // c.mu held
		}
		c.mu.Unlock()
		<-e.ready
		if v := e.v.Value(); v != nil && fits(v) {
			return v, nil
		}
		c.mu.Lock()
		if c.m[k] == e {
			delete(c.m, k) // failed, collected, or of other counts: made again
		}
		c.mu.Unlock()
	}
	if c.m == nil {
		c.m = map[orderKey]*orderEntry[T]{}
	}
	e := &orderEntry[T]{ready: make(chan struct{})}
	c.m[k] = e
	c.mu.Unlock()
	v, err := c.build(e, build)
	if v == nil {
		c.mu.Lock()
		if c.m[k] == e {
			delete(c.m, k)
		}
		c.mu.Unlock()
		return v, err
	}
	runtime.AddCleanup(v, func(k orderKey) {
		c.mu.Lock()
		defer c.mu.Unlock()
		e := c.m[k]
		if e == nil {
			return
		}
		select {
		case <-e.ready:
			if e.v.Value() == nil {
				delete(c.m, k)
			}
		default: // being made again
		}
	}, k)
	return v, err
}

// build runs build for e, and says e is ready when it returns (or panics).
func (c *sharedOrders[T]) build(e *orderEntry[T], build func() (*T, error)) (v *T, err error) {
	defer close(e.ready)
	if v, err = build(); v != nil && err == nil {
		e.v = weak.Make(v)
	} else {
		v = nil
	}
	return v, err
}

// of reports whether o is the order of shards' counts as they are (its shard
// indices cover them, each shard's samples once).
func (o *Order) of(shards []shard.Info) bool {
	if len(o.perm) != len(shards) {
		return false
	}
	for i, s := range o.perm {
		if o.starts[i+1]-o.starts[i] != int64(shards[s].Samples) {
			return false
		}
	}
	return true
}

// of reports whether no is the node order of shards' counts as they are: its groups'
// entries take every shard's samples, no more.
func (no *nodeOrder) of(shards []shard.Info) bool {
	got := make([]int64, len(shards))
	for _, ents := range no.ents {
		for _, e := range ents {
			if e.shard < 0 || e.shard >= len(shards) {
				return false
			}
			got[e.shard] += int64(e.n)
		}
	}
	for i := range shards {
		if got[i] != int64(shards[i].Samples) {
			return false
		}
	}
	return true
}
