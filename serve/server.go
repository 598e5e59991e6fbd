// Package serve is the loader process that runs beside the trainers of a node: it
// listens on a unix socket, runs one pipeline per trainer rank that connects, and
// hands each rank its batches in a ring of shared, page-locked slabs whose memfds it
// passes over the socket. Only small messages cross the socket; batch data never
// does. The protocol is written down in docs/protocol.md; Version is its version.
//
// The server decides which shards a trainer may read: its own dataset, and URLs under
// the prefixes of Options.Allow. It accepts peers of its own uid (checked with
// SO_PEERCRED) and those listed in Options.AllowUIDs.
//
// The sample counts of a dataset are counted once and shared by the sessions that read
// it: one count runs per dataset at a time, sessions on other datasets never wait for
// it, a count no session waits for any more is cancelled, and the counts of the
// Options.MaxDatasets datasets used last are kept.
//
// Each session is placed on the NUMA node of its trainer's GPU (package numa): the GPU
// the hello names by PCI address, else the one its local rank numbers in PCI bus
// order. The loader goroutines of the session run on that node's CPUs and its slabs
// are bound to that node's memory. A machine with one node, or a GPU whose node is not
// known, places nothing; the ready message and the log say what was done and why.
//
// A trainer may abandon an epoch part-way by asking for the next one: the server stops
// that epoch's pipeline, takes back the slabs of the batches it had sent, ends the
// epoch and streams the next.
package serve

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"os"
	"os/user"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/shardload/shardload"
	"github.com/shardload/shardload/index"
	"github.com/shardload/shardload/mem"
	"github.com/shardload/shardload/numa"
	"github.com/shardload/shardload/redact"
	"github.com/shardload/shardload/shard"
	"github.com/shardload/shardload/source"
)

// DefaultMaxSessions is Options.MaxSessions when zero.
const DefaultMaxSessions = 16

// DefaultMaxShards is Options.MaxShards when zero.
const DefaultMaxShards = 100_000

// DefaultHelloTimeout is Options.HelloTimeout when zero.
const DefaultHelloTimeout = 10 * time.Second

// DefaultMaxDatasets is Options.MaxDatasets when zero.
const DefaultMaxDatasets = 64

// Options configure a Server.
type Options struct {
	// Socket is the path of the unix socket. Its directory is created with mode 0700
	// when missing (0711 with AllowUIDs; removed by Close when the server created
	// it); an existing directory must belong to the server's user and not be writable
	// by others.
	Socket string
	// URLs is the server's dataset: shard URLs or brace patterns that a trainer
	// reads when its hello names none. A trainer may always name these exact URLs.
	URLs []string
	// Allow lists URL prefixes a trainer may ask for besides URLs, such as
	// "s3://bucket/train/" or "file:///data/shards/". A prefix matches whole path
	// segments. A URL is checked in the form its source uses (percent-decoded for
	// remote URLs; for files, with symbolic links resolved and "?", "#" and "%"
	// refused); "." and ".." segments are refused. Local files are only readable by
	// a trainer under a file:// prefix listed here.
	Allow []string
	// AllowUIDs are peer uids accepted besides the server's own. With any, the socket
	// is made connectable by every user (mode 0666, directory 0711), and the server
	// refuses, by their SO_PEERCRED uid, those not listed.
	AllowUIDs []int
	// Pipeline holds the settings of every session's pipeline: fields used when a
	// hello names none, shuffle buffer, workers, slab count and size, error policy,
	// sources (share one cached registry between sessions here). The hello sets the
	// rank, world, seed, epoch, batch size, drop_last and fields; a session that is
	// placed on a NUMA node gets that node's CPUs as CPUs (see Topology).
	Pipeline shardload.Config
	// MaxShards bounds the shards one trainer's hello may name, after brace
	// expansion (counted before anything is expanded). Default DefaultMaxShards.
	MaxShards int
	// MaxSessions bounds the trainers served at once. Default DefaultMaxSessions (16).
	MaxSessions int
	// MaxDatasets bounds the datasets whose sample counts the server keeps for later
	// sessions; the least recently used is dropped first. A dataset is a list of URLs
	// with an index (the server's own, or one a hello names). Failed counts are not
	// kept. Default DefaultMaxDatasets (64); negative is an error.
	MaxDatasets int
	// HelloTimeout bounds the wait for a client's hello. Default 10s.
	HelloTimeout time.Duration
	// Topology is the machine's, used to place each session on the NUMA node of its
	// trainer's GPU: the GPU at the hello's gpu_pci, else GPU local_rank in PCI bus
	// order (Topology.GPUs). When it is placed, the session's slabs are bound to the
	// node (numa.Bind) and its loader goroutines run on the node's CPUs
	// (shardload.Config.CPUs). A machine of one node, a GPU whose node is unknown and
	// a GPU the topology lacks place nothing, and do not fail the session. nil means
	// numa.Read("") at Listen (not read with NoPlace); when that fails, one line is
	// logged and no session is placed.
	Topology *numa.Topology
	// NoPlace turns placement off: sessions run on every CPU with memory where the
	// kernel puts it (the command line's --numa=false).
	NoPlace bool
	// Logf receives one line per session start (with its placement), end and failure,
	// and the sessions' warnings. Default: none.
	Logf func(format string, args ...any)
}

// Server serves trainer sessions on a unix socket.
type Server struct {
	opts    Options
	ln      *net.UnixListener
	madeDir bool

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup  // sessions
	own    map[string]bool // the expanded URLs of Options.URLs
	allow  []string        // Options.Allow, normalised
	slots  chan struct{}
	nextID atomic.Uint64
	active atomic.Int32

	topo    *numa.Topology // nil: no placement
	topoErr error          // why topo is nil when placement is on

	countMu  sync.Mutex
	counts   map[string]*list.Element // of *countEntry, sample counts per dataset
	lru      *list.List               // of *countEntry, most recently used first
	counting map[string]*countCall    // counts in flight, per dataset
	countWG  sync.WaitGroup           // counting goroutines

	mu      sync.Mutex
	closing bool // no session starts once set

	refuted refutations // counts found wrong while reading, stopping every session planned from them

	statsMu sync.Mutex
	live    map[uint64]*session // the sessions being served, for Stats
	ended   shardload.Stats     // the counters of the sessions that ended

	closeOnce sync.Once
	closeErr  error
}

// ErrAlreadyServing means another server answers on the socket path.
var ErrAlreadyServing = errors.New("serve: another server is listening on the socket")

// Listen creates the socket directory and the socket, recovering a stale socket file
// left by a server that was killed, and returns a Server ready to Serve.
func Listen(opts Options) (*Server, error) {
	if opts.Socket == "" {
		return nil, errors.New("serve: no socket path")
	}
	if opts.MaxSessions == 0 {
		opts.MaxSessions = DefaultMaxSessions
	}
	if opts.MaxSessions < 0 {
		return nil, fmt.Errorf("serve: max sessions %d < 0", opts.MaxSessions)
	}
	if opts.MaxDatasets == 0 {
		opts.MaxDatasets = DefaultMaxDatasets
	}
	if opts.MaxDatasets < 0 {
		return nil, fmt.Errorf("serve: max datasets %d < 0", opts.MaxDatasets)
	}
	if opts.MaxShards == 0 {
		opts.MaxShards = DefaultMaxShards
	}
	if opts.MaxShards < 0 || opts.MaxShards > shard.MaxExpansion {
		return nil, fmt.Errorf("serve: max shards %d outside [1, %d]", opts.MaxShards, shard.MaxExpansion)
	}
	if opts.HelloTimeout == 0 {
		opts.HelloTimeout = DefaultHelloTimeout
	}
	if opts.Logf == nil {
		opts.Logf = func(string, ...any) {}
	}
	// Every line the server logs has the secrets of the URLs it quotes removed.
	logf := opts.Logf
	opts.Logf = func(format string, args ...any) { logf("%s", redact.String(fmt.Sprintf(format, args...))) }
	if opts.Pipeline.Logf == nil {
		// The sessions' loaders log through the server's logger, not the log package.
		opts.Pipeline.Logf = opts.Logf
	}
	if err := opts.Pipeline.Validate(); err != nil {
		return nil, err
	}
	if ring, phys := opts.Pipeline.RingBytes(), mem.Physical(); int64(opts.MaxSessions) > math.MaxInt64/max(ring, 1) || (phys > 0 && int64(opts.MaxSessions)*ring > phys/2) {
		return nil, fmt.Errorf("serve: %d sessions of %d bytes of slabs each would hold more than half of this machine's memory (%d bytes): lower --max-sessions, --slabs or --slab-size", opts.MaxSessions, ring, phys)
	}
	var allow []string
	for _, p := range opts.Allow {
		if err := checkPrefix(p); err != nil {
			return nil, err
		}
		n, _ := normalize(p)
		allow = append(allow, n)
	}
	path, err := filepath.Abs(opts.Socket)
	if err != nil {
		return nil, err
	}
	opts.Socket = path
	if len(opts.URLs) > 0 {
		opts.Pipeline.URLs = opts.URLs
	}
	if len(opts.URLs) > 0 && len(opts.Pipeline.Streams) > 0 {
		return nil, errors.New("serve: the server's dataset is its URLs or its streams, not both")
	}
	madeDir, err := socketDir(filepath.Dir(path), len(opts.AllowUIDs) > 0)
	if err != nil {
		return nil, err
	}
	own := map[string]bool{}
	ownURLs := opts.URLs
	for _, st := range opts.Pipeline.Streams {
		// The server's own mix: its streams' shards are its own.
		ownURLs = append(slices.Clone(ownURLs), st.URLs...)
	}
	if len(ownURLs) > 0 {
		urls, err := shard.ExpandAll(ownURLs)
		if err != nil {
			return nil, err
		}
		for _, u := range urls {
			own[u] = true
		}
	}
	if err := recoverStale(path); err != nil {
		return nil, err
	}
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: path, Net: "unixpacket"})
	if err != nil {
		return nil, fmt.Errorf("serve: listen on %s: %w", path, err)
	}
	ln.SetUnlinkOnClose(true)
	// Only the owner (and root) can reach the socket; with AllowUIDs, every user can
	// connect, and the server serves those whose uid (SO_PEERCRED) it allows.
	sockMode := os.FileMode(0o600)
	if len(opts.AllowUIDs) > 0 {
		sockMode = 0o666
	}
	if err := os.Chmod(path, sockMode); err != nil {
		ln.Close()
		return nil, fmt.Errorf("serve: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Server{
		opts: opts, ln: ln, madeDir: madeDir, ctx: ctx, cancel: cancel, own: own, allow: allow,
		slots:    make(chan struct{}, opts.MaxSessions),
		counts:   map[string]*list.Element{},
		lru:      list.New(),
		counting: map[string]*countCall{},
	}
	// Every fetch of the server's sessions follows HTTP redirects only within what a
	// trainer may ask for: a redirect from an allowed prefix to anywhere else is
	// refused. Redirects from the server's own URLs are the operator's choice.
	s.ctx = source.WithRedirectCheck(s.ctx, func(from, to string) error {
		if s.own[from] {
			return nil
		}
		return s.allowed(to)
	})
	if !opts.NoPlace {
		s.topo = opts.Topology
		if s.topo == nil {
			if s.topo, s.topoErr = numa.Read(""); s.topoErr != nil {
				s.topo = nil
				opts.Logf("serve: no NUMA placement of sessions: reading the topology: %v", oneLine(s.topoErr))
			}
		}
	}
	return s, nil
}

// socketDir makes dir with mode 0700 (0711 when shared: other users may then reach
// a socket in it, and the server tells them apart by their uid), or checks that an
// existing one is a directory of the server's own user that no other user can write
// to (giving it the search bit for others when shared). It reports whether it
// created dir.
func socketDir(dir string, shared bool) (bool, error) {
	mode := os.FileMode(0o700)
	if shared {
		mode = 0o711
	}
	err := os.Mkdir(dir, mode)
	if err == nil {
		return true, os.Chmod(dir, mode) // the umask may have taken bits away
	}
	if !errors.Is(err, os.ErrExist) {
		return false, fmt.Errorf("serve: socket directory: %w", err)
	}
	fi, err := os.Lstat(dir)
	if err != nil {
		return false, fmt.Errorf("serve: socket directory: %w", err)
	}
	if !fi.IsDir() {
		return false, fmt.Errorf("serve: socket directory %s is not a directory", dir)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return false, nil
	}
	if int(st.Uid) != os.Getuid() {
		return false, fmt.Errorf("serve: socket directory %s belongs to %s, not to this server's user (uid %d): another user could replace the socket; use a directory of your own (--socket, or $XDG_RUNTIME_DIR)", dir, userName(int(st.Uid)), os.Getuid())
	}
	if fi.Mode()&0o022 != 0 {
		return false, fmt.Errorf("serve: socket directory %s (mode %v) is writable by other users; use a directory of your own", dir, fi.Mode().Perm())
	}
	if shared && fi.Mode()&0o001 == 0 {
		if err := os.Chmod(dir, fi.Mode().Perm()|0o011); err != nil {
			return false, fmt.Errorf("serve: socket directory %s: letting the --allow-uid users in: %w", dir, err)
		}
	}
	return false, nil
}

// userName names uid for a message: "uid 65534 (nobody)".
func userName(uid int) string {
	if u, err := user.LookupId(strconv.Itoa(uid)); err == nil {
		return fmt.Sprintf("uid %d (%s)", uid, u.Username)
	}
	return fmt.Sprintf("uid %d", uid)
}

// recoverStale removes a socket file that no server answers on. A live server, or a
// file that is not a socket, is an error.
func recoverStale(path string) error {
	fi, err := os.Lstat(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	if fi.Mode()&os.ModeSocket == 0 {
		return fmt.Errorf("serve: %s exists and is not a socket; not removing it", path)
	}
	c, err := net.DialTimeout("unixpacket", path, time.Second)
	if err == nil {
		c.Close()
		return fmt.Errorf("%w: %s", ErrAlreadyServing, path)
	}
	if !errors.Is(err, syscall.ECONNREFUSED) {
		return fmt.Errorf("serve: checking for a server on %s: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("serve: removing stale socket: %w", err)
	}
	return nil
}

// Addr returns the socket's path.
func (s *Server) Addr() string { return s.opts.Socket }

// Sessions returns the number of trainer sessions being served.
func (s *Server) Sessions() int { return int(s.active.Load()) }

// Serve accepts trainers until ctx is done or Close is called, then shuts down as
// Close does. It returns nil after a shutdown and the listener's error otherwise.
func (s *Server) Serve(ctx context.Context) error {
	stop := context.AfterFunc(ctx, func() { s.Close() })
	defer stop()
	for {
		c, err := s.ln.AcceptUnix()
		if err != nil {
			if s.ctx.Err() != nil {
				// Close has begun: wait until it has finished.
				s.Close()
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			s.Close()
			return fmt.Errorf("serve: accept: %w", err)
		}
		s.mu.Lock()
		if s.closing {
			s.mu.Unlock()
			c.Close()
			continue
		}
		s.wg.Add(1)
		s.mu.Unlock()
		go func() {
			defer s.wg.Done()
			s.handle(c)
		}()
	}
}

// Close stops accepting, ends every session (each trainer gets a shutdown message,
// its batches are released and its slabs freed), waits for them, and removes the
// socket and the directory the server created. It is idempotent.
func (s *Server) Close() error {
	s.closeOnce.Do(func() {
		s.mu.Lock()
		s.closing = true
		s.mu.Unlock()
		s.cancel()
		s.closeErr = s.ln.Close()
		s.wg.Wait()
		s.countWG.Wait() // the counts were cancelled with s.ctx
		if s.madeDir {
			if err := os.Remove(filepath.Dir(s.opts.Socket)); err != nil && !errors.Is(err, os.ErrNotExist) && s.closeErr == nil {
				s.closeErr = err
			}
		}
	})
	return s.closeErr
}

// countEntry is the sample counts of one dataset, kept for later sessions, and the
// version of the index they were taken with (see indexVersion).
type countEntry struct {
	key   string
	infos []shard.Info
	index string
}

// countCall is a count in flight, shared by the sessions that wait for it.
type countCall struct {
	done    chan struct{} // closed when infos and err are set
	infos   []shard.Info
	err     error
	waiters int                // sessions waiting; the count is cancelled when none is left
	cancel  context.CancelFunc // cancels the count
}

// count returns the sample counts of a dataset. A dataset is counted once while its
// counts are kept (Options.MaxDatasets), by one count at a time that the sessions
// asking for it share; sessions on other datasets do not wait for it. The wait ends
// with ctx; the count is cancelled when no session waits for it any more.
func (s *Server) count(ctx context.Context, cfg shardload.Config) ([]shard.Info, error) {
	key := countKey(cfg)
	// Each session plans from the index as it is now: one written (or rewritten)
	// since the counts were kept makes them stale.
	version := indexVersion(ctx, cfg)
	s.countMu.Lock()
	if e, ok := s.counts[key]; ok {
		if ce := e.Value.(*countEntry); ce.index == version {
			s.lru.MoveToFront(e)
			s.countMu.Unlock()
			return ce.infos, nil
		}
		s.lru.Remove(e)
		delete(s.counts, key)
	}
	c, ok := s.counting[key]
	if !ok {
		// The count belongs to no session: it ends with the server, or when no
		// session waits for it.
		cctx, cancel := context.WithCancel(s.ctx)
		c = &countCall{done: make(chan struct{}), cancel: cancel}
		s.counting[key] = c
		s.countWG.Add(1)
		go func() {
			defer s.countWG.Done()
			defer cancel()
			infos, err := countSafely(cctx, cfg)
			s.countMu.Lock()
			defer s.countMu.Unlock()
			if s.counting[key] == c {
				delete(s.counting, key)
			}
			if err == nil {
				s.keepCount(key, infos, version)
			}
			c.infos, c.err = infos, err
			close(c.done)
		}()
	}
	c.waiters++
	s.countMu.Unlock()

	select {
	case <-c.done:
		return c.infos, c.err
	case <-ctx.Done():
	}
	s.countMu.Lock()
	defer s.countMu.Unlock()
	c.waiters--
	select {
	case <-c.done:
		// Finished meanwhile: the result is good for this session too, but it is
		// leaving anyway.
	default:
		if c.waiters == 0 {
			c.cancel()
			// A session that comes later starts a count of its own.
			if s.counting[key] == c {
				delete(s.counting, key)
			}
		}
	}
	return nil, context.Cause(ctx)
}

// countAll counts cfg's dataset, or each of its streams (exactly: a mix is planned
// from exact counts), and sets cfg's Shards or its streams'. It returns all the
// shards.
func (s *Server) countAll(ctx context.Context, cfg *shardload.Config) ([]shard.Info, error) {
	if cfg.Pack != "" {
		return nil, nil // a packed epoch is planned from the documents' sizes by its loader
	}
	if len(cfg.Streams) == 0 {
		infos, err := s.count(ctx, *cfg)
		cfg.Shards = infos
		return infos, err
	}
	var all []shard.Info
	cfg.Streams = slices.Clone(cfg.Streams)
	for i := range cfg.Streams {
		c := *cfg
		c.URLs, c.Streams, c.CountFirst = cfg.Streams[i].URLs, nil, true
		infos, err := s.count(ctx, c)
		if err != nil {
			return nil, err
		}
		cfg.Streams[i].Shards = infos
		all = append(all, infos...)
	}
	return all, nil
}

// countKey names the dataset of cfg: its URLs and index, and whether a job of one
// rank asks (it may plan from the node's index store, see shardload.Shards).
func countKey(cfg shardload.Config) string {
	return strings.Join(cfg.URLs, "\x00") + "\x00" + cfg.Index + fmt.Sprintf("\x00%v\x00%v", cfg.World <= 1, cfg.CountFirst)
}

// indexVersion names the version of the index a session of cfg plans from (its
// Index, else the one beside its shards): the object's version, "absent", or the
// error of looking, so that an index written or rewritten since is seen.
func indexVersion(ctx context.Context, cfg shardload.Config) string {
	name := cfg.Index
	if name == "" {
		urls, err := shard.ExpandAll(cfg.URLs)
		if err != nil {
			return "error"
		}
		if name = index.Beside(urls); name == "" {
			return "none"
		}
	}
	sources := cfg.Sources
	if sources == nil {
		sources = source.Default
	}
	info, err := sources.Stat(ctx, name)
	switch {
	case errors.Is(err, source.ErrNotFound):
		return "absent"
	case err != nil:
		return "error: " + err.Error()
	}
	return fmt.Sprintf("%s %d", info.Version, info.Size)
}

// countSafely is shardload.Shards, with a panic made its error.
func countSafely(ctx context.Context, cfg shardload.Config) (infos []shard.Info, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("serve: internal error (panic) while counting the dataset: %v\n%s", r, debug.Stack())
		}
	}()
	return shardload.Shards(ctx, cfg)
}

// keepCount keeps a dataset's counts, dropping the least recently used beyond
// MaxDatasets. countMu must be held.
func (s *Server) keepCount(key string, infos []shard.Info, version string) {
	if e, ok := s.counts[key]; ok {
		ce := e.Value.(*countEntry)
		ce.infos, ce.index = infos, version
		s.lru.MoveToFront(e)
		return
	}
	s.counts[key] = s.lru.PushFront(&countEntry{key: key, infos: infos, index: version})
	for s.lru.Len() > s.opts.MaxDatasets {
		e := s.lru.Back()
		s.lru.Remove(e)
		delete(s.counts, e.Value.(*countEntry).key)
	}
}
