package serve

// A session's start: the trainer's hello, its checks, and the settings it makes.

import (
	"cmp"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/shardload/shardload"
	"github.com/shardload/shardload/decode"
	"github.com/shardload/shardload/internal/budget"
	"github.com/shardload/shardload/mem"
	"github.com/shardload/shardload/pack"
	"github.com/shardload/shardload/plan"
	"github.com/shardload/shardload/shard"
	"github.com/shardload/shardload/wire"
)

// Limits on what a hello may ask for.
const (
	maxBatchSize = 1 << 16
	maxWorld     = 1 << 16
)

// requestError is a failure to be reported to the trainer with a code.
type requestError struct {
	code string
	msg  string
}

func (e *requestError) Error() string { return e.msg }

func reject(code, format string, args ...any) error {
	return &requestError{code: code, msg: fmt.Sprintf(format, args...)}
}

func (s *Server) uidAllowed(uid int) bool {
	return uid == os.Getuid() || slices.Contains(s.opts.AllowUIDs, uid)
}

// readHello reads and checks the client's first message.
func (s *Server) readHello(c *net.UnixConn) (*wire.Hello, error) {
	c.SetReadDeadline(time.Now().Add(s.opts.HelloTimeout))
	defer c.SetReadDeadline(time.Time{})
	msg, err := readMessage(c, make([]byte, MaxMessage+1))
	if err != nil {
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			return nil, reject(CodeBadRequest, "no hello within %v", s.opts.HelloTimeout)
		}
		return nil, err
	}
	var env wire.Envelope
	if err := decodeMessage(msg, &env); err != nil {
		return nil, reject(CodeBadRequest, "hello: %v", err)
	}
	if env.Type != wire.TypeHello {
		return nil, reject(CodeBadRequest, "the first message must be a wire.Hello, not %q", env.Type)
	}
	var h wire.Hello
	if err := decodeMessage(msg, &h); err != nil {
		return nil, reject(CodeBadRequest, "hello: %v", err)
	}
	if h.Version < MinVersion || h.Version > Version {
		return nil, reject(CodeVersion, "protocol version %d is not supported: this server speaks version %s (upgrade the %s client or the server so that they match)", h.Version, versions(), clientName(h.Client))
	}
	if h.Version < 3 {
		h.State = nil // no member of version 2: ignored, as unknown members are
	}
	return &h, nil
}

// versions names the protocol versions the server accepts: "2 or 3".
func versions() string {
	var b strings.Builder
	for v := MinVersion; v <= Version; v++ {
		switch {
		case v == MinVersion:
		case v == Version:
			b.WriteString(" or ")
		default:
			b.WriteString(", ")
		}
		fmt.Fprint(&b, v)
	}
	return b.String()
}

// checkState checks a state that a hello or an epoch message (what) carries for
// epoch: epoch must be 0 or the state's. It returns the epoch the state starts.
func checkState(what string, epoch int, st *shardload.State) (int, error) {
	switch {
	case st.Epoch < 0:
		return 0, fmt.Errorf("%s: the state's epoch %d < 0", what, st.Epoch)
	case epoch != 0 && epoch != st.Epoch:
		return 0, fmt.Errorf("%s: epoch %d, but the state is in epoch %d: a state resumes its own epoch (send epoch %d, or 0)", what, epoch, st.Epoch, st.Epoch)
	}
	return st.Epoch, nil
}

func clientName(c string) string {
	if c == "" {
		return "trainer's"
	}
	return c
}

// sessionConfig builds a session's pipeline settings from the server's and the hello.
func (s *Server) sessionConfig(h *wire.Hello) (shardload.Config, error) {
	cfg := s.opts.Pipeline
	switch {
	case h.World < 1 || h.World > maxWorld:
		return cfg, reject(CodeBadRequest, "world %d outside [1, %d]", h.World, maxWorld)
	case h.Rank < 0 || h.Rank >= h.World:
		return cfg, reject(CodeBadRequest, "rank %d outside [0, world %d)", h.Rank, h.World)
	case h.BatchSize < 1 || h.BatchSize > maxBatchSize:
		return cfg, reject(CodeBadRequest, "batch size %d outside [1, %d]", h.BatchSize, maxBatchSize)
	case h.Epoch < 0:
		return cfg, reject(CodeBadRequest, "epoch %d < 0", h.Epoch)
	case !pciAddress(h.GPUPCI):
		return cfg, reject(CodeBadRequest, "gpu_pci %q is not a PCI address such as 0000:3b:00.0", h.GPUPCI)
	case !visibleDevices(h.CUDAVisible):
		return cfg, reject(CodeBadRequest, "cuda_visible_devices %.80q is not a CUDA_VISIBLE_DEVICES list", h.CUDAVisible)
	}
	cfg.Rank, cfg.World, cfg.Seed, cfg.Epoch = h.Rank, h.World, h.Seed, h.Epoch
	cfg.BatchSize, cfg.DropLast = h.BatchSize, h.DropLast
	if !cfg.NoAutotune {
		cfg.Tuner = shardload.NewTuner() // the session's epochs go on from the last one's settings
	}
	if h.State != nil {
		st := *h.State
		epoch, err := checkState("hello", h.Epoch, &st)
		if err != nil {
			return cfg, reject(CodeBadRequest, "%v", err)
		}
		cfg.Epoch, cfg.Resume = epoch, &st
	}
	if err := s.epochSettings(h, &cfg); err != nil {
		return cfg, err
	}
	parse := decode.ParseFields
	switch h.ImageLayout {
	case "chw":
		parse = decode.ParseFieldsCHW
	case "", "hwc":
	default:
		return cfg, reject(CodeBadRequest, "image_layout %.20q: want chw or hwc", h.ImageLayout)
	}
	if len(h.Fields) > 0 {
		fields, err := parse(h.Fields...)
		if err != nil {
			return cfg, reject(CodeBadRequest, "fields: %v", err)
		}
		cfg.Fields = fields
	}
	if len(h.URLs) > 0 && len(h.Streams) > 0 {
		return cfg, reject(CodeBadRequest, "the hello names both urls and streams")
	}
	if len(h.URLs) > 0 {
		if err := s.allowedURLs(h.URLs); err != nil {
			return cfg, err
		}
		if !slices.Equal(h.URLs, s.opts.URLs) {
			// The server's index describes its own dataset only.
			cfg.URLs, cfg.Index, cfg.Shards = h.URLs, "", nil
		}
		cfg.Streams, cfg.EpochSamples, cfg.Batching = nil, 0, ""
	}
	if len(h.Streams) > 0 {
		var all []string
		for _, st := range h.Streams {
			all = append(all, st.URLs...)
		}
		if err := s.allowedURLs(all); err != nil {
			return cfg, err
		}
		cfg.URLs, cfg.Shards, cfg.Streams = nil, nil, nil
		for i, st := range h.Streams {
			if len(st.URLs) == 0 {
				return cfg, reject(CodeBadRequest, "streams: stream %d names no urls", i)
			}
			cfg.Streams = append(cfg.Streams, shardload.Stream{URLs: st.URLs, Weight: st.Weight, Repeat: st.Repeat, Choose: st.Choose})
		}
		if !slices.Equal(all, s.opts.URLs) {
			cfg.Index = ""
		}
	}
	if h.EpochSamples != 0 || h.Batching != "" {
		b, err := plan.ParseBatching(h.Batching)
		if err != nil || h.EpochSamples < 0 {
			return cfg, reject(CodeBadRequest, "batching %.20q, epoch_samples %d: want random, stratified or per_stream, and 0 or more samples", h.Batching, h.EpochSamples)
		}
		cfg.EpochSamples, cfg.Batching = h.EpochSamples, b
	}
	if h.Pack != "" || h.EpochTokens != 0 {
		if _, err := pack.ParseSpec(cmp.Or(h.Pack, cfg.Pack)); err != nil || h.EpochTokens < 0 {
			return cfg, reject(CodeBadRequest, "pack %.80q, epoch_tokens %d: want FIELD:SEQ_LEN[:eos=ID][:pad=ID] (%v) and 0 or more tokens", h.Pack, h.EpochTokens, err)
		}
		cfg.Pack, cfg.EpochTokens = cmp.Or(h.Pack, cfg.Pack), h.EpochTokens
	}
	if cfg.Pack != "" {
		if len(h.Fields) > 0 {
			return cfg, reject(CodeBadRequest, "fields and pack: a packed batch's columns are input_ids, position_ids, cu_seqlens and max_seqlen")
		}
		cfg.Fields = nil
	}
	if len(cfg.Streams) == 0 && (cfg.EpochSamples != 0 || cfg.Batching != "" && cfg.Batching != plan.Random) {
		return cfg, reject(CodeBadRequest, "epoch_samples and batching are settings of a mix of streams: the hello names none")
	}
	if len(cfg.URLs) == 0 && len(cfg.Shards) == 0 && len(cfg.Streams) == 0 {
		return cfg, reject(CodeBadRequest, "the hello names no URLs and the server has no dataset of its own")
	}
	if len(cfg.Fields) > 0 && cfg.Pack == "" {
		// The batch's fixed columns are known from the hello: a batch the slabs
		// cannot hold is refused now, before the dataset is counted or a slab made.
		if err := checkBatch(cfg, cfg.Fields); err != nil {
			return cfg, err
		}
	}
	return cfg, nil
}

// checkBatch refuses a batch of cfg's BatchSize samples of fields whose fixed-size
// columns alone need a slab larger than the server's --max-slab-size, or a ring larger
// than its --memory, from the settings alone (shardload.CheckBatch), in the terms of
// the trainer's client and the server's flags.
func checkBatch(cfg shardload.Config, fields []decode.Field) error {
	err := shardload.CheckBatch(cfg, fields)
	var be *shardload.BatchError
	if !errors.As(err, &be) {
		return err
	}
	if be.Need > be.MaxSlab {
		return reject(CodeBadRequest, "a batch of %d samples of these fields (batch_size=%d) needs a slab of %s, more than this server's --max-slab-size of %s: lower batch_size= (%d samples of these fields fit; slab_bytes= cannot exceed the limit either), or start the server with a larger --max-slab-size",
			be.Rows, be.Rows, budget.Size(be.Need), budget.Size(be.MaxSlab), be.MaxRows)
	}
	return reject(CodeBadRequest, "a batch of %d samples of these fields (batch_size=%d) needs a slab of %s; %d slabs of it (slabs=) and the other buffers at their least take %s, more than this server's --memory of %s per trainer: lower batch_size= (%d samples of these fields fit), slabs= or slab_bytes=, or start the server with a larger --memory",
		be.Rows, be.Rows, budget.Size(be.Need), be.Slabs, budget.Size(be.Least), budget.Size(be.Memory), be.MaxRows)
}

// allowedURLs refuses patterns that name more than MaxShards shards in all (counted
// before anything is expanded: a hello costs the server at most MaxShards URLs of
// work), or a shard the server does not serve.
func (s *Server) allowedURLs(patterns []string) error {
	var total uint64
	for _, p := range patterns {
		n, err := shard.Count(p)
		if err != nil {
			return reject(CodeBadRequest, "urls: %v", err)
		}
		if total += n; n > uint64(s.opts.MaxShards) || total > uint64(s.opts.MaxShards) {
			return reject(CodeBadRequest, "urls: %.200q expands to %d URLs: the patterns name more than %d shards, this server's limit for one trainer (--max-shards)", p, n, s.opts.MaxShards)
		}
	}
	urls, err := shard.ExpandAll(patterns)
	if err != nil {
		return reject(CodeBadRequest, "urls: %v", err)
	}
	for _, u := range urls {
		if err := s.allowed(u); err != nil {
			return reject(CodeDenied, "this server does not serve %s (%v): it serves its own dataset and URLs under the prefixes given by --allow", u, err)
		}
	}
	return nil
}

// epochSettings applies the settings of a hello (version 4) that define the trainer's
// epochs (the knobs with a hello member): the server's are defaults, its limits and
// budgets the bounds.
func (s *Server) epochSettings(h *wire.Hello, cfg *shardload.Config) error {
	if h.Version < 4 {
		return nil
	}
	for _, k := range shardload.Knobs {
		if raw, ok := h.Settings[k.Hello]; ok && k.Hello != "" {
			if err := k.SetHello(cfg, raw); err != nil {
				return reject(CodeBadRequest, "%v", err)
			}
		}
	}
	if limit := cmp.Or(cfg.MaxSlabBytes, shardload.DefaultMaxSlabBytes); cfg.SlabBytes > limit {
		return reject(CodeBadRequest, "slab_bytes=%d is more than this server's --max-slab-size of %s: lower slab_bytes= (or leave it out: slabs are sized from the batch), or start the server with a larger --max-slab-size",
			cfg.SlabBytes, mem.FormatSize(limit))
	}
	if err := cfg.Validate(); err != nil {
		return reject(CodeBadRequest, "%v", err)
	}
	return nil
}
