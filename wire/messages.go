package wire

import (
	"encoding/json"
	"reflect"
	"strings"

	"github.com/shardload/shardload/decode"
)

// Version is the newest protocol version this server speaks (docs/protocol.md). A
// client that says a version outside [MinVersion, Version] in its hello is refused
// with a message naming the versions.
const Version = 4

// MinVersion is the oldest protocol version this server accepts. A session of
// version 2 behaves as the server of version 2 did: its messages carry no states.
const MinVersion = 2

// MaxMessage is the largest message either side may send, in bytes.
const MaxMessage = 64 << 10

// MaxFDs is the most descriptors one SCM_RIGHTS message carries on Linux (SCM_MAX_FD).
const MaxFDs = 253

// Message types.
const (
	TypeHello   = "hello"
	TypeReady   = "ready"
	TypeBatch   = "batch"
	TypeRelease = "release"
	TypeEnd     = "end"
	TypeEpoch   = "epoch"
	TypeBye     = "bye"
	TypeError   = "error"
)

// Error codes of an error message.
const (
	CodeVersion    = "version"     // the client speaks a protocol version the server does not
	CodeDenied     = "denied"      // the peer's uid, or a URL it asked for, is not allowed
	CodeBadRequest = "bad_request" // a malformed or out-of-order message, or bad settings
	CodeBusy       = "busy"        // the server serves its maximum of sessions
	CodePipeline   = "pipeline"    // the pipeline failed: the text says what and where
	CodeShutdown   = "shutdown"    // the server is stopping
	// CodeResume: the hello's or an epoch message's state cannot resume this dataset
	// (it was saved under another order, or it does not fit the epoch); the text
	// says why. Protocol version 3.
	CodeResume = "resume"
)

// Hello is the client's first message.
type Hello struct {
	Type      string   `json:"type"`
	Version   int      `json:"version"`
	Rank      int      `json:"rank"`
	World     int      `json:"world"`
	LocalRank int      `json:"local_rank"`
	Seed      uint64   `json:"seed"`
	Epoch     int      `json:"epoch"`
	BatchSize int      `json:"batch_size"`
	DropLast  bool     `json:"drop_last"`
	Fields    []string `json:"fields,omitempty"`
	URLs      []string `json:"urls,omitempty"`
	Client    string   `json:"client,omitempty"`
	// GPUPCI is the PCI address of the trainer's GPU, in CUDA's form
	// ("00000000:3B:00.0") or sysfs's ("0000:3b:00.0"); "" when the client cannot
	// tell, and then LocalRank picks the GPU.
	GPUPCI string `json:"gpu_pci,omitempty"`
	// CUDAVisible is the trainer's CUDA_VISIBLE_DEVICES ("" when unset): without
	// GPUPCI, LocalRank is the trainer's CUDA device number, and this list maps it
	// to a GPU in PCI bus order.
	CUDAVisible string `json:"cuda_visible_devices,omitempty"`
	// State, when set (version 3), is where the session's first epoch starts: a
	// state that a batch or end message of an earlier session carried
	// (State, Config.Resume). Epoch is then 0 or the state's epoch.
	State *State `json:"state,omitempty"`

	// Settings (version 4) are the settings that define a trainer's epochs, each
	// overriding the server's when given, within its limits: members of the hello
	// itself (allow_estimate, count_first, slab_bytes, slabs, shuffle, shuffle_buffer,
	// shuffle_bytes, open_shards, read_gap; see docs/protocol.md), which the server
	// reads through its table of settings. Members the server does not know are
	// kept here too, and ignored.
	Settings map[string]json.RawMessage `json:"-"`
	// ImageLayout is the shape of image fields the hello names without one: "chw"
	// (3xHxW, as torchvision's tensors) or "hwc" (the default, HxWx3).
	ImageLayout string `json:"image_layout,omitempty"`
	// Streams, instead of URLs, mix several datasets into each epoch
	// (shardload.Config.Streams), in epochs of EpochSamples samples (0: what the
	// streams give), batched by Batching: random (the default), stratified or
	// per_stream. Version 4.
	Streams      []Stream `json:"streams,omitempty"`
	EpochSamples int64    `json:"epoch_samples,omitempty"`
	Batching     string   `json:"batching,omitempty"`
	// Pack, when set, packs the documents of a field into rows of tokens
	// (FIELD:SEQ_LEN[:eos=ID][:pad=ID], shardload.Config.Pack): batches of packed
	// rows instead of samples; EpochTokens is a packed mix's epoch length in tokens.
	// Version 4.
	Pack        string `json:"pack,omitempty"`
	EpochTokens int64  `json:"epoch_tokens,omitempty"`
}

// Stream is one stream of a hello's mix: its URLs or patterns, and its weight, or
// its draws per epoch (repeat times its samples, or choose samples).
type Stream struct {
	URLs   []string `json:"urls"`
	Weight float64  `json:"weight,omitempty"`
	Repeat float64  `json:"repeat,omitempty"`
	Choose int64    `json:"choose,omitempty"`
}

// StreamEnd is what an epoch read of one stream of a mix (End.Streams).
type StreamEnd struct {
	Samples int64 `json:"samples"`
	Bytes   int64 `json:"bytes"`
	Skipped int64 `json:"skipped"`
}

// helloFields is Hello without its methods, for encoding/json.
type helloFields Hello

// MarshalJSON writes the hello with its Settings as members of its own.
func (h Hello) MarshalJSON() ([]byte, error) {
	b, err := json.Marshal(helloFields(h))
	if err != nil || len(h.Settings) == 0 {
		return b, err
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, err
	}
	for k, v := range h.Settings {
		if _, ok := m[k]; !ok {
			m[k] = v
		}
	}
	return json.Marshal(m)
}

// UnmarshalJSON reads a hello, keeping the members Hello has no field for in
// Settings.
func (h *Hello) UnmarshalJSON(b []byte) error {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(b, &m); err != nil {
		return err
	}
	if err := json.Unmarshal(b, (*helloFields)(h)); err != nil {
		return err
	}
	h.Settings = nil
	for _, name := range helloMembers {
		delete(m, name)
	}
	if len(m) > 0 {
		h.Settings = m
	}
	return nil
}

// helloMembers are the members of Hello's fields.
var helloMembers = func() []string {
	var names []string
	t := reflect.TypeFor[helloFields]()
	for i := range t.NumField() {
		if name, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ","); name != "" && name != "-" {
			names = append(names, name)
		}
	}
	return names
}()

// FieldInfo describes a field the session decodes.
type FieldInfo struct {
	Name  string `json:"name"`
	Ext   string `json:"ext"`
	Kind  string `json:"kind"`
	DType string `json:"dtype,omitempty"`
	Shape []int  `json:"shape,omitempty"`
}

// Ready answers a hello; the slabs' memfds travel with it.
type Ready struct {
	Type      string      `json:"type"`
	Version   int         `json:"version"`
	Session   uint64      `json:"session"`
	Slabs     int         `json:"slabs"`
	SlabBytes int64       `json:"slab_bytes"`
	Fields    []FieldInfo `json:"fields"`
	Epoch     int         `json:"epoch"`
	Batches   int         `json:"batches"`
	Samples   int64       `json:"samples"`
	Estimated bool        `json:"estimated,omitempty"` // the counts are estimates (no index)
	Shards    int         `json:"shards"`
	Order     OrderInfo   `json:"order"`
	Placement Placement   `json:"placement"`
	// State is the position the session starts from (Loader.State before any
	// Batch): the hello's state, or the start of the epoch. Version 3.
	State *State `json:"state,omitempty"`
	// EpochBatches is the batches of a whole epoch for this rank: Batches plus those
	// the state took, when it resumes an epoch of the same world. Version 4.
	EpochBatches int `json:"epoch_batches,omitempty"`
}

// OrderInfo is the order of the session's first epoch: every rank of a job must have
// the same settings. Fingerprint is Order.Fingerprint: what a state's order is (from
// version 4; before, a digest of every setting, Job's).
type OrderInfo struct {
	Fingerprint string        `json:"fingerprint"`
	Job         string        `json:"job,omitempty"` // Order.JobFingerprint, version 4
	Settings    OrderSettings `json:"settings"`
}

// Placement says where the session's pipeline runs.
type Placement struct {
	GPU    int    `json:"gpu"`    // index in PCI bus order, -1 when none was found
	PCI    string `json:"pci"`    // its PCI address, "" when none was found
	Node   int    `json:"node"`   // the node the slabs are bound to, -1 when not bound
	CPUs   string `json:"cpus"`   // the loader threads' CPUs, "" when not restricted
	Reason string `json:"reason"` // one line: what was done and why
}

// ColumnInfo is one column of a batch (see wire.Column).
type ColumnInfo struct {
	Name          string `json:"name"`
	Kind          string `json:"kind"`
	DType         string `json:"dtype"`
	Shape         []int  `json:"shape"`
	Offset        int64  `json:"offset"`
	Length        int64  `json:"length"`
	Ragged        bool   `json:"ragged"`
	OffsetsOffset int64  `json:"offsets_offset"`
}

// Batch says a batch is ready in a slab.
type Batch struct {
	Type    string       `json:"type"`
	Epoch   int          `json:"epoch"`
	Seq     int          `json:"seq"`
	Slab    int          `json:"slab"`
	Rows    int          `json:"rows"`
	Padded  int          `json:"padded"`
	Used    int64        `json:"used"`
	Columns []ColumnInfo `json:"columns"`
	// State is the position after this batch (Loader.State once Next returned it):
	// a trainer that saves it resumes after this batch. Version 3.
	State *State `json:"state,omitempty"`
	// SlabBytes is the size of the slab the batch is in: more than the ready's when
	// the slab grew to hold a larger batch (the trainer maps it again). Version 4.
	SlabBytes int64 `json:"slab_bytes,omitempty"`
	// Backpressure is the seconds the session's loader has waited so far for a
	// slab while the trainer held every one (it is ahead of the trainer).
	// Version 4.
	Backpressure float64 `json:"backpressure,omitempty"`
}

// Release hands a slab back.
type Release struct {
	Type  string `json:"type"`
	Slab  int    `json:"slab"`
	Seq   int    `json:"seq"`
	Epoch int    `json:"epoch"`
	// Wait is the seconds the trainer has waited for batches in this session so
	// far, as it measured them: the time the loader was behind. Version 4.
	Wait *float64 `json:"wait,omitempty"`
}

// End closes an epoch: after its last batch, or early when the trainer abandoned it.
type End struct {
	Type      string `json:"type"`
	Epoch     int    `json:"epoch"`
	Batches   int    `json:"batches"`
	Samples   int64  `json:"samples"`
	Skipped   int64  `json:"skipped"`
	Padded    int64  `json:"padded"`
	Abandoned bool   `json:"abandoned"`
	// Trimmed is the samples read past an epoch's planned batches and left out,
	// and Estimated says the epoch was planned from estimated counts. Version 4.
	Trimmed   int64 `json:"trimmed,omitempty"`
	Estimated bool  `json:"estimated,omitempty"`
	// Streams are the epoch's figures per stream of a mix, in the hello's order.
	Streams []StreamEnd `json:"streams,omitempty"`
	// State is the position after the batches sent (after the epoch's last Batch
	// unless abandoned); its NextEpoch starts the next epoch. Version 3; absent when
	// the epoch was abandoned before it started.
	State *State `json:"state,omitempty"`
}

// EpochRequest asks for another epoch: after an end, or before it to abandon the current
// epoch.
type EpochRequest struct {
	Type  string `json:"type"`
	Epoch int    `json:"epoch"`
	// State, when set (version 3), is where the epoch starts, as in the hello: Epoch
	// is then 0 or the state's epoch.
	State *State `json:"state,omitempty"`
}

// ErrorMessage reports why the server ends the session.
type ErrorMessage struct {
	Type    string `json:"type"`
	Code    string `json:"code"`
	Message string `json:"message"`
}

// Envelope reads a message's type before decoding the rest.
type Envelope struct {
	Type string `json:"type"`
}

// State is a rank's position in an epoch: what the Go library's Loader.State
// (shardload.State) returns after any batch, what Config.Resume starts a loader from,
// and what the messages carry. It is a few dozen bytes of ints and
// strings (JSON below), the same on every rank of a job at the same step, so a job
// may keep any rank's.
//
// The epoch's order does not depend on the world size (see plan.Order), so a state
// restores in a job of any size: the ranks of the new job split what the old one
// left unread between them, and across the new ranks every sample the old job had
// not consumed is read exactly once (but for fewer than World samples left to no
// rank, as in any epoch). With the same world size, each rank yields exactly the
// batches it would have yielded had the job not stopped.
type State struct {
	// Epoch is the epoch the state is in.
	Epoch int `json:"epoch"`
	// Order is a fingerprint of what the order of the dataset's epochs depends on
	// besides the epoch: the dataset (its shards and their counts), the seed and the
	// shuffle settings. Resuming under another order is an error. A state with no
	// Order and no Runs is the start of its Epoch, under any order.
	Order string `json:"order"`
	// Samples is the number of samples of the epoch.
	Samples int64 `json:"samples"`
	// Runs are the runs of the epoch so far, as "WORLDxCONSUMED" separated by
	// commas: the world size of each run and the samples each of its ranks consumed
	// (plan.Run). Empty at the start of an epoch.
	Runs string `json:"runs"`
	// Batches is the number of batches each rank has taken in the epoch so far: the
	// Seq of the next batch.
	//
	// The state after an epoch's last batch resumes to an epoch with no batches left;
	// the next epoch starts from State{Epoch: Epoch + 1, Order: Order, Samples: Samples}
	// (NextEpoch).
	Batches int `json:"batches"`
	// Rows is a packed epoch's position (Config.Pack): the rows of the epoch's
	// packed layout that every rank together has yielded, which resumes on any
	// world size. Zero otherwise.
	Rows int64 `json:"rows,omitempty"`
}

// NextEpoch returns the state at the start of the epoch after s's.
func (s State) NextEpoch() State {
	return State{Epoch: s.Epoch + 1, Order: s.Order, Samples: s.Samples}
}

// OrderSettings (the Go library's shardload.Order, and the settings the ready
// message carries) holds every setting that decides which samples each rank of a job
// reads in an epoch, and in which order: the dataset (its shards and their sample counts), the
// seed, the epoch, the world size, the batching and the shuffle settings. Every rank
// of a job must have the same Order; a rank whose Order differs reads an overlapping
// or incomplete part of the epoch without any error. Compare JobFingerprints across
// ranks, and name the differing settings with Diff. Fingerprint names the order of
// the dataset's samples alone (what a State's Order is).
//
// Settings that do not change the order under the loader's configuration are zero:
// the lanes and the window when NoShuffle is set.
type OrderSettings struct {
	// Dataset is a digest of the shards' URLs and sample counts, in the order given.
	Dataset string `json:"dataset"`
	// Shards and Samples are the dataset's shards and samples (all ranks together).
	Shards  int   `json:"shards"`
	Samples int64 `json:"samples"`
	// Tokens are a packed epoch's tokens (Config.Pack), eos included, pad not; its
	// Samples are its rows.
	Tokens int64 `json:"tokens,omitempty"`

	Seed      uint64 `json:"seed"`
	Epoch     int    `json:"epoch"`
	World     int    `json:"world"`
	BatchSize int    `json:"batch_size"`
	DropLast  bool   `json:"drop_last"`

	Shuffle bool `json:"shuffle"`
	// Lanes and Window are the order's (plan.OrderConfig): OpenShards, and
	// ShuffleBuffer or fewer samples, as ShuffleBytes holds at the dataset's mean
	// sample size (see Config.ShuffleBytes).
	Lanes  int `json:"lanes"`
	Window int `json:"window"`
	// Runs are the earlier runs of the epoch when the loader resumes it (State.Runs).
	Runs string `json:"runs"`
	// Split names how the ranks split a shuffled epoch: "items", by the samples'
	// places in the data within the windows ranks share (see plan.New); empty for
	// an unshuffled epoch or a mix of stratified or per-stream batches, which ranks
	// split by positions. A State saved under another split does not resume.
	Split string `json:"split,omitempty"`
	// Mix is a digest of the mix of a job of several streams (Config.Streams: their
	// shards, weights, draws, the epoch's length and the batching); Samples is then
	// the mixed epoch's length.
	Mix string `json:"mix,omitempty"`
	// RanksPerNode is the ranks per node by which a shuffled epoch keeps shards on
	// nodes (Config.RanksPerNode, unless NoNodeAffinity; 0 for one node). A resumed
	// epoch keeps its first run's layout (in Runs), and one planned from estimated
	// counts the plain order (plan.Plan.RanksPerNode says what a plan does).
	RanksPerNode int `json:"ranks_per_node,omitempty"`
}

// Columns returns the columns of a batch message for a layout.
func Columns(l *Layout) []ColumnInfo {
	cols := make([]ColumnInfo, len(l.Columns))
	for i, c := range l.Columns {
		cols[i] = ColumnInfo{
			Name: c.Name, Kind: c.Kind.String(), DType: c.DType.Descr(), Shape: c.Shape,
			Offset: c.Offset, Length: c.Length, Ragged: c.Ragged, OffsetsOffset: c.OffsetsOffset,
		}
	}
	return cols
}

// Fields returns the fields of a ready message for the fields a session decodes.
func Fields(fs []decode.Field) []FieldInfo {
	out := make([]FieldInfo, len(fs))
	for i := range fs {
		f := &fs[i]
		out[i] = FieldInfo{Name: f.ColumnName(), Ext: f.Ext, Kind: f.Kind.String(), Shape: f.Shape}
		if !f.DType.IsZero() {
			out[i].DType = f.DType.Descr()
		}
	}
	return out
}
