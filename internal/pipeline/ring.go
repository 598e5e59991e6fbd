package pipeline

import (
	"sync"

	"github.com/shardload/shardload/pinned"
)

// A ring a pipeline made is left, when the pipeline closes, for the next pipeline of
// the process made with the same options (the next epoch's loader): making one
// creates, maps, faults in and locks every slab, 20-25 ms for 4 slabs of 6 MiB, and
// unmapping them takes 7 more. At most one ring is left at a time.
var idleRing struct {
	sync.Mutex
	ring *pinned.Ring
	opts pinned.Options
}

// takeRing returns a ring made as opts say: the one a closed pipeline left when it was
// made with the same options, else a new one. A ring left with other options is
// closed first, so that its locked memory no longer counts against the limit.
func takeRing(opts pinned.Options) (*pinned.Ring, error) {
	idleRing.Lock()
	r, ro := idleRing.ring, idleRing.opts
	idleRing.ring = nil
	idleRing.Unlock()
	if r != nil {
		if keepable(opts) && sameRing(ro, opts) {
			return r, nil
		}
		r.Close()
	}
	return pinned.NewRing(opts)
}

// leaveRing leaves r, which a pipeline made from opts and no longer uses, for the next
// pipeline (closing one left before). It closes r instead when a slab is still
// acquired (a batch not released: its memory must not carry another's batches), when
// a slab grew (the next pipeline's memory budget counts slabs of the size asked), or
// when opts bind the slabs to a node (a Bind function cannot be compared).
func leaveRing(r *pinned.Ring, opts pinned.Options) error {
	if !keepable(opts) || r.InUse() > 0 || r.MaxSlabBytes() != r.SlabBytes() {
		return r.Close()
	}
	idleRing.Lock()
	old := idleRing.ring
	idleRing.ring, idleRing.opts = r, opts
	idleRing.Unlock()
	if old != nil {
		return old.Close()
	}
	return nil
}

func keepable(o pinned.Options) bool { return o.Bind == nil }

// sameRing reports whether rings made from a and b are alike (Warn aside: it is
// called while a ring is made).
func sameRing(a, b pinned.Options) bool {
	return a.Slabs == b.Slabs && a.SlabBytes == b.SlabBytes && a.Name == b.Name &&
		a.NoLock == b.NoLock && a.NoHugePages == b.NoHugePages
}
