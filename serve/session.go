package serve

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/shardload/shardload"
	"github.com/shardload/shardload/decode"
	"github.com/shardload/shardload/internal/knob"
	"github.com/shardload/shardload/internal/mem"
	"github.com/shardload/shardload/internal/redact"
	"github.com/shardload/shardload/internal/tune"
	"github.com/shardload/shardload/pinned"
	"github.com/shardload/shardload/plan"
	"github.com/shardload/shardload/shard"
	"github.com/shardload/shardload/wire"
)

// Limits on what a hello may ask for.
const (
	maxBatchSize = 1 << 16
	maxWorld     = 1 << 16
)

// Causes of a session's wire.End, other than the pipeline's errors.
var (
	errClientGone = errors.New("serve: trainer disconnected")
	errBye        = errors.New("serve: trainer said bye")
	errShutdown   = errors.New("serve: server shutting down")
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

// handle serves one connection from its first message to its end.
func (s *Server) handle(c *net.UnixConn) {
	defer linger(c)
	id := s.nextID.Add(1)
	// A panic ends this session, not the server and every other trainer's.
	defer func() {
		if r := recover(); r != nil {
			s.opts.Logf("serve: session %d: internal error (panic), the session ends: %v\n%s", id, r, debug.Stack())
			sendError(c, CodePipeline, fmt.Sprintf("internal error in the shardload server (panic: %v); this session ends, the server goes on", r))
		}
	}()
	uid, pid, err := peerCred(c)
	if err != nil {
		s.opts.Logf("serve: session %d: reading peer credentials: %v", id, err)
		return
	}
	if !s.uidAllowed(uid) {
		s.opts.Logf("serve: session %d: refused uid %d (pid %d)", id, uid, pid)
		sendError(c, CodeDenied, fmt.Sprintf("uid %d may not use this server: it serves uid %d and those given by --allow-uid", uid, os.Getuid()))
		return
	}
	h, err := s.readHello(c)
	if err != nil {
		var re *requestError
		if errors.As(err, &re) {
			s.opts.Logf("serve: session %d (pid %d): %s", id, pid, re.msg)
			sendError(c, re.code, re.msg)
		} else {
			s.opts.Logf("serve: session %d (pid %d): %v", id, pid, err)
		}
		return
	}
	cfg, err := s.sessionConfig(h)
	if err != nil {
		s.opts.Logf("serve: session %d (pid %d): %v", id, pid, err)
		var re *requestError
		if errors.As(err, &re) {
			sendError(c, re.code, re.msg)
		} else {
			sendError(c, CodeBadRequest, err.Error())
		}
		return
	}
	select {
	case s.slots <- struct{}{}:
		defer func() { <-s.slots }()
	default:
		s.opts.Logf("serve: session %d (pid %d): refused, %d sessions already", id, pid, s.opts.MaxSessions)
		sendError(c, CodeBusy, fmt.Sprintf("the server already serves its maximum of %d trainers (--max-sessions)", s.opts.MaxSessions))
		return
	}
	s.active.Add(1)
	defer s.active.Add(-1)
	pl := s.place(h)
	if pl.node >= 0 {
		cfg.CPUs = pl.cpus
	}
	from := ""
	if h.State != nil {
		from = fmt.Sprintf(" from a state after batch %d", h.State.Batches)
	}
	s.opts.Logf("serve: session %d: pid %d rank %d of %d (local rank %d), protocol %d, epoch %d%s, batch size %d; placement: %s",
		id, pid, h.Rank, h.World, h.LocalRank, h.Version, cfg.Epoch, from, h.BatchSize, pl.msg.Reason)
	ss := &session{srv: s, id: id, conn: c, cfg: cfg, place: pl, version: h.Version, states: h.Version >= 3, held: map[int]sent{},
		open: []epochReq{{epoch: cfg.Epoch, state: cfg.Resume}}, wake: make(chan struct{}, 1)}
	ss.tally.started = time.Now()
	s.statsMu.Lock()
	if s.live == nil {
		s.live = map[uint64]*session{}
	}
	s.live[id] = ss
	s.statsMu.Unlock()
	defer func() {
		// Also after a panic: the session's counters move to the ended ones.
		st := ss.tally.snapshot(ss)
		s.statsMu.Lock()
		delete(s.live, id)
		s.ended.Add(st.Stats)
		s.statsMu.Unlock()
	}()
	err = ss.run()
	rates := sessionRates(ss.tally.snapshot(ss), time.Since(ss.tally.started))
	switch {
	case err == nil || errors.Is(err, errBye):
		s.opts.Logf("serve: session %d: done; %s", id, rates)
	case errors.Is(err, errClientGone):
		s.opts.Logf("serve: session %d: trainer went away; its batches are released; %s", id, rates)
	default:
		s.opts.Logf("serve: session %d: %v; %s", id, oneLine(err), rates)
	}
}

// sessionRates says in a few words what a session did over its life: samples,
// batches, rates and the share of the time it waited for its loader's batches.
func sessionRates(st SessionStats, life time.Duration) string {
	sec := max(life.Seconds(), 1e-9)
	return fmt.Sprintf("%s%s", rates(st, sec), streamFigures(st.Streams))
}

// streamFigures says what a session read of each stream of a mix, "" for none.
func streamFigures(streams []shardload.StreamStats) string {
	var b strings.Builder
	for i, s := range streams {
		sep := ", "
		if i == 0 {
			sep = "; streams: "
		}
		fmt.Fprintf(&b, "%s%d: %d samples, %.1f MB, %d skipped", sep, i, s.Samples, float64(s.BytesIn)/1e6, s.Skipped)
	}
	return b.String()
}

func rates(st SessionStats, sec float64) string {
	return fmt.Sprintf("rank %d: %d samples in %d batches in %.1fs (%.0f samples/s, %.1f MB/s read); the trainer waited for batches %.1f%% of the time (starved: the loader behind), the loader for the trainer's slabs %.1f%% (backpressure: the loader ahead)",
		st.Rank, st.Samples, st.Batches, sec, float64(st.Samples)/sec, float64(st.BytesIn)/1e6/sec,
		100*st.Stages["wait"].Seconds()/sec, 100*st.Stages["backpressure"].Seconds()/sec)
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
		st := shardload.State(*h.State)
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
	if len(cfg.Streams) == 0 && (cfg.EpochSamples != 0 || cfg.Batching != "" && cfg.Batching != plan.Random) {
		return cfg, reject(CodeBadRequest, "epoch_samples and batching are settings of a mix of streams: the hello names none")
	}
	if len(cfg.URLs) == 0 && len(cfg.Shards) == 0 && len(cfg.Streams) == 0 {
		return cfg, reject(CodeBadRequest, "the hello names no URLs and the server has no dataset of its own")
	}
	if len(cfg.Fields) > 0 {
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
			be.Rows, be.Rows, tune.Size(be.Need), tune.Size(be.MaxSlab), be.MaxRows)
	}
	return reject(CodeBadRequest, "a batch of %d samples of these fields (batch_size=%d) needs a slab of %s; %d slabs of it (slabs=) and the other buffers at their least take %s, more than this server's --memory of %s per trainer: lower batch_size= (%d samples of these fields fit), slabs= or slab_bytes=, or start the server with a larger --memory",
		be.Rows, be.Rows, tune.Size(be.Need), be.Slabs, tune.Size(be.Least), tune.Size(be.Memory), be.MaxRows)
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
	for _, k := range knob.All {
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

// session is one trainer's connection: its slab ring, its loader, the batches it
// holds, and the epochs it asked for.
type session struct {
	srv   *Server
	id    uint64
	conn  *net.UnixConn
	cfg   shardload.Config
	place sessionPlace
	wake  chan struct{} // a new epoch was asked for (capacity 1)
	// version is the protocol version of the trainer's wire.Hello, which the wire.Ready
	// repeats; states: it is 3 or more, so wire.Ready, batch and end messages carry
	// states, and epoch messages may.
	version int
	states  bool
	tally   sessionTally // counters for Server.Stats

	mu        sync.Mutex
	held      map[int]sent // by slab index: batches sent and not released
	readySent bool         // the trainer may send messages from now on
	// open are the epochs asked for (the first by the wire.Hello) whose end has not been
	// sent: open[0] is being streamed or is about to be. There are at most two: a
	// second epoch message abandons open[0].
	open       []epochReq
	abandoning bool               // open[0] is abandoned and its end not yet sent
	starving   time.Time          // since when the trainer has had no batch to take; zero when it has
	runs       uint64             // numbers the runs of epochs (one epoch may run twice) from 1
	cur        uint64             // the run of open[0], 0 before it starts
	cancelRun  context.CancelFunc // stops the run of open[0], nil before it starts
	dropRun    uint64             // the abandoned run whose end is being sent, 0 for none
}

// epochReq is an epoch the trainer asked for, and where it starts.
type epochReq struct {
	epoch int
	state *shardload.State // nil: at the epoch's start
}

// sent is a batch the session sent to the trainer.
type sent struct {
	b     *shardload.Batch
	epoch int
	run   uint64 // the epoch run it belongs to (the same epoch may be streamed twice)
}

// tally counts what a session sent in one epoch.
type tally struct {
	batches         int
	samples, padded int64
}

// run creates the ring, sends it, and streams epochs until the trainer leaves, the
// pipeline fails or the server stops. Everything it made is freed when it returns.
func (ss *session) run() error {
	s := ss.srv
	ctx, cancel := context.WithCancelCause(s.ctx)
	defer cancel(nil)

	var (
		ring *pinned.Ring
		l    *shardload.Loader
	)
	// The reader runs from the start, so that a trainer that leaves while the
	// dataset is being counted ends its session.
	readerDone := make(chan struct{})
	go func() {
		defer close(readerDone)
		ss.readLoop(ctx, cancel)
	}()
	defer func() {
		// The reader stops first: it releases batches, and the connection's wire.End
		// needs it gone.
		cancel(nil)
		<-readerDone
		if l != nil {
			l.Close()
			ss.tally.close(l)
		}
		ss.releaseAll()
		if ring != nil {
			ring.Close()
		}
	}()

	cfg := ss.cfg
	if cfg.Slabs > wire.MaxFDs {
		err := fmt.Errorf("%d slabs: a session passes at most %d descriptors", cfg.Slabs, wire.MaxFDs)
		ss.sendError(CodeBadRequest, err.Error())
		return err
	}
	infos, err := s.countAll(ctx, &cfg)
	if err != nil {
		return ss.fail(ctx, err)
	}
	if err := s.refuted.watch(ss, infos, cancel); err != nil {
		return ss.fail(ctx, err)
	}
	defer s.refuted.unwatch(ss)
	// The ring is sized from the batch and its fields (or as the hello or the
	// server says), and grows as a larger batch needs: a trainer of protocol 4 maps
	// a grown slab again; an older one cannot, so its slabs stay as made.
	if cfg.Fields, err = shardload.Fields(ctx, cfg, infos); err != nil {
		return ss.fail(ctx, err)
	}
	// The slabs are checked before they are made: a batch they cannot hold costs
	// the server nothing. The fields a hello named were checked at the hello; inferred
	// ones, and the size a ragged column's estimate gives the slabs, are checked here.
	slabBytes := shardload.SlabSize(cfg, infos, cfg.Fields)
	sized := cfg
	if cfg.SlabBytes == 0 {
		// An estimate beyond the limit starts at the limit: a batch larger fails
		// when it comes, as the library's would.
		slabBytes = min(slabBytes, cmp.Or(cfg.MaxSlabBytes, shardload.DefaultMaxSlabBytes))
		sized.SlabBytes = slabBytes
	}
	if err := checkBatch(sized, cfg.Fields); err != nil {
		var re *requestError
		if errors.As(err, &re) {
			ss.sendError(re.code, re.msg)
		} else {
			ss.sendError(CodeBadRequest, err.Error())
		}
		return err
	}
	if ss.version < 4 {
		cfg.MaxSlabBytes = max(slabBytes, cfg.SlabBytes)
	}
	ring, err = pinned.NewRing(pinned.Options{
		Slabs: cfg.Slabs, SlabBytes: slabBytes, NoLock: cfg.NoLock,
		Name: fmt.Sprintf("shardload-session%d", ss.id),
		Bind: ss.place.bind(),
		Warn: func(msg string) { s.opts.Logf("serve: session %d: warning: %s", ss.id, msg) },
	})
	if err != nil {
		ss.sendError(CodePipeline, err.Error())
		return err
	}
	ss.tally.setRing(ring)
	if ss.place.node >= 0 && !ring.Bound() {
		ss.place.msg.Node = -1
		ss.place.msg.Reason += fmt.Sprintf("; memory left unbound: the kernel did not bind the slabs to node %d (see the server's log)", ss.place.node)
	}
	cfg.Ring = ring
	if l, err = shardload.Open(ctx, cfg); err != nil {
		return ss.fail(ctx, err)
	}
	ss.tally.open(l, cfg.Epoch)
	plan, order := l.Plan(), l.Order()
	rd := wire.Ready{
		Type: wire.TypeReady, Version: ss.version, Session: ss.id, Slabs: len(ring.Slabs()), SlabBytes: ring.SlabBytes(),
		Fields: wire.Fields(l.Fields()), Epoch: cfg.Epoch, Batches: plan.Batches, Samples: int64(plan.Samples), Estimated: plan.Estimated, Shards: len(infos),
		Order:     wire.OrderInfo{Fingerprint: order.JobFingerprint(), Settings: wire.OrderSettings(order)},
		Placement: ss.place.msg,
	}
	if ss.version >= 4 {
		rd.Order.Fingerprint, rd.Order.Job = order.Fingerprint(), order.JobFingerprint()
		rd.EpochBatches = plan.Batches
		if st := cfg.Resume; st != nil && sameWorld(st.Runs, cfg.World) {
			rd.EpochBatches += st.Batches
		}
	}
	if ss.states {
		st := wire.State(l.State())
		rd.State = &st
	}
	fds := make([]int, len(ring.Slabs()))
	for i, sl := range ring.Slabs() {
		fds[i] = sl.FD()
	}
	ss.mu.Lock()
	ss.readySent = true
	ss.starveFrom(time.Now()) // the trainer waits for the first wire.Batch
	ss.mu.Unlock()
	if err := ss.write(rd, fds); err != nil {
		return errClientGone
	}
	// Fields are fixed for the session: later epochs decode what the first did.
	cfg.Fields = l.Fields()

	for {
		req, run, ectx, ecancel, ok := ss.nextEpoch(ctx)
		if !ok {
			return ss.fail(ctx, ctx.Err())
		}
		epoch := req.epoch
		var t tally
		err = nil
		if err = s.refuted.check(ss); err == nil && l == nil {
			cfg.Epoch, cfg.Resume = epoch, req.state
			if l, err = shardload.Open(ectx, cfg); err == nil {
				ss.tally.open(l, epoch)
			}
		}
		if err == nil {
			err = ss.stream(ectx, l, epoch, run, &t)
		}
		// An epoch message cancels ectx alone: that is no failure.
		if err != nil && (ectx.Err() == nil || ctx.Err() != nil) {
			ecancel()
			if errors.Is(err, errClientGone) {
				return err
			}
			s.refuted.refute(ss, err)
			return ss.fail(ctx, err)
		}
		abandoned := ss.endEpoch()
		ecancel()
		e := wire.End{Type: wire.TypeEnd, Epoch: epoch, Batches: t.batches, Samples: t.samples, Padded: t.padded, Abandoned: abandoned}
		if l != nil {
			st := l.Stats()
			e.Skipped = st.Skipped
			if ss.version >= 4 {
				e.Trimmed, e.Estimated = st.Trimmed, l.Plan().Estimated
				for _, s := range st.Streams {
					e.Streams = append(e.Streams, wire.StreamEnd{Samples: s.Samples, Bytes: s.BytesIn, Skipped: s.Skipped})
				}
			}
			if ss.states {
				st := wire.State(l.State())
				e.State = &st
			}
			// Stops the pipeline; the batches the trainer holds stay in the ring.
			l.Close()
			ss.tally.close(l)
			l = nil
		}
		if abandoned {
			ss.releaseRun(run)
		}
		ss.mu.Lock()
		ss.starveTo(time.Now()) // until the trainer asks for another epoch, it waits for nothing
		ss.mu.Unlock()
		err = ss.write(e, nil)
		ss.mu.Lock()
		ss.dropRun = 0
		ss.mu.Unlock()
		if err != nil {
			return errClientGone
		}
	}
}

// nextEpoch waits for an epoch to stream and returns it, the number of its run and
// the context that stops it: the session's, cancelled also when the trainer abandons
// the epoch. ok is false when the session ended first.
func (ss *session) nextEpoch(ctx context.Context) (req epochReq, run uint64, ectx context.Context, cancel context.CancelFunc, ok bool) {
	for {
		ss.mu.Lock()
		if len(ss.open) > 0 {
			ectx, cancel = context.WithCancel(ctx)
			ss.runs++
			ss.cur, ss.cancelRun = ss.runs, cancel
			if ss.abandoning {
				// Abandoned before it started: it ends at once, with no batches.
				cancel()
			}
			req, run = ss.open[0], ss.cur
			ss.mu.Unlock()
			return req, run, ectx, cancel, true
		}
		ss.mu.Unlock()
		select {
		case <-ss.wake:
		case <-ctx.Done():
			return epochReq{}, 0, nil, nil, false
		}
	}
}

// endEpoch decides how the epoch being streamed ends, and reports whether the trainer
// abandoned it. From here on, an epoch message no longer concerns it.
func (ss *session) endEpoch() (abandoned bool) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	abandoned = ss.abandoning
	if abandoned {
		// Until its end is sent, a release of its batches or another epoch
		// message is a protocol error.
		ss.dropRun = ss.cur
	}
	ss.open = ss.open[1:]
	ss.abandoning = false
	ss.cur, ss.cancelRun = 0, nil
	return abandoned
}

// stream sends the batches of one epoch, counting them in t.
func (ss *session) stream(ctx context.Context, l *shardload.Loader, epoch int, run uint64, t *tally) error {
	for {
		b, err := l.Next(ctx)
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		idx := b.Slab().Index()
		ss.mu.Lock()
		ss.held[idx] = sent{b: b, epoch: epoch, run: run}
		ss.starveTo(time.Now())
		ss.mu.Unlock()
		m := wire.Batch{
			Type: wire.TypeBatch, Epoch: epoch, Seq: b.Seq, Slab: idx, Rows: b.Rows, Padded: b.Padded,
			Used: b.Used, Columns: wire.Columns(&b.Layout),
		}
		if ss.states {
			st := wire.State(l.State())
			m.State = &st
		}
		if ss.version >= 4 {
			m.SlabBytes = b.Slab().Size()
			m.Backpressure = ss.tally.backpressure(l).Seconds()
		}
		if err := ss.write(m, nil); err != nil {
			return errClientGone
		}
		t.batches++
		t.samples += int64(b.Rows - b.Padded)
		t.padded += int64(b.Padded)
	}
}

// readLoop reads the trainer's messages until it leaves or the session ends:
// releases free slabs, an epoch message starts the next epoch (abandoning the current
// one when it has not ended), bye ends the session.
func (ss *session) readLoop(ctx context.Context, cancel context.CancelCauseFunc) {
	// A blocked read ends when the session does.
	stop := context.AfterFunc(ctx, func() { ss.conn.SetReadDeadline(time.Now()) })
	defer stop()
	buf := make([]byte, MaxMessage+1)
	for {
		msg, err := readMessage(ss.conn, buf)
		if err != nil {
			if ctx.Err() == nil {
				var re *requestError
				if errors.As(err, &re) {
					ss.protocolError(cancel, "%s", re.msg)
				} else {
					cancel(errClientGone)
				}
			}
			return
		}
		var env wire.Envelope
		if err := decodeMessage(msg, &env); err != nil {
			ss.protocolError(cancel, "%v", err)
			return
		}
		ss.mu.Lock()
		early := !ss.readySent
		ss.mu.Unlock()
		if early && env.Type != wire.TypeBye {
			ss.protocolError(cancel, "%q sent before the server's ready", env.Type)
			return
		}
		switch env.Type {
		case wire.TypeRelease:
			var r wire.Release
			if err := decodeMessage(msg, &r); err != nil {
				ss.protocolError(cancel, "release: %v", err)
				return
			}
			if err := ss.release(r); err != nil {
				ss.protocolError(cancel, "%v", err)
				return
			}
		case wire.TypeEpoch:
			var e wire.EpochRequest
			if err := decodeMessage(msg, &e); err != nil || e.Epoch < 0 {
				ss.protocolError(cancel, "epoch: want {\"type\": \"epoch\", \"epoch\": N >= 0}")
				return
			}
			req := epochReq{epoch: e.Epoch}
			if ss.states && e.State != nil {
				st := shardload.State(*e.State)
				epoch, err := checkState("epoch", e.Epoch, &st)
				if err != nil {
					ss.protocolError(cancel, "%v", err)
					return
				}
				req = epochReq{epoch: epoch, state: &st}
			}
			if err := ss.askEpoch(req); err != nil {
				ss.protocolError(cancel, "%v", err)
				return
			}
		case wire.TypeBye:
			cancel(errBye)
			return
		default:
			ss.protocolError(cancel, "unexpected message type %q", env.Type)
			return
		}
	}
}

// askEpoch queues the epoch a trainer asks for. When the epoch before it has not
// ended, that one is abandoned: its stream is stopped now.
func (ss *session) askEpoch(req epochReq) error {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.abandoning || ss.dropRun != 0 {
		return fmt.Errorf("epoch %d asked for before the end of the epoch it abandoned", req.epoch)
	}
	if len(ss.open) > 0 {
		ss.abandoning = true
		if ss.cancelRun != nil {
			ss.cancelRun()
		}
	}
	ss.open = append(ss.open, req)
	ss.starveFrom(time.Now())
	select {
	case ss.wake <- struct{}{}:
	default:
	}
	return nil
}

func (ss *session) protocolError(cancel context.CancelCauseFunc, format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	ss.sendError(CodeBadRequest, msg)
	cancel(fmt.Errorf("%w: %s", errProtocol, msg))
}

// release hands a slab the trainer is done with back to the ring.
func (ss *session) release(r wire.Release) error {
	ss.mu.Lock()
	h, ok := ss.held[r.Slab]
	switch {
	case !ok:
		ss.mu.Unlock()
		return fmt.Errorf("release of slab %d, which holds no batch of this trainer", r.Slab)
	case h.b.Seq != r.Seq || h.epoch != r.Epoch:
		ss.mu.Unlock()
		return fmt.Errorf("release of slab %d for batch %d of epoch %d, but it holds batch %d of epoch %d", r.Slab, r.Seq, r.Epoch, h.b.Seq, h.epoch)
	case ss.abandoning && h.run == ss.cur || h.run == ss.dropRun:
		ss.mu.Unlock()
		return fmt.Errorf("release of slab %d for batch %d of epoch %d, which the trainer abandoned: the server releases its batches", r.Slab, r.Seq, r.Epoch)
	}
	delete(ss.held, r.Slab)
	if r.Wait != nil {
		ss.tally.reportWait(time.Duration(*r.Wait * float64(time.Second)))
	}
	if len(ss.held) == 0 && len(ss.open) > 0 && !ss.abandoning {
		// Nothing more on its way to the trainer: it waits from now until the next
		// batch is sent (the server's view of its starvation, for trainers that do
		// not report their own).
		ss.starveFrom(time.Now())
	}
	ss.mu.Unlock()
	h.b.Release()
	return nil
}

// starveFrom notes that the trainer has no batch to take from t on; ss.mu held.
func (ss *session) starveFrom(t time.Time) {
	if ss.starving.IsZero() {
		ss.starving = t
		ss.tally.starveFrom(t)
	}
}

// starveTo notes that a batch reached the trainer at t; ss.mu held.
func (ss *session) starveTo(t time.Time) {
	if !ss.starving.IsZero() {
		ss.tally.starveTo(t)
		ss.starving = time.Time{}
	}
}

// sameWorld reports whether every run of a state's runs is of world ranks.
func sameWorld(runs string, world int) bool {
	rs, err := plan.ParseRuns(runs)
	if err != nil {
		return false
	}
	for _, r := range rs {
		if r.World != world {
			return false
		}
	}
	return true
}

// releaseRun releases the batches of an abandoned epoch run that the trainer had not
// released: those it holds, and those on their way to it.
func (ss *session) releaseRun(run uint64) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	for k, h := range ss.held {
		if h.run == run {
			h.b.Release()
			delete(ss.held, k)
		}
	}
}

func (ss *session) releaseAll() {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	for k, h := range ss.held {
		h.b.Release()
		delete(ss.held, k)
	}
}

// fail ends the session: it tells the trainer why, unless the trainer is the reason.
func (ss *session) fail(ctx context.Context, err error) error {
	if cause := context.Cause(ctx); ctx.Err() != nil {
		switch {
		case errors.Is(cause, errClientGone), errors.Is(cause, errBye), errors.Is(cause, errProtocol):
			return cause
		case errors.Is(cause, shardload.ErrCountMismatch):
			err = cause // another session found the count this one planned from wrong
		case ss.srv.ctx.Err() != nil:
			ss.sendError(CodeShutdown, "the shardload server is shutting down")
			return errShutdown
		}
	}
	code := CodePipeline
	if errors.Is(err, shardload.ErrResume) {
		code = CodeResume
	}
	ss.sendError(code, oneLine(err))
	return err
}

func (ss *session) sendError(code, msg string) { sendError(ss.conn, code, msg) }

func (ss *session) write(v any, fds []int) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if len(b) > MaxMessage {
		return fmt.Errorf("serve: message of %d bytes exceeds %d", len(b), MaxMessage)
	}
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	_, _, err = ss.conn.WriteMsgUnix(b, oob, nil)
	return err
}

// lingerTime bounds how long a connection's end waits for the trainer to close.
const lingerTime = time.Second

// linger ends a connection so that the trainer reads everything sent to it: closing a
// unix socket with unread messages would reset the connection, and the trainer would
// lose the last messages (an error that says why). It shuts down the sending side,
// reads what the trainer still sends until it closes or lingerTime passes, and closes.
func linger(c *net.UnixConn) {
	c.CloseWrite()
	c.SetReadDeadline(time.Now().Add(lingerTime))
	buf := make([]byte, MaxMessage+1)
	for {
		if _, err := c.Read(buf); err != nil {
			break
		}
	}
	c.Close()
}

// sendError sends an error message, best effort: the session ends after it. The
// secrets of the URLs it quotes are removed.
func sendError(c *net.UnixConn, code, msg string) {
	b, _ := json.Marshal(wire.ErrorMessage{Type: wire.TypeError, Code: code, Message: redact.String(msg)})
	c.SetWriteDeadline(time.Now().Add(time.Second))
	c.Write(b)
}

// readMessage reads one message into buf, which has room for MaxMessage+1 bytes so
// that a longer message is seen as such.
func readMessage(c *net.UnixConn, buf []byte) ([]byte, error) {
	n, err := c.Read(buf)
	if err != nil {
		return nil, err
	}
	if n == 0 {
		return nil, io.EOF
	}
	if n > MaxMessage {
		return nil, reject(CodeBadRequest, "message longer than %d bytes", MaxMessage)
	}
	return buf[:n], nil
}

func oneLine(err error) string {
	b := []byte(err.Error())
	for i, c := range b {
		if c == '\n' {
			b[i] = ' '
		}
	}
	return string(b)
}
