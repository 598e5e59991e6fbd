package pipeline

// Reads straight into slab rows. Where the index gives every sample's member sizes,
// the mixer knows a batch's rows, and so where each raw, text or json value of it will
// lie in its slab, as soon as the windows that hold its positions are made: it takes
// a free slab for the batch ahead of its samples (a reservation, never waiting for
// one), and the producers read those members straight to their places. The batcher
// then collates into that slab and copies only the values that are not in place
// already (wire.InPlace): the keys, the labels, decoded values, and samples read before
// their batch's slab was taken. Whatever the timing, the slab's bytes are those of
// the copying path: a batch whose rows are not as planned (a sample left out, a size
// the index got wrong) has its placed values moved out of the slab first, and
// collated as any other.

import (
	"context"
	"sync"

	"github.com/shardload/shardload/decode"
	"github.com/shardload/shardload/index"
	"github.com/shardload/shardload/pinned"
	"github.com/shardload/shardload/shard"
	"github.com/shardload/shardload/wire"
)

// placeKey names a member of the rank's order: sample n (from 0) of span span, and
// the member's extension.
type placeKey struct {
	span int
	n    int
	ext  string
}

// places are the destinations the mixer published for members not read yet.
type places struct {
	mu sync.Mutex
	m  map[placeKey][]byte
}

// take returns k's destination, and forgets it.
func (ps *places) take(k placeKey) []byte {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	dst, ok := ps.m[k]
	if ok {
		delete(ps.m, k)
	}
	return dst
}

func (ps *places) put(keys []placeKey, dsts [][]byte) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if ps.m == nil {
		ps.m = map[placeKey][]byte{}
	}
	for i, k := range keys {
		ps.m[k] = dsts[i]
	}
}

func (ps *places) drop(keys []placeKey) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	for _, k := range keys {
		delete(ps.m, k)
	}
}

// placeable returns the fields whose values can be read straight into their rows:
// raw, text and json fields not gzipped (their value is the member's bytes), the first
// of each extension; nil when none is, or when Params.SlabReads is not set.
func placeable(p *Params) []int {
	if !p.SlabReads || p.Packed != nil || p.Plan.Estimated {
		return nil
	}
	return placeableFields(p.Fields)
}

func placeableFields(fields []decode.Field) []int {
	var out []int
	seen := map[string]bool{}
	for j := range fields {
		f := &fields[j]
		switch f.Kind {
		case decode.KindRaw, decode.KindText, decode.KindJSON:
		default:
			continue
		}
		if f.Gunzip || seen[f.Ext] || j >= 64 {
			continue
		}
		seen[f.Ext] = true
		out = append(out, j)
	}
	return out
}

// maxMemberSamples is the most samples a rank's plan may read for its shards'
// members' sizes to be read from an addressable index for reads into slab rows (a
// few bytes a sample each): beyond, only those of the shards it reads in part are
// known, and the others' members are copied at collate.
const maxMemberSamples = 16 << 20

// slabMembers returns the members' sizes of the shards e's plan reads that its
// shards lack (an addressable index leaves those of the shards read whole in its
// blocks), when some field may be read into slab rows.
func slabMembers(ctx context.Context, o Options, e Epoch) map[int]*shard.Members {
	if !o.SlabReads || o.Pack.SeqLen > 0 || e.Plan.Estimated || e.Plan.Samples > maxMemberSamples || len(placeableFields(e.Fields)) == 0 {
		return nil
	}
	shards := make([]int, len(e.Plan.Spans))
	for i, sp := range e.Plan.Spans {
		shards[i] = sp.Shard
	}
	m, err := index.MembersOf(ctx, e.Shards, shards)
	if err != nil {
		o.Logf("shardload: the index's member sizes could not be read (%v): every member is copied into its slab", err)
	}
	return m
}

// reservation is a slab taken ahead for batch n (the batcher's count), and the places
// published in it.
type reservation struct {
	n    int
	slab *pinned.Slab
	keys []placeKey
}

// placer takes slabs ahead for the batches whose rows the made windows hold, and
// publishes their places. It runs in the mixer.
type placer struct {
	pl      *Pipeline
	fields  []int // placeable fields
	last    int   // the last field whose column has to be planned
	res     []reservation
	blocked int       // a batch that could not be planned: none from it on is reserved
	wins    []*window // the windows being filled (see)
	ended   bool
	// scratch
	totals  []int64
	offsets []int64
	srcs    []placeKey
	keys    []placeKey
	dsts    [][]byte
}

func newPlacer(pl *Pipeline) *placer {
	fields := placeable(&pl.p)
	if len(fields) == 0 {
		return nil
	}
	n := len(pl.p.Fields)
	return &placer{pl: pl, fields: fields, last: fields[len(fields)-1], blocked: -1,
		totals: make([]int64, n), offsets: make([]int64, n)}
}

// see records the windows being filled: wins, and whether the last of them ends
// the rank's order (no window is left to make).
func (pc *placer) see(wins []*window, ended bool) {
	if pc != nil {
		pc.wins, pc.ended = wins, ended
	}
}

// reserve takes slabs for the batches from the batcher's next on, as far as the
// windows being filled hold their rows, the index gives their sizes, and the ring
// has free slabs. The mixer calls it as windows are made and the batcher after each
// batch.
func (pc *placer) reserve(bat *batcher) {
	if pc == nil || len(pc.wins) == 0 {
		return
	}
	pl := pc.pl
	select {
	case <-pl.ringReady:
	default:
		return
	}
	if pl.ringErr != nil {
		return
	}
	if pc.blocked >= 0 && bat.n > pc.blocked {
		pc.blocked = -1
	}
	bs := pl.p.BatchSize
	last := pc.wins[len(pc.wins)-1]
	end := last.start + len(last.emit)
	for {
		k := max(bat.n, pl.p.Replay)
		if len(pc.res) > 0 {
			k = pc.res[len(pc.res)-1].n + 1
		}
		if k >= pl.p.Plan.Batches || pc.blocked >= 0 && k >= pc.blocked {
			return
		}
		lo, hi := k*bs, (k+1)*bs
		if hi > end {
			if !pc.ended {
				return
			}
			hi = end
		}
		if lo >= hi {
			return
		}
		slab, ok := pl.ring.TryAcquire()
		if !ok {
			return
		}
		if !pc.plan(slab, bat, k, lo, hi) {
			pl.ring.Release(slab)
			pc.blocked = k
			return
		}
		pl.places.put(pc.keys, pc.dsts)
		pc.res = append(pc.res, reservation{n: k, slab: slab, keys: append([]placeKey(nil), pc.keys...)})
	}
}

// plan lays out batch k, the positions [lo, hi), in slab and leaves its places in
// pc.keys and pc.dsts; it reports false when the index does not give the sizes, a
// row already taken was left out, or the placed columns do not fit. The rows the
// batcher holds already (of batch k, its next) count with their values' sizes.
func (pc *placer) plan(slab *pinned.Slab, bat *batcher, k, lo, hi int) bool {
	pl := pc.pl
	fields := pl.p.Fields
	var taken []*item
	if k == bat.n {
		taken = bat.rows
	}
	pc.srcs = pc.srcs[:0]
	for pos := lo + len(taken); pos < hi; pos++ {
		w := windowOf(pc.wins, pos)
		if w == nil || w.srcs == nil {
			return false
		}
		pc.srcs = append(pc.srcs, w.srcs[w.emit[pos-w.start]])
	}
	for j := range pc.totals[:pc.last+1] {
		pc.totals[j] = 0
	}
	for _, it := range taken {
		if isMissing(it) {
			return false
		}
		for j := range pc.last + 1 {
			pc.totals[j] += int64(len(it.values[j].Data))
		}
	}
	for _, src := range pc.srcs {
		sp := pl.p.Plan.Spans[src.span]
		m := pl.members(sp.Shard)
		if m == nil {
			return false
		}
		for j := range pc.last + 1 {
			f := &fields[j]
			if f.RowBytes() >= 0 || pc.totals[j] < 0 {
				continue
			}
			size, ok := m.Size(sp.Skip+src.n, f.Ext)
			if ok && f.Kind == decode.KindNPY {
				size, ok = npyDataBytes(m, sp.Skip+src.n, f)
			}
			if !ok || f.Gunzip {
				pc.totals[j] = -1
				continue
			}
			pc.totals[j] += size
		}
	}
	planned, used := wire.PlanColumns(pc.offsets, fields[:pc.last+1], hi-lo, pc.totals)
	if used > slab.Size() {
		return false
	}
	data := slab.Bytes()
	pc.keys, pc.dsts = pc.keys[:0], pc.dsts[:0]
	for _, j := range pc.fields {
		if j >= planned {
			break
		}
		f := &fields[j]
		o := pc.offsets[j]
		for _, it := range taken {
			o += int64(len(it.values[j].Data))
		}
		for _, src := range pc.srcs {
			sp := pl.p.Plan.Spans[src.span]
			size, _ := pl.members(sp.Shard).Size(sp.Skip+src.n, f.Ext)
			if size > 0 {
				pc.keys = append(pc.keys, placeKey{span: src.span, n: src.n, ext: f.Ext})
				pc.dsts = append(pc.dsts, data[o:o+size:o+size])
			}
			o += size
		}
	}
	return len(pc.keys) > 0
}

// members returns the members of shard i of the plan, or nil.
func (pl *Pipeline) members(i int) *shard.Members {
	if m := pl.p.Members[i]; m != nil {
		return m
	}
	return pl.p.Plan.Loaded().At(pl.p.Shards, i).Members
}

// npyDataBytes returns the bytes of array data of sample's .npy member of f's
// extension, when the index knows its element type and count.
func npyDataBytes(m *shard.Members, sample int, f *decode.Field) (int64, bool) {
	items, ok := m.Items(sample, f.Ext)
	if !ok {
		return 0, false
	}
	size, ok := shard.NPYItemSize(m.DType(f.Ext))
	return items * int64(size), ok
}

// windowOf returns the made window that holds position pos of the rank's order.
func windowOf(wins []*window, pos int) *window {
	for _, w := range wins {
		if pos >= w.start && pos < w.start+len(w.emit) {
			return w
		}
	}
	return nil
}

// take returns the slab reserved for batch n, if any, and forgets the places left
// in it: every sample of the batch has been read by then.
func (pc *placer) take(n int) *pinned.Slab {
	if pc == nil || len(pc.res) == 0 || pc.res[0].n != n {
		return nil
	}
	r := pc.res[0]
	pc.res = pc.res[1:]
	pc.pl.places.drop(r.keys)
	return r.slab
}

// release hands the slabs still reserved back; the producers must be done.
func (pc *placer) release() {
	if pc == nil {
		return
	}
	for _, r := range pc.res {
		pc.pl.places.drop(r.keys)
		pc.pl.ring.Release(r.slab)
	}
	pc.res = nil
}

// detach moves the values of items that were read straight into a slab to memory
// of their own: for a batch whose rows are not as planned, or rows that pad a batch
// after their own slab went to the consumer.
func detach(items []*item) {
	for _, it := range items {
		if it == missing || it.placed == 0 {
			continue
		}
		for j := range it.values {
			if j < 64 && it.placed&(1<<j) != 0 {
				it.values[j].Data = append([]byte(nil), it.values[j].Data...)
			}
		}
		it.placed = 0
	}
}
