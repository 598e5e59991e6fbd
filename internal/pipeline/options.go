package pipeline

// A loader's settings as the engine takes them (Options), filled once by the root
// from its Config, and what the engine derives from them for either kind of epoch:
// the slabs' size, the memory model, the ring's options and the device stage.

import (
	"errors"
	"fmt"

	"github.com/shardload/shardload/decode"
	"github.com/shardload/shardload/device"
	"github.com/shardload/shardload/internal/budget"
	"github.com/shardload/shardload/internal/tune"
	"github.com/shardload/shardload/logs"
	"github.com/shardload/shardload/pack"
	"github.com/shardload/shardload/packed"
	"github.com/shardload/shardload/pinned"
	"github.com/shardload/shardload/plan"
	"github.com/shardload/shardload/shard"
	"github.com/shardload/shardload/source"
	"github.com/shardload/shardload/wire"
)

// ErrResume means a state cannot resume the loader: it was saved under another
// order, or it does not fit the epoch (shardload.ErrResume).
var ErrResume = errors.New("shardload: cannot resume from this state")

// CheckEpoch refuses a state r of another epoch than epoch, the one a loader was
// asked for (0: r's).
func CheckEpoch(epoch int, r *wire.State) error {
	if epoch != 0 && epoch != r.Epoch {
		return fmt.Errorf("%w: the state is in epoch %d, the loader was asked for epoch %d", ErrResume, r.Epoch, epoch)
	}
	return nil
}

// Options are a loader's settings, every default applied, as the engine takes them:
// the root fills them once from its Config (whose fields say what each is), for an
// epoch of samples (Open) or of packed rows (OpenPacked, PlanPacked).
type Options struct {
	Sources *source.Registry
	// The dataset of a packed epoch, which package packed plans: its URLs (those of
	// a mix's streams one after the other, Streams saying whose they are) or
	// Shards, its Index, the packing (Pack: a zero SeqLen without one) and
	// EpochTokens. An epoch of samples comes planned (Epoch).
	URLs        []string
	Shards      []shard.Info
	Index       string
	Streams     []plan.Stream
	EpochTokens int64
	Pack        pack.Spec
	// Planned, if not nil, is called with a packed epoch planned, before its first
	// read (packed.Config.Planned).
	Planned func(packed.Planned)
	// Resume is the state the epoch continues from, nil for its start.
	Resume *wire.State

	Seed          uint64
	Epoch         int
	Rank, World   int
	BatchSize     int
	DropLast      bool
	NoShuffle     bool
	SlabReads     bool
	ShuffleBuffer int
	ShuffleBytes  int64
	OpenShards    int
	ReadGap       int64 // 0: the default (see shardload.Config.ReadGap)
	// Knobs are the tuner's settings as given or defaulted, Pins those given; with
	// NoAutotune the tuner changes none.
	Knobs        tune.Knobs
	Pins         tune.Pins
	NoAutotune   bool
	ImageDecoder decode.ImageDecoder // as given: Open resolves it
	Reader       shard.Options       // the readers' limits (Params.Reader)
	Memory       int64

	// The slab ring: Slabs of SlabBytes (0: sized from the batch, SlabSize) that may
	// grow to MaxSlabBytes, or Ring; NoLock and BindSlabs as pinned.Options says.
	Slabs        int
	SlabBytes    int64
	MaxSlabBytes int64
	NoLock       bool
	Ring         *pinned.Ring
	BindSlabs    func(mem []byte) error
	Device       device.Options // the device stage's, its buffers sized from the slabs
	CPUs         []int

	// Skip is the Skip policy, within ErrorBudget.
	Skip        bool
	ErrorBudget ErrorBudget
	Logf        func(format string, args ...any)
	LogKey      any // Logf's logger (logs.Key)
}

// Budget returns the memory model of o over shards of shape d.
func (o *Options) Budget(d budget.Shape) budget.Budget {
	return budget.Budget{Memory: o.Memory, Slabs: o.Slabs, SlabBytes: o.SlabBytes, ShuffleBytes: o.ShuffleBytes,
		OpenShards: o.OpenShards, Shape: d, Pins: o.Pins}
}

// SlabSize returns the size of o's slabs over infos decoding fields: SlabBytes when
// set; otherwise one batch's: a batch of packed rows (Pack), or budget.SlabSize's.
func (o *Options) SlabSize(infos []shard.Info, fields []decode.Field) int64 {
	switch {
	case o.SlabBytes > 0:
		return o.SlabBytes
	case o.Pack.SeqLen > 0:
		return budget.RoundSlab(wire.PackedBytes(o.BatchSize, o.Pack.SeqLen, o.Pack.Int32))
	}
	return budget.SlabSize(o.BatchSize, fields, infos)
}

// sizeSlabs sets o's slabs: those of its Ring, else of size bytes.
func (o *Options) sizeSlabs(size int64) {
	if o.Ring != nil {
		o.Slabs, o.SlabBytes = len(o.Ring.Slabs()), o.Ring.MaxSlabBytes()
	} else {
		o.SlabBytes = size
	}
}

// FixedBytes returns the bytes the fixed-size columns of a batch of fields take, by
// the batch's rows.
func FixedBytes(fields []decode.Field) func(rows int) int64 {
	return func(rows int) int64 { return wire.FixedBytes(rows, fields) }
}

// openDevice opens the device-copy stage of o's slabs (sized).
func (o *Options) openDevice() (*device.Stage, error) {
	dev, err := device.Open(budget.DeviceOptions(o.Device, o.SlabBytes, o.Logf))
	if err != nil {
		return nil, fmt.Errorf("shardload: %w", err)
	}
	return dev, nil
}

// ringOptions returns the options of the ring the pipeline creates without Ring: a
// slab that cannot be page-locked is said once per logger.
func (o *Options) ringOptions() pinned.Options {
	logKey, logf := o.LogKey, o.Logf
	return pinned.Options{Slabs: o.Slabs, SlabBytes: o.SlabBytes, NoLock: o.NoLock, Bind: o.BindSlabs,
		Warn: func(msg string) { logs.Once(logKey, "lock", func() { logf("shardload: warning: %s", msg) }) }}
}
