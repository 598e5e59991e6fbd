package serve

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"runtime/debug"
	"strings"
	"sync"
	"time"

	"github.com/shardload/shardload"
	"github.com/shardload/shardload/pinned"
	"github.com/shardload/shardload/plan"
	"github.com/shardload/shardload/wire"
)

// Causes of a session's wire.End, other than the pipeline's errors.
var (
	errClientGone = errors.New("serve: trainer disconnected")
	errBye        = errors.New("serve: trainer said bye")
	errShutdown   = errors.New("serve: server shutting down")
)

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
	return fmt.Sprintf("%s%s%s", rates(st, sec), streamFigures(st.Streams), cacheFigures(st.Cache))
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
	hints   *EpochHints  // the session's reads, announced to the node's cache

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
	ctx = ss.tally.reads(ctx) // the cache counts what it serves the session

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
	// The session's reads, announced to the node's cache so that it evicts by next
	// use; withdrawn when the session ends.
	ss.hints = NewEpochHints(fmt.Sprintf("serve session %d rank %d", ss.id, cfg.Rank), func(format string, args ...any) {
		s.opts.Logf("serve: session %d: "+format, append([]any{ss.id}, args...)...)
	})
	defer ss.hints.Close()
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
	// Each epoch's reads are announced to the cache before its first.
	cfg.Planned = func(p plan.Plan) { ss.hints.OpenPlan(p, cfg.Sources) }
	if l, err = shardload.Open(ctx, cfg); err != nil {
		return ss.fail(ctx, err)
	}
	ss.tally.open(l, cfg.Epoch)
	plan, order := l.Plan(), l.Order()
	rd := wire.Ready{
		Type: wire.TypeReady, Version: ss.version, Session: ss.id, Slabs: len(ring.Slabs()), SlabBytes: ring.SlabBytes(),
		Fields: wire.Fields(l.Fields()), Epoch: cfg.Epoch, Batches: plan.Batches, Samples: int64(plan.Samples), Estimated: plan.Estimated, Shards: len(infos),
		Order:     wire.OrderInfo{Fingerprint: order.JobFingerprint(), Settings: order},
		Placement: ss.place.msg,
	}
	if ss.version >= 4 {
		rd.Order.Fingerprint, rd.Order.Job = order.Fingerprint(), order.JobFingerprint()
		rd.EpochBatches = plan.Batches
		if st := cfg.Resume; st != nil && sameWorld(st.Runs, cfg.World) {
			rd.EpochBatches += st.Batches
		}
		if step := int64(max(order.World, 1)) * int64(order.BatchSize); cfg.Pack != "" && step > 0 {
			// Packed rows are dealt World*BatchSize at a time from the epoch's first,
			// whatever world a resumed state was taken at.
			rd.EpochBatches = int((order.Samples + step - 1) / step)
		}
	}
	if ss.states {
		st := l.State()
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
				st := l.State()
				e.State = &st
			}
			// Stops the pipeline; the batches the trainer holds stay in the ring.
			l.Close()
			ss.tally.close(l)
			l = nil
		}
		ss.logEpochCache(epoch)
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
			st := l.State()
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
		ss.hints.Batch(int(t.batches))
		t.samples += int64(b.Rows - b.Padded)
		t.padded += int64(b.Padded)
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
