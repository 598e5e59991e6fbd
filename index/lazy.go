package index

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"weak"

	"github.com/shardload/shardload/plan"
	"github.com/shardload/shardload/redact"
	"github.com/shardload/shardload/shard"
)

// deferred is how Lookup.Quick left the offsets of an addressable index unread: the
// index and, per shard Quick returned, its ordinal in the index (-1: nothing to load).
type deferred struct {
	src   rangeOpener
	url   string
	table *addrTable
	ord   map[string]int32 // ordinal by the index's URL, while Quick runs
	pos   []int32
	// entries are the index's, read by Quick, until it takes them (resolve) or
	// indexes their ordinals (ordinals).
	entries []shard.Info
}

// loaded records, by the first element of a slice of shards Quick returned, the
// offsets it left to load; an entry goes when its slice is collected.
var loaded struct {
	sync.Mutex
	m map[weak.Pointer[shard.Info]]*deferred
}

// remember records that the offsets of infos (Quick's result) are left to d.
func remember(infos []shard.Info, d *deferred) {
	if len(infos) == 0 || len(d.pos) != len(infos) {
		return
	}
	k := weak.Make(&infos[0])
	loaded.Lock()
	defer loaded.Unlock()
	if loaded.m == nil {
		loaded.m = map[weak.Pointer[shard.Info]]*deferred{}
	}
	if _, ok := loaded.m[k]; ok {
		return
	}
	loaded.m[k] = d
	runtime.AddCleanup(&infos[0], func(k weak.Pointer[shard.Info]) {
		loaded.Lock()
		delete(loaded.m, k)
		loaded.Unlock()
	}, k)
}

// deferredOf returns what remember recorded for infos, or nil.
func deferredOf(infos []shard.Info) *deferred {
	if len(infos) == 0 {
		return nil
	}
	loaded.Lock()
	defer loaded.Unlock()
	d := loaded.m[weak.Make(&infos[0])]
	if d == nil || len(d.pos) != len(infos) {
		return nil
	}
	return d
}

// Deferred returns the number of shards of infos whose sample offsets Lookup.Quick
// left in the index for Plan to read.
func Deferred(infos []shard.Info) int {
	d := deferredOf(infos)
	if d == nil {
		return 0
	}
	n := 0
	for i, o := range d.pos {
		if o >= 0 && infos[i].Offsets == nil {
			n++
		}
	}
	return n
}

// Plan returns the plan that planFn makes of infos, and the shards it was made from,
// with the sample offsets of the shards the plan reads in part. When infos came from
// Lookup.Quick over an index whose offsets are addressable (WriteAddressable), Quick
// read the counts of every shard and left their offsets in the index: Plan plans from
// the counts alone, reads the offsets of the shards that plan's spans read in part
// (a ranged read per block of them; a shard read whole, every sample from its start,
// needs none: Plan.Whole) and plans again. Offsets join or split a plan's
// spans but change neither its samples nor its shards, so the second plan is the one
// planFn makes of every shard's offsets. infos is not changed: the shards returned
// are a copy, with those offsets in (PlanInPlace writes them into infos instead).
// The members of those shards (an index of format version 2 keeps them in the same
// blocks) come with their offsets; LoadMembers reads those of others. Shards from
// anywhere else are planned once and returned as they are.
func Plan(ctx context.Context, infos []shard.Info, planFn func([]shard.Info) (plan.Plan, error)) ([]shard.Info, plan.Plan, error) {
	return planWith(ctx, infos, planFn, false)
}

// PlanInPlace is Plan for shards that its caller alone holds (a result of
// Lookup.Quick that no other goroutine reads while it runs, and that is not kept for
// other plans before it returns): it writes the offsets it reads into infos itself
// and returns infos, where Plan copies every shard (88 bytes a shard, 88 MB for 10^6,
// for the offsets of a few dozen). When the offsets cannot be read, infos is left
// as it was given. Shards that came with every offset (an index of the earlier
// format, the node's store) keep only those of the shards the plan reads in part;
// they keep their members, which describe the batches of the shards read whole too.
func PlanInPlace(ctx context.Context, infos []shard.Info, planFn func([]shard.Info) (plan.Plan, error)) ([]shard.Info, plan.Plan, error) {
	return planWith(ctx, infos, planFn, true)
}

// PlanShards plans infos with planFn as a loader does, and returns the shards it
// planned from: with shared (shards that others may hold: the sessions of a loader
// process plan from one list of a dataset's shards), as PlanLoaded, infos as they
// are; else as PlanInPlace, planFn given no shard.Loaded.
func PlanShards(ctx context.Context, infos []shard.Info, shared bool, planFn func([]shard.Info, shard.Loaded) (plan.Plan, error)) ([]shard.Info, plan.Plan, error) {
	if shared {
		_, p, err := PlanLoaded(ctx, infos, planFn)
		return infos, p, err
	}
	return PlanInPlace(ctx, infos, func(infos []shard.Info) (plan.Plan, error) { return planFn(infos, nil) })
}

// PlanLoaded is Plan for shards that other holders share read-only (the sessions of
// a loader process, planning from one list of a dataset's shards): it reads the same
// offsets (and members) of the same shards, but copies no shard and writes none of
// infos. The entries of the shards it read them for come back in a shard.Loaded, by
// their positions in infos, which planFn is given with infos to plan from (nil for
// the plan from the counts alone): a plan holds them (plan.Config.Loaded), and its
// readers take a shard's entry from there when it holds one. What it holds is a few
// dozen entries where Plan's copy of infos is 88 bytes a shard. The Loaded is nil
// when it read none (shards from anywhere else than a lazily read index, or that the
// plan reads whole).
func PlanLoaded(ctx context.Context, infos []shard.Info, planFn func([]shard.Info, shard.Loaded) (plan.Plan, error)) (shard.Loaded, plan.Plan, error) {
	p, err := planFn(infos, nil)
	d := deferredOf(infos)
	if err != nil || d == nil {
		return nil, p, err
	}
	want := partOffsets(infos, p, d)
	if len(want) == 0 {
		return nil, p, nil
	}
	// The shards whose offsets are read, copied alone; ords by their place there.
	part := make([]shard.Info, 0, len(want))
	pos := make([]int, 0, len(want))
	ords := make(map[int]int, len(want))
	for i, ord := range want {
		ords[len(part)] = ord
		pos = append(pos, i)
		part = append(part, infos[i])
	}
	err = d.table.offsetsOf(ctx, d.src, d.url, part, ords, 16, loadOffsets|loadMembers)
	for k := range part {
		if err == nil {
			if err = part[k].Check(-1, -1); err != nil {
				err = fmt.Errorf("shardload: index %s: %w; rebuild it (shardload index)", redact.URL(d.url), err)
			}
		}
	}
	if err != nil {
		return nil, p, err
	}
	read := make(shard.Loaded, len(part))
	for k, i := range pos {
		read[i] = part[k]
	}
	p, err = planFn(infos, read)
	return read, p, err
}

// partOffsets returns, by position in infos, the ordinals in d's index of the shards
// whose offsets plan p needs and d left unread: those it reads in part (entered or
// left at a sample, or with samples dropped between runs). A shard read whole needs
// none (the rank holds 8 bytes a sample otherwise: 1 GB for a part of 125 million
// samples), and the offsets change nothing in how it is read, so a plan made again
// with the offsets reads it whole too.
func partOffsets(infos []shard.Info, p plan.Plan, d *deferred) map[int]int {
	want := map[int]int{}
	for i, part := range p.InPart(infos) {
		if part && d.pos[i] >= 0 && infos[i].Offsets == nil {
			want[i] = int(d.pos[i])
		}
	}
	return want
}

// planWith is Plan, or with inPlace PlanInPlace.
func planWith(ctx context.Context, infos []shard.Info, planFn func([]shard.Info) (plan.Plan, error), inPlace bool) ([]shard.Info, plan.Plan, error) {
	p, err := planFn(infos)
	d := deferredOf(infos)
	if err == nil && d == nil && inPlace {
		// Every offset was read (an index of the earlier format, the node's store):
		// the caller's own shards keep those of the shards the plan reads in part.
		keepPartOffsets(infos, p)
	}
	if err != nil || d == nil {
		return infos, p, err
	}
	// The offsets of the shards the plan reads in part (partOffsets).
	want := partOffsets(infos, p, d)
	if len(want) == 0 {
		return infos, p, nil
	}
	out := infos
	if !inPlace {
		out = slices.Clone(infos)
	}
	err = d.table.offsetsOf(ctx, d.src, d.url, out, want, 16, loadOffsets|loadMembers)
	for i := range want {
		if err == nil {
			if err = out[i].Check(-1, -1); err != nil {
				err = fmt.Errorf("shardload: index %s: %w; rebuild it (shardload index)", redact.URL(d.url), err)
			}
		}
	}
	if err != nil {
		if inPlace {
			for i := range want {
				infos[i].Offsets, infos[i].Members = nil, nil
			}
		}
		return infos, p, err
	}
	left := d // the shards' deferred offsets, less those read (none, for a compressed shard)
	if !inPlace {
		left = &deferred{src: d.src, url: d.url, table: d.table, pos: slices.Clone(d.pos)}
	}
	for i := range want {
		left.pos[i] = -1
	}
	remember(out, left)
	p, err = planFn(out)
	return out, p, err
}

// LoadMembers reads the members of the shards of infos at the positions shards (all
// of them when nil) into infos, where Lookup.Quick left them in the index's blocks
// with the offsets (LazyOffsets, an addressable index of format version 2): a
// ranged read per block that holds any of them. It writes into infos, as
// PlanInPlace does: call it on shards that no other goroutine reads meanwhile.
// Shards whose members are known already, and shards an index has none for (of
// format version 1, a compressed shard counted without them, an entry without a
// version), are left as they are; so are shards from anywhere else (an index read
// whole, the node's store), which have every member they have already. Each shard
// whose members it read is checked against its size (shard.Info.Check); when one
// fails, or a block cannot be read, none of those it read keep their members.
func LoadMembers(ctx context.Context, infos []shard.Info, shards []int) error {
	d := deferredOf(infos)
	if d == nil || d.table == nil || !d.table.members {
		return nil
	}
	want := map[int]int{}
	add := func(i int) {
		if i >= 0 && i < len(infos) && d.pos[i] >= 0 && infos[i].Members == nil {
			want[i] = int(d.pos[i])
		}
	}
	if shards == nil {
		for i := range infos {
			add(i)
		}
	}
	for _, i := range shards {
		add(i)
	}
	if len(want) == 0 {
		return nil
	}
	err := d.table.offsetsOf(ctx, d.src, d.url, infos, want, 16, loadMembers)
	for i := range want {
		if err == nil {
			err = infos[i].Check(-1, -1)
		}
	}
	if err != nil {
		for i := range want {
			infos[i].Members = nil
		}
		return fmt.Errorf("shardload: index %s: %w; rebuild it (shardload index)", redact.URL(d.url), err)
	}
	return nil
}

// MembersOf returns the members of the shards of infos at the positions shards, by
// position, where Lookup.Quick left them in an addressable index's blocks (as
// LoadMembers does), without writing into infos: for holders of a list of shards that
// others share. Shards whose members are known already, or that have none, are left
// out.
func MembersOf(ctx context.Context, infos []shard.Info, shards []int) (map[int]*shard.Members, error) {
	d := deferredOf(infos)
	if d == nil || d.table == nil || !d.table.members {
		return nil, nil
	}
	part, pos, ords := []shard.Info{}, []int{}, map[int]int{}
	for _, i := range shards {
		if i >= 0 && i < len(infos) && d.pos[i] >= 0 && infos[i].Members == nil && !slices.Contains(pos, i) {
			ords[len(part)] = int(d.pos[i])
			pos = append(pos, i)
			part = append(part, infos[i])
		}
	}
	if len(part) == 0 {
		return nil, nil
	}
	err := d.table.offsetsOf(ctx, d.src, d.url, part, ords, 16, loadMembers)
	out := make(map[int]*shard.Members, len(part))
	for k, i := range pos {
		if err == nil {
			err = part[k].Check(-1, -1)
		}
		out[i] = part[k].Members
	}
	if err != nil {
		return nil, fmt.Errorf("shardload: index %s: %w; rebuild it (shardload index)", redact.URL(d.url), err)
	}
	return out, nil
}

// readDeferred reads the index at url as read does, but for an addressable one only
// its counts: their offsets are left to d.
func (lk Lookup) readDeferred(ctx context.Context, url string, d *deferred, urls []string) ([]shard.Info, error) {
	body, err := lk.Sources.Open(ctx, url)
	if err != nil {
		return nil, fmt.Errorf("shardload: index: %w", err)
	}
	defer body.Close()
	br := bufio.NewReaderSize(body, 1<<16)
	if !isAddressable(br) {
		infos, err := Read(br, url)
		if err != nil {
			return nil, fmt.Errorf("shardload: %w", err)
		}
		return infos, nil
	}
	infos, t, err := readAddressable(br, url, false, urls)
	if err != nil {
		return nil, fmt.Errorf("shardload: %w", err)
	}
	d.src, d.url, d.table, d.entries = lk.Sources, url, t, infos
	return infos, nil
}

// inOrder reports whether Quick may take the entries of an addressable index it read
// lazily (lk.lazy.entries, which are infos) as they come, without looking them up
// by key: they are the shards of urls in order, under the same spelling, and so many
// that resolve would check none of their objects (more than CheckUpTo, or for local
// files LocalCheckFactor times as many).
func (lk Lookup) inOrder(urls []string, infos []shard.Info) bool {
	d := lk.lazy
	if d == nil || d.table == nil || len(d.entries) != len(infos) || len(infos) != len(urls) {
		return false
	}
	checked, local := 0, false
	for i, u := range urls {
		e := &infos[i]
		if e.URL != u {
			return false
		}
		local = local || isLocal(u)
		if e.Version != "" || e.Size <= 0 {
			checked++
		}
	}
	return checked > lk.CheckUpTo && (!local || checked > LocalCheckFactor*lk.CheckUpTo)
}

// resolve returns the entries of an addressable index read lazily (d.entries) as
// Lookup.resolve does when they are the shards of urls in order, none of them
// checked against its object (inOrder): each under its URL, checked against its own
// size.
func (d *deferred) resolve(urls []string, from string, maxRatio float64) ([]shard.Info, error) {
	infos := d.entries
	d.entries = nil
	d.pos = make([]int32, len(infos))
	for i := range infos {
		e := &infos[i]
		e.URL = urls[i]
		if e.Version == "" {
			// A count without a version: its offsets and members cannot be trusted.
			e.Offsets, e.Members = nil, nil
		}
		if err := errors.Join(e.Check(-1, maxRatio), e.CheckBelow(-1, 0)); err != nil {
			return nil, fmt.Errorf("shardload: index %s: %w; rebuild it (shardload index)", from, err)
		}
		d.pos[i] = -1
		if e.Version != "" && e.Offsets == nil {
			d.pos[i] = int32(i)
		}
	}
	return infos, nil
}

// ordinals indexes the ordinals of an addressable index's entries (d.entries, which
// are infos) by URL, for Lookup.resolve; a nil d or an index read whole has none.
func (d *deferred) ordinals(infos []shard.Info) {
	if d == nil || d.table == nil {
		return
	}
	d.entries = nil
	d.ord = make(map[string]int32, len(infos))
	for i, e := range infos {
		d.ord[e.URL] = int32(i)
	}
}

// ordinal returns the ordinal of the index's shard of URL url; false for a nil d.
func (d *deferred) ordinal(url string) (int32, bool) {
	if d == nil {
		return 0, false
	}
	o, ok := d.ord[url]
	return o, ok
}

// keepPartOffsets drops the sample offsets of the shards of infos that p does not
// read in part (read whole, or not at all): p reads none of them, and a rank would
// hold 8 bytes a sample of the whole dataset otherwise.
func keepPartOffsets(infos []shard.Info, p plan.Plan) {
	for i, part := range p.InPart(infos) {
		if !part {
			infos[i].Offsets = nil
		}
	}
}
