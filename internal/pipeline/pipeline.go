// Package pipeline is the loader's stages between the plan and the batches: a
// producer per open shard (fetch, inflate, split, decode into buffers of a size-class
// pool), the mixer that interleaves the open shards and shuffles, the batcher that
// collates batches into the slabs of a pinned ring, and the hand-over of each batch to
// the device-copy stage. The root package owns the API, plans the epoch and fills
// Options from its Config once; Open (OpenPacked for packed rows) sizes the slabs,
// splits the memory budget and wires these stages. Everything that decides the
// order of samples happens in the mixer, so the order does not depend on goroutine
// timing.
package pipeline

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/shardload/shardload/decode"
	"github.com/shardload/shardload/device"
	"github.com/shardload/shardload/internal/budget"
	"github.com/shardload/shardload/internal/tune"
	"github.com/shardload/shardload/mem"
	"github.com/shardload/shardload/pinned"
	"github.com/shardload/shardload/plan"
	"github.com/shardload/shardload/redact"
	"github.com/shardload/shardload/shard"
	"github.com/shardload/shardload/source"
	"github.com/shardload/shardload/wire"
)

// Opener opens a shard by URL, whole or from an offset, pinned to a version where it
// can (a *source.Registry).
type Opener interface {
	Open(ctx context.Context, url string) (io.ReadCloser, error)
	OpenRange(ctx context.Context, url string, off, length int64) (io.ReadCloser, error)
	OpenVersion(ctx context.Context, url, version string, off, length int64) (io.ReadCloser, error)
	OpenInfoRange(ctx context.Context, info source.Info, off, length int64) (io.ReadCloser, error)
}

// Params are what the stages need, with every default applied by the caller.
type Params struct {
	Sources Opener
	Plan    plan.Plan
	Shards  []shard.Info // the shard list the plan indexes
	Fields  []decode.Field
	// ImageDecoder decodes image fields' JPEGs (resolved: not Auto).
	ImageDecoder decode.ImageDecoder
	// AugmentSeed and Epoch seed image fields' random transforms, with each sample's
	// key (decode.SampleSeed).
	AugmentSeed uint64
	Epoch       int
	// Reader holds the shard readers' limits (MaxMemberSize, MaxSampleSize,
	// MaxRatio); the pipeline sets URL, Timing and Buffers.
	Reader shard.Options

	Rank int
	// FirstSeq is the Seq of the first batch (the batches a resumed epoch's rank
	// took before).
	FirstSeq int
	// Replay is the batches dropped before the first one handed out: an epoch planned
	// from estimated counts resumes by reading its start again (its batches follow
	// the data, not positions of the order).
	Replay    int
	NoShuffle bool
	// SlabReads reads members straight into their slab rows where the index says
	// where they go (place.go); otherwise every member is read into sample memory,
	// to be copied into its slab at collate.
	SlabReads bool
	// Members are shards' members that Shards and the plan's Loaded lack, read for
	// reads into slab rows (slabMembers).
	Members      map[int]*shard.Members
	ShuffleBytes int64 // the shuffle windows' budget (with NoShuffle, the queues')
	OpenShards   int
	// Knobs are the settings that do not change what the pipeline yields (SetKnobs
	// changes them): workers, shards opened beyond OpenShards, bytes queued per open
	// shard, and the remote reads' parts (zero: the sources' own).
	Knobs tune.Knobs
	// SampleBytes, when set, bounds the sample buffers the pool keeps and maps (the
	// memory budget's share for decoded samples); beyond it buffers come from the Go
	// heap and are not kept.
	SampleBytes int64
	BatchSize   int
	DropLast    bool
	CPUs        []int // the CPUs the stages' threads run on; nil: anywhere

	// Record, when set, receives the true entry of each estimated shard read from its
	// start to its end.
	Record func(shard.Info)
	// StreamOf, for a mix of streams, is each shard's stream: Counters.Streams then
	// counts per stream.
	StreamOf []int

	// Skip leaves bad samples and shards out (the Skip policy) within Budget.
	Skip   bool
	Budget Budget

	// Ring is the slab ring to collate into, which the pipeline does not close;
	// without it the pipeline creates one from RingOptions (overlapping with the
	// first reads) and closes it.
	Ring        *pinned.Ring
	RingOptions pinned.Options
	// Slabs, when set, says how large a slab may grow to hold a batch larger than
	// it, within the memory budget at the tuner's knobs (Tuned); without it such a
	// batch fails the loader.
	Slabs *budget.Slabs
	Tuned *tune.Shared
	// Remote: some shard is read from a remote store, so that the tuner moves the
	// remote reads' settings too (Tune).
	Remote bool
	// Queue is the number of batches collated ahead of Next (the ring's slabs).
	Queue int
	// Device receives each batch after collation; nil hands none over. Close
	// closes it, before the ring its copies read from.
	Device *device.Stage
	Logf   func(format string, args ...any)
	// LogKey names Logf's logger (logs.Key): a warning is said once per logger, not
	// per epoch (logs.Once).
	LogKey any

	// Packed, when set, is where the batches come from instead of the plan's shards:
	// rows of SeqLen tokens packed by a packed.Loader, BatchSize of them a batch,
	// written into the ring's slabs by Buffers, its packed.Config.Buffers (the
	// fields, plan and shards are then unused).
	Packed  Rows
	Buffers *SlabBuffers
	SeqLen  int
	// Int32IDs: the packed rows' input_ids are int32 (pack.Spec.Int32).
	Int32IDs bool
}

// Budget is what the Skip policy may leave out before the pipeline fails.
type Budget struct {
	MaxSamples, MaxShards float64 // what this rank may skip
	JobSamples            int64   // the job's samples and shards, for the message
	JobShards             int
	Text                  string // the budget as the user gave it
}

// Pipeline runs the stages of one rank's epoch.
type Pipeline struct {
	p Params

	ring      *pinned.Ring // set once ringReady is closed
	ringErr   error
	ringReady chan struct{}

	out     chan msg
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	pool    mem.Pool
	items   sync.Pool // *item
	workers *gate     // one token per worker actively reading a shard
	live    live
	regWarn sync.Once
	// images: some field is an image. detached: every field is an image or a label,
	// so that an item's buffer holds its decoded values alone, detachedBytes of them.
	images, detached bool
	detachedBytes    int
	// placing: reads straight into slab rows may happen (place.go); places are the
	// destinations published for the producers.
	placing bool
	places  places

	// endRead: the shards (indices, in order) that some span of the plan reads to
	// their end (and checks their counts there): 4 bytes each, a tenth of what a
	// map of them takes. countChecked: the shards whose count a span that stops
	// before their end has checked (see checkCount).
	endRead      []int32
	countChecked sync.Map

	closeOnce sync.Once
	closed    atomic.Bool
	closeErr  error
	err       error // sticky error of Next

	// C counts what the stages did and where their time went.
	C Counters
}

type msg struct {
	b   *Batch
	err error
}

// Counters are the pipeline's counters; times are nanoseconds summed over the
// goroutines that spend them. Wait and FirstBatch are the caller's to keep.
type Counters struct {
	Samples, Batches, Padded, Trimmed, Skipped, SkippedShards atomic.Int64
	BytesIn, BytesInflated, BytesOut                          atomic.Int64
	FirstBatch                                                atomic.Int64
	Fetch, Inflate, Split, Decode, Shuffle, Collate           atomic.Int64
	Starve, Wait                                              atomic.Int64
	// Backpressure is the time the batcher waited for a free slab: every slab held
	// by batches the consumer has not released (the loader is ahead of it).
	Backpressure atomic.Int64
	// Requests counts the reads of shards opened: one per span of the plan, and one
	// per check of a shard's count at its last sample (a source may serve one in
	// several parts).
	Requests atomic.Int64
	// SlabGrowths counts slabs grown to hold a batch larger than they were.
	SlabGrowths atomic.Int64
	// Placed counts the member bytes read straight into their slab rows, and
	// Replaced the batches whose rows were not as planned, their placed values moved
	// out and copied again (see place.go).
	Placed, Replaced atomic.Int64
	// Queued is the bytes the open shards' queues hold now (their samples'
	// weights, as the queues count them).
	Queued atomic.Int64
	// Streams count per stream of a mix (Params.StreamOf).
	Streams []StreamCounters
}

// StageNames are the stages of Counters.Stages, in pipeline order.
var StageNames = []string{"fetch", "inflate", "split", "decode", "shuffle", "collate", "starve", "wait", "backpressure"}

// Stages returns the time spent in each stage so far, by its name in StageNames.
func (c *Counters) Stages() map[string]time.Duration {
	m := make(map[string]time.Duration, len(StageNames))
	for i, v := range []*atomic.Int64{&c.Fetch, &c.Inflate, &c.Split, &c.Decode, &c.Shuffle, &c.Collate, &c.Starve, &c.Wait, &c.Backpressure} {
		m[StageNames[i]] = time.Duration(v.Load())
	}
	return m
}

// Batch is one collated batch in a slab of the ring.
type Batch struct {
	wire.Layout
	Seq      int              // numbers the batches of an epoch from 0
	Padded   int              // rows that repeat earlier samples
	Slab     *pinned.Slab     // the slab the batch lives in
	Transfer *device.Transfer // the copy to the device; nil without a device stage

	ring     *pinned.Ring
	released atomic.Bool
	holds    atomic.Int32 // holders besides the consumer: the slab goes back when all let go
}

// Release waits for the batch's device copy and hands its slab back to the ring.
// It is idempotent.
func (b *Batch) Release() {
	if b.released.CompareAndSwap(false, true) {
		b.unref()
	}
}

// unref lets go of the batch for the consumer or one holder; the last hands the
// slab back.
func (b *Batch) unref() {
	if b.holds.Add(-1) >= 0 {
		return
	}
	if b.Transfer != nil {
		b.Transfer.Release() // waits for the copy, so the slab is free to refill
	}
	b.ring.Release(b.Slab)
}

// Start starts the stages. ctx's values reach the sources; its cancellation does
// not stop the pipeline (Close does).
func Start(ctx context.Context, p Params) *Pipeline {
	ctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	pl := &Pipeline{p: p, cancel: cancel,
		out:       make(chan msg, p.Queue),
		workers:   newGate(p.Knobs.Workers),
		ringReady: make(chan struct{}),
	}
	pl.detached = len(p.Fields) > 0
	pl.C.Streams = newStreamCounters(p.StreamOf)
	for i := range p.Fields {
		switch f := &p.Fields[i]; f.Kind {
		case decode.KindImage:
			pl.images = true
			pl.detachedBytes += int(f.RowBytes())
		case decode.KindInt:
		default:
			pl.detached = false
		}
	}
	pl.detached = pl.detached && pl.images
	pl.placing = len(placeable(&pl.p)) > 0
	for _, sp := range p.Plan.Spans {
		if sp.Skip+sp.Take == p.Shards[sp.Shard].Samples {
			pl.endRead = append(pl.endRead, int32(sp.Shard))
		}
	}
	slices.Sort(pl.endRead)
	pl.endRead = slices.Clip(slices.Compact(pl.endRead))
	pl.SetKnobs(p.Knobs)
	// Free buffers kept for reuse: as much as the queues and the shuffle buffer hold.
	pl.pool.MaxFree = int64(p.OpenShards)*p.Knobs.QueueBytes + p.ShuffleBytes
	// The arena may map twice that: what the queues and the shuffle buffer hold, and
	// room for the batches being collated and for size classes that round up; at
	// most what the memory budget leaves the samples.
	pl.pool.MaxArena = 2 * pl.pool.MaxFree
	if p.SampleBytes > 0 {
		pl.pool.MaxArena = min(pl.pool.MaxArena, p.SampleBytes)
		pl.pool.MaxFree = min(pl.pool.MaxFree, p.SampleBytes)
	}
	if p.Buffers != nil {
		p.Buffers.pl = pl
		close(p.Buffers.set)
	}
	if p.Ring != nil {
		pl.ring = p.Ring
		close(pl.ringReady)
	} else {
		// Mapping and locking the slabs takes a while (page faults for every page): it
		// overlaps with reading the first samples, and the first batch waits for it.
		// The last pipeline's ring, made alike, is taken instead (see takeRing).
		go func() {
			defer close(pl.ringReady)
			pl.ring, pl.ringErr = takeRing(p.RingOptions)
		}()
	}
	pl.wg.Add(1)
	go pl.run(ctx)
	return pl
}

// ErrClosed is returned by Next after Close.
var ErrClosed = errors.New("shardload: loader closed")

// readsEnd reports whether some span of the plan reads shard to its end.
func (pl *Pipeline) readsEnd(shard int) bool {
	_, ok := slices.BinarySearch(pl.endRead, int32(shard))
	return ok
}

// Next returns the next batch, or io.EOF after the epoch's last. Errors are sticky
// and have their URLs' secrets removed.
func (pl *Pipeline) Next(ctx context.Context) (*Batch, error) {
	if pl.closed.Load() {
		// Batches still queued when Close ran belong to freed slabs: never hand them out.
		pl.err = ErrClosed
	}
	if pl.err != nil {
		return nil, pl.err
	}
	var m msg
	var ok bool
	select {
	case m, ok = <-pl.out:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	switch {
	case pl.closed.Load():
		if ok && m.b != nil {
			m.b.Release()
		}
		pl.err = ErrClosed
	case !ok:
		pl.err = io.EOF
	case m.err != nil:
		pl.err = redact.Error(m.err)
	default:
		return m.b, nil
	}
	return nil, pl.err
}

// Close stops the stages, waits for their goroutines, and closes the device stage and
// then the ring it created, or leaves that ring for the next pipeline (leaveRing).
// Close is idempotent.
func (pl *Pipeline) Close() error {
	pl.closeOnce.Do(func() {
		pl.closed.Store(true)
		pl.cancel()
		// Drain batches nobody will take, so the producer side can exit; the mixer
		// closes out when it ends, and Close returns once every batch drained went
		// back to the ring (a caller's ring counts them free).
		drained := make(chan struct{})
		go func() {
			defer close(drained)
			for m := range pl.out {
				if m.b != nil {
					m.b.Release()
				}
			}
		}()
		pl.wg.Wait()
		<-drained
		pl.pool.Release() // every goroutine that held a sample buffer is done
		if pl.p.Packed != nil {
			pl.p.Packed.Close() // its fillers write into the ring's slabs
		}
		var devErr error
		if pl.p.Device != nil {
			devErr = pl.p.Device.Close()
		}
		<-pl.ringReady
		if pl.ring != nil && pl.p.Ring == nil {
			pl.closeErr = leaveRing(pl.ring, pl.p.RingOptions)
		}
		pl.closeErr = errors.Join(devErr, pl.closeErr)
	})
	return pl.closeErr
}

// Locked reports whether the ring's slabs are page-locked; false while the ring is
// being made.
func (pl *Pipeline) Locked() bool {
	select {
	case <-pl.ringReady:
		return pl.ring != nil && pl.ring.Locked()
	default:
		return false
	}
}

// ErrNoSample means InferFields found no shard with a sample.
var ErrNoSample = errors.New("shardload: no samples in the shards")

// InferFields returns the fields of the first sample of the first shard that has one,
// each with the decoder its extension suggests (decode.ParseField).
// Compression names how the shards of infos are compressed as a whole: by the
// names of those that say (the compression whose decompressor holds the most,
// shard.InflateBytes), else from the first bytes of the shard at url (one the rank
// reads from its start; "" when none), one small ranged read. When there is no such
// shard or it cannot be read (the loader's reads then say why), it returns None and
// assumed: the shards may be compressed, by what is not known.
func Compression(ctx context.Context, src Opener, infos []shard.Info, url string) (c shard.Compression, assumed bool) {
	if c := CompressionOfNames(infos); c != shard.None {
		return c, false
	}
	if url == "" {
		return shard.None, true
	}
	var body io.ReadCloser
	var err error
	if i := slices.IndexFunc(infos, func(in shard.Info) bool { return in.URL == url }); i >= 0 && infos[i].Size > 0 && infos[i].Version != "" {
		in := infos[i]
		body, err = src.OpenInfoRange(ctx, source.Info{URL: url, Size: in.Size, Version: in.Version}, 0, 8)
	} else {
		body, err = src.OpenRange(ctx, url, 0, 8)
	}
	if err != nil {
		return shard.None, true
	}
	defer body.Close()
	head := make([]byte, 8)
	n, _ := io.ReadFull(body, head)
	return shard.DetectCompression(head[:n]), false
}

// CompressionOfNames names the compression the names of infos say
// (shard.CompressionOfName), the one whose decompressor holds the most where they
// say several; None when none says any.
func CompressionOfNames(infos []shard.Info) shard.Compression {
	c := shard.None
	for _, info := range infos {
		if n := shard.CompressionOfName(info.URL); n != shard.None && (c == shard.None || shard.InflateBytes(n) > shard.InflateBytes(c)) {
			c = n
			if c == shard.Zstd {
				break // none holds more
			}
		}
	}
	return c
}

func InferFields(ctx context.Context, src Opener, infos []shard.Info, opts shard.Options) ([]decode.Field, error) {
	for _, info := range infos {
		if info.Samples == 0 {
			continue
		}
		body, err := src.Open(ctx, info.URL)
		if err != nil {
			return nil, err
		}
		opts.URL, opts.SizesOnly = info.URL, true
		r := shard.NewReader(body, opts)
		s, err := r.Next()
		var fields []decode.Field
		if err == nil {
			for _, f := range s.Fields {
				fd, perr := decode.ParseField(f.Ext)
				if perr != nil {
					err = perr
					break
				}
				fields = append(fields, fd)
			}
		}
		r.Close()
		body.Close()
		if err != nil {
			return nil, fmt.Errorf("shardload: inferring fields from %s: %w", info.URL, err)
		}
		return fields, nil
	}
	return nil, ErrNoSample
}
