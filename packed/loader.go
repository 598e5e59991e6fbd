package packed

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log"
	"math"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/shardload/shardload/pack"
	"github.com/shardload/shardload/plan"
	"github.com/shardload/shardload/shard"
	"github.com/shardload/shardload/source"
)

// Defaults of Config's zero fields.
const (
	DefaultBatchSize     = 8
	DefaultOpenShards    = 8
	DefaultShuffleBuffer = 1000
	DefaultReadAhead     = 4
	DefaultReadGap       = 1 << 20
	DefaultMemory        = 1 << 30
)

// ErrResume means a State does not resume this loader's epoch: another dataset,
// seed, shuffle or packing, or another epoch.
var ErrResume = errors.New("packed: cannot resume")

// ErrClosed is what Next returns after Close.
var ErrClosed = errors.New("packed: loader closed")

// Config configures a Loader.
type Config struct {
	// URLs are tar shards (patterns as shardload's, listed prefixes), or Megatron
	// datasets: URLs ending in .idx, each naming X.idx and X.bin.
	URLs []string
	// Shards, instead of URLs, are tar shards with their index entries (counts,
	// offsets and member sizes), as shardload.Count or the index give them.
	Shards []shard.Info
	// Index is the tar shards' index file or URL; "" looks beside the shards and in
	// the node's store (index.Lookup).
	Index string
	// Pack is the packed field, the row length and the eos and pad ids.
	Pack pack.Spec
	// BatchSize is the rows of a batch (DefaultBatchSize).
	BatchSize int
	// Rank and World: this rank of a job of World ranks (World 0 is 1).
	Rank, World int
	// Seed and Epoch seed the order; NoShuffle reads the documents as given.
	Seed      uint64
	Epoch     int
	NoShuffle bool
	// OpenShards is the order's lanes (shards read side by side) and ShuffleBuffer
	// the documents the order permutes as a whole, twice its windows'.
	OpenShards, ShuffleBuffer int
	// Int32 writes input_ids as int32 (Batch.InputIDs32); every token id, eos and
	// pad must fit.
	Int32 bool
	// ReadAhead is the batches read ahead of Next (DefaultReadAhead); ReadGap the
	// bytes between two documents of an object read by one request rather than two
	// (DefaultReadGap); Fetches the ranged reads in flight (DefaultFetches).
	ReadAhead int
	ReadGap   int64
	Fetches   int
	// Memory bounds a document: one whose tokens take more than a quarter of it
	// (at 8 bytes a token) is an error before the first batch (DefaultMemory).
	Memory int64
	// Streams, when set, mix several datasets into each epoch by tokens: stream i
	// is the URLs URLs[First:First+Count] (Shards[First:First+Count] when Shards
	// are given), and its Weight is its share of the epoch's tokens, relative to
	// the other weights; Repeat (times its documents) or Choose (documents) set its
	// draws instead, and a stream with none of them gives all its documents once.
	// A stream drawn beyond its documents repeats them; one drawn at fewer rotates
	// through them across epochs (plan.Mix). EpochTokens, when above 0, is the
	// epoch's length in tokens (eos included); 0 is what the streams give: all of
	// a weighted stream's tokens once, what Repeat and Choose give of the others.
	// EpochTokens without Streams makes one stream of every URL.
	Streams     []plan.Stream
	EpochTokens int64
	// Resume, when set, is the State the epoch continues from, on any world size.
	Resume *State
	// Buffers, when set, supplies the batches' buffers (slabs a consumer hands on
	// as they are, say) instead of the loader's own; Release gives them back to it.
	Buffers Buffers
	// Sources reads the objects (source.Default when nil).
	Sources *source.Registry
	// Logf receives log lines (log.Printf when nil).
	Logf func(format string, args ...any)
	// Planned, if not nil, is called by Open with the epoch planned, before any
	// token is read: the place to announce its reads (Planned.ReadPlan) to a cache
	// that evicts by next use, so that they count from the epoch's first read.
	Planned func(Planned)
}

// State is a packed epoch's position: the rows every rank has yielded together,
// Rows, which resumes on any world size and batch size. Save it when every rank has
// taken the same number of batches (a checkpoint of the training step).
type State struct {
	Epoch int    `json:"epoch"`
	Order string `json:"order"` // the order and packing (Loader.Fingerprint)
	Rows  int64  `json:"rows"`
}

// Batch is one batch of packed rows. InputIDs (or InputIDs32 with Config.Int32) and
// PositionIDs are BatchSize x SEQ_LEN, row after row; CuSeqlens are the segment
// starts over the flattened batch and its end (int32, as flash-attention's varlen
// kernels take them); MaxSeqlen is the longest segment.
type Batch struct {
	pack.Batch
	// Seq numbers the rank's batches of the epoch from 0 (from the resumed
	// position's on a resume).
	Seq int64
	// Padded counts the rows of pad only: past the epoch's end, so that every rank
	// yields the same number of batches.
	Padded int
	// Buf is Config.Buffers's own value for the batch (its slab, say), which the
	// loader leaves as it is.
	Buf any
}

// Buffers supplies the buffers packed batches are written into. Get is called once
// a batch, in the batches' order, before the batch is filled, and may wait (for a
// slab of a ring the consumer releases, say); it returns a Batch whose InputIDs (or
// InputIDs32 with Config.Int32) and PositionIDs hold BatchSize*SEQ_LEN tokens and
// whose CuSeqlens has room for BatchSize*SEQ_LEN+1, and may set Buf. Put takes back
// a batch that Next will not return (an error, Close) or that Release is given.
// Both may be called from the loader's goroutines, Put concurrently with Get.
type Buffers interface {
	Get(ctx context.Context) (*Batch, error)
	Put(b *Batch)
}

// Loader yields one rank's packed batches of one epoch. Next is not for concurrent
// use; Close may be called from another goroutine.
type Loader struct {
	cfg    Config
	c      *corpus
	layout *pack.Layout
	deal   pack.Deal
	fp     string
	taken  int64
	// streamTok is each stream's tokens in the epoch, eos included (with Streams).
	streamTok []int64
	out       chan chan result
	closed    chan struct{} // closed by Close
	closeOnce sync.Once
	mu        sync.Mutex
	waiting   chan result   // the batch Next waits for (mu)
	pool      chan *Batch   // released batches
	memo      memo          // the planner's (see memo)
	found     time.Duration // Open's time finding the documents (FindTime)
	rd        *reader
	cancel    context.CancelFunc
	wg        sync.WaitGroup
	err       error
	// reads gives the parts with documents in the order's windows from the one
	// holding a position on, with their first and last reads (plan.Order.Reads).
	reads func(from int64) []plan.ShardReads
}

type result struct {
	b   *Batch
	err error
}

// Open plans the epoch (the corpus's documents and their lengths, the order, the
// rows and this rank's deal) and starts reading ahead. ctx bounds Open's own work.
func Open(ctx context.Context, cfg Config) (*Loader, error) {
	l, filler, cur, err := open(ctx, cfg)
	if err != nil {
		return nil, err
	}
	if cfg.Planned != nil {
		cfg.Planned(Planned{l})
	}
	l.start(filler, cur)
	return l, nil
}

// Planned is an epoch planned as Open plans it, from the documents' lengths alone,
// without a token read: for a trainer whose checkpoint has a step count but no
// loader state.
type Planned struct{ l *Loader }

// Plan plans the epoch of cfg as Open does, reading nothing but what finds the
// documents (the index, a Megatron .idx).
func Plan(ctx context.Context, cfg Config) (Planned, error) {
	l, _, _, err := open(ctx, cfg)
	return Planned{l}, err
}

// Len is Loader.Len: the batches the rank yields (from the resumed position).
func (p Planned) Len() int64 { return p.l.Len() }

// Rows is Loader.Rows: the epoch's rows.
func (p Planned) Rows() int64 { return p.l.Rows() }

// StateAfter is Loader.StateAfter: the position after the rank has taken batches
// batches (from the resumed position).
func (p Planned) StateAfter(batches int64) State { return p.l.StateAfter(batches) }

// Reads is Loader.Reads: the reads of the epoch's objects.
func (p Planned) Reads() []ObjectReads { return p.l.Reads() }

// Objects is Loader.Objects: the objects the epoch reads, in the order of their
// first reads.
func (p Planned) Objects() []string { return p.l.Objects() }

// ReadPlan returns the epoch's reads as a plan.Plan, for what announces a plan's reads
// to a cache (serve.EpochHints.OpenPlan): the rank's Batches (and their rows as
// Samples), and as Spans the reads of the objects in order, each object at its first
// read and again at its last (Reads), spans of no samples (no Feeds, Shard the
// object's place in Reads). A cache that evicts by next use then knows that an
// object is read until its last read: the documents of one are read by ranges, in
// the groups of batches the rank reads ahead.
func (p Planned) ReadPlan() plan.Plan {
	n := int(p.Len())
	pl := plan.Plan{Batches: n, Samples: n * p.l.cfg.BatchSize}
	type read struct {
		at  int64
		obj int
	}
	reads := p.l.Reads()
	ev := make([]read, 0, 2*len(reads))
	for i, r := range reads {
		ev = append(ev, read{r.First, i}, read{r.Last, i})
	}
	slices.SortStableFunc(ev, func(a, b read) int { return cmp.Compare(a.at, b.at) })
	for _, e := range ev {
		pl.Spans = append(pl.Spans, plan.Span{URL: reads[e.obj].URL, Shard: e.obj})
	}
	return pl
}

// Objects returns the URLs of Reads, in order: the objects the epoch reads from the
// rank's position on, in the order of their first reads.
func (l *Loader) Objects() []string {
	var urls []string
	for _, r := range l.Reads() {
		urls = append(urls, r.URL)
	}
	return urls
}

// ObjectReads is when an epoch reads an object (a tar shard, a Megatron .bin): how
// far into the epoch's order of documents (counted from 1, to the order's window)
// its first and its last document are read.
type ObjectReads struct {
	URL         string
	First, Last int64
}

// Reads returns the objects that the epoch reads from the rank's position (its
// Resume) on, each once with the positions of its first and last reads, in the order
// of the first reads: the rank's rows take the documents in the order's order, so
// these are its reads, to the window (a rank of a large world, whose rows skip whole
// windows, may not read all of them). It is computed from the shards' places in the
// order (with Streams, from the plan's windows), not by a walk of the documents.
func (l *Loader) Reads() []ObjectReads {
	var from int64
	if l.deal.Start > 0 {
		doc, _ := l.layout.Locate(l.deal.Start * int64(l.cfg.Pack.SeqLen))
		if doc < 0 {
			return nil // past the last document
		}
		from = int64(doc)
	}
	at := make(map[int]int) // an object's place in out
	var out []ObjectReads
	for _, r := range l.reads(from) {
		pt := &l.c.parts[r.Shard]
		if i, ok := at[pt.obj]; ok {
			// Another part of a Megatron .bin.
			out[i].First, out[i].Last = min(out[i].First, r.First), max(out[i].Last, r.Last)
			continue
		}
		at[pt.obj] = len(out)
		out = append(out, ObjectReads{URL: pt.url, First: r.First, Last: r.Last})
	}
	return out
}

// open is Open without the reading: the loader planned, its filler and its cursor.
func open(ctx context.Context, cfg Config) (*Loader, *pack.Filler, positions, error) {
	cfg.BatchSize = cmp.Or(cfg.BatchSize, DefaultBatchSize)
	cfg.World = cmp.Or(cfg.World, 1)
	cfg.OpenShards = cmp.Or(cfg.OpenShards, DefaultOpenShards)
	cfg.ShuffleBuffer = cmp.Or(cfg.ShuffleBuffer, DefaultShuffleBuffer)
	cfg.ReadAhead = cmp.Or(cfg.ReadAhead, DefaultReadAhead)
	cfg.ReadGap = cmp.Or(cfg.ReadGap, DefaultReadGap)
	cfg.Fetches = cmp.Or(cfg.Fetches, DefaultFetches)
	cfg.Memory = cmp.Or(cfg.Memory, DefaultMemory)
	cfg.Sources = cmp.Or(cfg.Sources, source.Default)
	if cfg.Logf == nil {
		cfg.Logf = log.Printf
	}
	cfg.Int32 = cfg.Int32 || cfg.Pack.Int32
	maxID := int64(math.MaxInt64)
	if cfg.Int32 {
		maxID = math.MaxInt32
	}
	switch {
	case cfg.Pack.Field == "":
		return nil, nil, nil, fmt.Errorf("packed: no packed field (Config.Pack: FIELD:SEQ_LEN[:eos=ID][:pad=ID])")
	case cfg.Rank < 0 || cfg.Rank >= cfg.World:
		return nil, nil, nil, fmt.Errorf("packed: rank %d outside [0, world %d)", cfg.Rank, cfg.World)
	case len(cfg.URLs)+len(cfg.Shards) == 0:
		return nil, nil, nil, fmt.Errorf("packed: no URLs")
	}
	if err := cfg.Pack.Check(maxID); err != nil {
		return nil, nil, nil, err
	}
	t0 := time.Now()
	c, err := openCorpus(ctx, &cfg)
	if err != nil {
		return nil, nil, nil, err
	}
	l := &Loader{cfg: cfg, c: c, found: time.Since(t0)}
	oc := plan.OrderConfig{Seed: cfg.Seed, Epoch: cfg.Epoch, Shuffle: !cfg.NoShuffle}
	if oc.Shuffle {
		oc.Lanes, oc.Window = cfg.OpenShards, max(1, cfg.ShuffleBuffer/2)
	}
	var cur positions
	var n int64
	var partStream []int
	if len(cfg.Streams) > 0 || cfg.EpochTokens != 0 {
		m, ps, err := c.mixOf(&cfg)
		if err != nil {
			return nil, nil, nil, err
		}
		// One rank of one: the plan's windows are the whole epoch's, in order.
		p, err := plan.New(c.infos, plan.Config{Seed: oc.Seed, Epoch: oc.Epoch, Shuffle: oc.Shuffle, Lanes: oc.Lanes, Window: oc.Window,
			World: 1, BatchSize: 1, GapBytes: -1, Mix: m})
		if err != nil {
			return nil, nil, nil, err
		}
		cur, n, partStream = newMixCursor(&p), int64(p.Samples), ps
		l.reads = func(from int64) []plan.ShardReads { return planReads(&p, len(c.infos), from) }
		l.streamTok = make([]int64, len(m.Streams))
		l.fp = fingerprint(c.infos, oc, cfg.Pack, mixKey(&cfg, m))
	} else {
		order, err := plan.NewOrder(c.infos, oc)
		if err != nil {
			return nil, nil, nil, err
		}
		cur, n = &cursor{o: order}, order.Len()
		l.reads = order.Reads
		l.fp = fingerprint(c.infos, oc, cfg.Pack, "")
	}
	var longest int64
	if n > math.MaxInt {
		return nil, nil, nil, fmt.Errorf("packed: %d documents", n)
	}
	var eos int64
	if cfg.Pack.HasEOS {
		eos = 1
	}
	planning := true
	l.layout, err = pack.NewLayout(cfg.Pack, int(n), func(i int) int64 {
		p, k := cur.at(int64(i))
		t := c.tokens(p, k)
		l.memo.add(i, ref{p, k})
		if planning {
			longest = max(longest, t)
			if partStream != nil {
				l.streamTok[partStream[p]] += t + eos
			}
		}
		return t
	})
	planning = false
	if err != nil {
		return nil, nil, nil, err
	}
	if 8*longest > cfg.Memory/4 {
		return nil, nil, nil, fmt.Errorf("packed: a document of %d tokens (field %s) takes more than a quarter of the memory budget of %d bytes; raise --memory", longest, cfg.Pack.Field, cfg.Memory)
	}
	l.deal = pack.Deal{World: cfg.World, BatchSize: cfg.BatchSize, Rows: l.layout.Rows()}
	if r := cfg.Resume; r != nil {
		switch {
		case r.Order != l.fp:
			return nil, nil, nil, fmt.Errorf("%w: the state's order %s is not this loader's %s (the dataset, seed, shuffle settings or packing differ)", ErrResume, r.Order, l.fp)
		case r.Epoch != cfg.Epoch:
			return nil, nil, nil, fmt.Errorf("%w: the state is in epoch %d, the loader was asked for epoch %d", ErrResume, r.Epoch, cfg.Epoch)
		case r.Rows < 0 || r.Rows > l.deal.Rows:
			return nil, nil, nil, fmt.Errorf("%w: row %d of an epoch of %d rows", ErrResume, r.Rows, l.deal.Rows)
		}
		l.deal.Start = r.Rows
	}
	if err := l.deal.Check(); err != nil {
		return nil, nil, nil, err
	}
	filler, err := pack.NewFiller(cfg.Pack, cfg.BatchSize)
	if err != nil {
		return nil, nil, nil, err
	}
	return l, filler, cur, nil
}

// Len returns the batches the rank yields this epoch (from the resumed position):
// the same on every rank.
func (l *Loader) Len() int64 { return l.deal.BatchesPerRank() }

// Rows returns the epoch's rows and Tokens its tokens (eos included, pad not).
func (l *Loader) Rows() int64 { return l.layout.Rows() }

// Tokens returns the epoch's tokens, eos included.
func (l *Loader) Tokens() int64 { return l.layout.Tokens() }

// StreamTokens returns each stream's tokens in the epoch (eos included), in the
// order of Config.Streams; nil without Streams or EpochTokens.
func (l *Loader) StreamTokens() []int64 { return slices.Clone(l.streamTok) }

// FindTime is the time Open took to find the documents and their lengths (the
// index, a Megatron .idx), before it planned the epoch: what an unpacked loader
// spends counting its shards.
func (l *Loader) FindTime() time.Duration { return l.found }

// Fingerprint names the epoch's order and packing (State.Order): the dataset, the
// seed, the shuffle settings and the spec; not the epoch or world.
func (l *Loader) Fingerprint() string { return l.fp }

// State returns the position after the batches Next returned, assuming every rank
// returned as many.
func (l *Loader) State() State {
	return State{Epoch: l.cfg.Epoch, Order: l.fp, Rows: l.deal.Position(l.taken)}
}

// Next returns the next batch, or io.EOF after the last. Errors are sticky; a
// ctx done while Next waits is not: the next call waits for the same batch. After
// Close, Next returns ErrClosed.
func (l *Loader) Next(ctx context.Context) (*Batch, error) {
	if l.err != nil {
		return nil, l.err
	}
	select {
	case <-l.closed:
		return nil, ErrClosed
	default:
	}
	l.mu.Lock()
	ch := l.waiting
	l.mu.Unlock()
	if ch == nil {
		select {
		case c, ok := <-l.out:
			if !ok {
				l.err = io.EOF
				return nil, io.EOF
			}
			ch = c
			l.mu.Lock()
			l.waiting = c
			l.mu.Unlock()
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-l.closed:
			return nil, ErrClosed
		}
	}
	select {
	case r := <-ch:
		l.mu.Lock()
		l.waiting = nil
		l.mu.Unlock()
		if r.err != nil {
			l.err = r.err
			return nil, r.err
		}
		l.taken++
		return r.b, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-l.closed:
		return nil, ErrClosed
	}
}

// Close stops reading and waits for the loader's goroutines; the batches filled
// and not returned by Next go back to Config.Buffers. Batches Next returned stay
// the caller's.
func (l *Loader) Close() error {
	l.closeOnce.Do(func() {
		close(l.closed)
		l.cancel()
		var left []chan result
		for ch := range l.out {
			left = append(left, ch)
		}
		l.wg.Wait()
		l.mu.Lock()
		left = append(left, l.waiting)
		l.waiting = nil
		l.mu.Unlock()
		for _, ch := range left {
			select {
			case r := <-ch:
				l.Release(r.b)
			default:
			}
		}
	})
	return nil
}

// ref is a document: its part and its index there.
type ref struct{ p, k int }

// cursor maps positions of an order to documents, keeping the last window's
// permutation and items (positions are asked for mostly in order).
type cursor struct {
	o          *plan.Order
	j          int64
	start, end int64
	perm       []int32
	items      []plan.ShardSample
	ok         bool
}

// at returns the part and document at position n of the order.
func (c *cursor) at(n int64) (p, k int) {
	if !c.ok || n < c.start || n >= c.end {
		if c.ok && n == c.end {
			for c.j++; c.o.WindowStart(c.j+1) <= n; c.j++ {
			}
		} else {
			nw := c.o.Windows()
			c.j = int64(sort.Search(int(nw), func(k int) bool { return c.o.WindowStart(int64(k)+1) > n }))
		}
		c.start, c.end = c.o.WindowStart(c.j), c.o.WindowStart(c.j+1)
		c.perm, c.ok = c.o.Perm(c.j, int(c.end-c.start)), true
		c.items = c.o.WindowItems(c.j, c.items[:0])
	}
	q := int(n - c.start)
	if c.perm != nil {
		q = int(c.perm[q])
	}
	it := c.items[q]
	return it.Shard, it.Sample
}

// fingerprint names the order of infos under oc and the packing spec, and the mix
// of streams when there is one.
func fingerprint(infos []shard.Info, oc plan.OrderConfig, spec pack.Spec, mix string) string {
	d, n := plan.Dataset(infos)
	h := sha256.New()
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], uint64(n))
	h.Write([]byte(d))
	h.Write(b[:])
	spec.Int32 = false // the dtype, not the layout: a state resumes either
	fmt.Fprintf(h, "|%d|%v|%d|%d|%s", oc.Seed, oc.Shuffle, oc.Lanes, oc.Window, spec.String())
	if mix != "" {
		fmt.Fprintf(h, "|mix %s", mix)
	}
	return hex.EncodeToString(h.Sum(nil)[:8])
}
