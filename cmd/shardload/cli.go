package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/spf13/pflag"

	"github.com/shardload/shardload/cache"
	"github.com/shardload/shardload/index"
	"github.com/shardload/shardload/logs"
	"github.com/shardload/shardload/mem"
	"github.com/shardload/shardload/redact"
	"github.com/shardload/shardload/shard"
	"github.com/shardload/shardload/source"
	"github.com/shardload/shardload/source/all"
)

// command is one subcommand: its flags are defined on fs, then run is called with the
// remaining arguments.
type command struct {
	name    string
	args    string // argument synopsis for the usage line
	short   string // one line for the command list
	summary string
	setup   func(fs *pflag.FlagSet) func(ctx context.Context, args []string, stdout, stderr io.Writer) error
}

var commands = []command{lsCommand, catCommand, warmCommand, indexCommand, benchCommand, planCommand, serveCommand, doctorCommand, genCommand, topCommand, versionCommand}

// errUsage marks errors in how the command was called (exit status 2).
var errUsage = errors.New("usage")

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "help" || args[0] == "-h" || args[0] == "--help" {
		if len(args) > 1 {
			return run(ctx, []string{args[1], "--help"}, stdout, stderr)
		}
		usage(stdout)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	if args[0] == "--version" {
		args = append([]string{"version"}, args[1:]...)
	}
	for _, c := range commands {
		if c.name != args[0] {
			continue
		}
		fs := pflag.NewFlagSet("shardload "+c.name, pflag.ContinueOnError)
		fs.SortFlags = false
		fs.SetOutput(stderr)
		runFn := c.setup(fs)
		fs.Usage = func() {
			fmt.Fprintf(stderr, "Usage: shardload %s [flags] %s\n\n%s\n\nFlags (each also set by SHARDLOAD_<FLAG> in the environment, e.g. SHARDLOAD_MAX_MEMBER_SIZE):\n%s",
				c.name, c.args, c.summary, fs.FlagUsages())
		}
		if err := fs.Parse(args[1:]); errors.Is(err, pflag.ErrHelp) {
			return 0
		} else if err != nil {
			fmt.Fprintf(stderr, "shardload %s: %s (see \"shardload %s --help\")\n", c.name, redact.String(err.Error()), c.name)
			return 2
		}
		err := bindEnv(fs)
		if f := fs.Lookup("log-format"); err == nil && f != nil {
			_, err = newLogger(f.Value.String(), io.Discard)
		}
		if err == nil {
			// What the commands print has the secrets of the URLs it quotes removed
			// (the user information, signatures and tokens of presigned URLs); cat's
			// output is the samples' bytes, left as they are.
			out := stdout
			if c.name != "cat" {
				out = redact.Writer(stdout)
			}
			err = runFn(ctx, fs.Args(), out, redact.Writer(stderr))
		}
		if err == nil {
			return 0
		}
		fmt.Fprintf(stderr, "shardload %s: %s\n", c.name, redact.String(oneLine(err)))
		if errors.Is(err, errUsage) {
			return 2
		}
		return 1
	}
	fmt.Fprintf(stderr, "shardload: unknown command %q (run \"shardload help\")\n", args[0])
	return 2
}

func usage(w io.Writer) {
	fmt.Fprintf(w, "shardload streams WebDataset tar shards from object storage (S3, GCS, HTTP) and local disk\ninto pinned batches for trainers.\n\nUsage: shardload COMMAND [flags] [args]\n\nCommands:\n")
	for _, c := range commands {
		fmt.Fprintf(w, "  %-7s %s\n", c.name, c.short)
	}
	fmt.Fprintf(w, "\nURLs: s3://bucket/key (AWS credential chain; AWS_ENDPOINT_URL for MinIO), gs://bucket/object\n(Application Default Credentials; STORAGE_EMULATOR_HOST), http(s)://..., file:///abs/path\nor a plain path; brace patterns such as 'train-{000000..000099}.tar' expand as in\nWebDataset, and a trailing / or a glob ('s3://bucket/train-*.tar') lists the objects.\nRun \"shardload COMMAND --help\".\n")
}

// oneLine keeps an error to one line so a user sees it whole.
func oneLine(err error) string {
	return strings.Join(strings.Fields(err.Error()), " ")
}

// bindEnv sets each flag not given on the command line from SHARDLOAD_<NAME>, where
// NAME is the flag's name upper-cased with dashes as underscores.
func bindEnv(fs *pflag.FlagSet) error {
	var err error
	fs.VisitAll(func(f *pflag.Flag) {
		if err != nil || f.Changed {
			return
		}
		name := "SHARDLOAD_" + strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_"))
		if v, ok := os.LookupEnv(name); ok {
			if e := fs.Set(f.Name, v); e != nil {
				err = fmt.Errorf("%s=%q: %v", name, v, e)
			}
		}
	})
	return err
}

// readFlags are the flags of every command that reads shards.
type readFlags struct {
	maxMember   byteSize
	cacheDir    string
	cacheDisk   byteSize
	cacheMemory byteSize
	cacheCheck  time.Duration // --cache-validate-within
	cachePolicy string        // --cache-policy
	partSize    byteSize
	parallel    int
	singleRate  float64 // MB/s
	attempts    int
	budget      time.Duration
	maxBackoff  time.Duration
	stall       time.Duration
	deadline    time.Duration
	minProgress byteSize
	maxRate     float64 // requests/s to one bucket or host
	indexDir    string
	noIndex     bool
	logFormat   string

	logOnce sync.Once
	log     func(format string, args ...any)
	once    sync.Once
	reg     *source.Registry // what shards are read through
	cache   *cache.Cache     // nil without --cache-dir
	first   string           // the first shard's URL, when known before sources: its client is built early
}

func (rf *readFlags) register(fs *pflag.FlagSet) {
	rf.maxMember = shard.DefaultMaxMemberSize
	fs.Var(&rf.maxMember, "max-member-size", "largest tar member held in memory; a larger one fails its sample (e.g. 64MiB, 1GiB)")
	fs.StringVar(&rf.cacheDir, "cache-dir", "", "directory of the node's shard cache, on local disk (entries in DIR/v1), shared by every shardload process of the node at once; remote shards are read through it, local files never (default: none, the cache is off)")
	rf.cacheDisk = cache.DefaultDiskBytes
	fs.Var(&rf.cacheDisk, "cache-disk", "byte budget of the cache's disk tier, data and metadata (with --cache-dir)")
	fs.Var(&rf.cacheMemory, "cache-memory", "byte budget of the cache's memory tier in this process (with --cache-dir; 0: none)")
	fs.StringVar(&rf.cachePolicy, "cache-policy", cache.DefaultPolicy.String(), "how the cache chooses what to evict and whether to keep a fetched shard (with --cache-dir): order (by next use: the loaders of the node announce their epochs' reads, and the shard needed furthest ahead goes first; best when the dataset is larger than the cache and reshuffled every epoch) or lru (least recently used first)")
	fs.DurationVar(&rf.cacheCheck, "cache-validate-within", cache.DefaultValidateWithin, "a check of a cached shard's version at its store (a Stat: an S3 HEAD) serves every open of that shard on the node, by any process sharing --cache-dir, for this long without asking the store again: a shard rewritten at the store is seen at most this much later (with --cache-dir; 0: ask on every open)")
	rf.partSize = source.DefaultPartSize
	fs.Var(&rf.partSize, "fetch-part-size", "remote objects (s3, gs, http) are read as ranged parts of this size")
	fs.IntVar(&rf.parallel, "fetch-parallel", source.DefaultParallel, "ranged parts in flight per remote shard; each holds --fetch-part-size of memory")
	fs.Float64Var(&rf.singleRate, "fetch-single-rate", source.DefaultSingleRate/1e6, "MB/s: a shard whose first part arrives this fast is read on as one stream, with no part buffers; slower ones as parallel parts (0: always parallel)")
	fs.DurationVar(&rf.budget, "retry-budget", source.DefaultRetryBudget, "a request to a remote store that keeps failing is retried (exponential backoff from 100ms with full jitter, up to --retry-max-backoff) for this long from its first failure, then fails: a store down for less costs a pause, logged when it starts and ends; a read resumes at its byte offset")
	fs.IntVar(&rf.attempts, "retry-attempts", source.DefaultAttempts, "most tries per request to a remote store, counting the first, within --retry-budget (0: no cap, the budget bounds them)")
	fs.DurationVar(&rf.maxBackoff, "retry-max-backoff", source.DefaultMaxBackoff, "longest wait between retries (exponential from 100ms, with jitter; Retry-After honoured up to 30s)")
	fs.DurationVar(&rf.stall, "stall-timeout", source.DefaultStallTimeout, "a remote read that delivers nothing for this long is ended and retried (negative: never)")
	fs.DurationVar(&rf.deadline, "retry-deadline", source.DefaultRetryDeadline, "a remote shard whose reads keep failing fails once it has spent this long waiting for the store since its first failure (the reader's own pauses not counted), naming the byte reached and the attempts made (0 or negative: no deadline)")
	rf.minProgress = source.DefaultMinProgress
	fs.Var(&rf.minProgress, "retry-min-progress", "a failed remote read that delivered at least this much since its last failure starts --retry-budget and --retry-attempts afresh; less counts against them (0: any progress does)")
	fs.Float64Var(&rf.maxRate, "max-request-rate", 0, "most requests per second this process sends to one bucket (S3, GCS) or host (HTTP), whatever the store says; under it the rate follows the store's throttling (503 SlowDown, 429) down and back up (0: no cap)")
	fs.StringVar(&rf.indexDir, "index-dir", index.DefaultStoreDir(), "the node's index store: the sample counts and offsets of every shard counted on this node, kept for later runs and other processes ($"+index.StoreDirEnv+")")
	fs.BoolVar(&rf.noIndex, "no-index-store", false, "neither read nor write the node's index store")
	fs.StringVar(&rf.logFormat, "log-format", "text", "log lines on stderr (warnings, the cache's and the loader's messages): text (a timestamp, the level and the message) or json (one object per line: time, level, msg)")
}

// logf returns the Logf of the command's log lines, on stderr in --log-format.
func (rf *readFlags) logf() func(format string, args ...any) {
	rf.logOnce.Do(func() {
		l, err := newLogger(rf.logFormat, redact.Writer(os.Stderr))
		if err != nil { // checked when the flags were parsed
			l, _ = newLogger("text", redact.Writer(os.Stderr))
		}
		rf.log = logs.Printf(l)
	})
	return rf.log
}

// remote returns a registry of the built-in backends with the fetch and retry flags'
// settings, without the cache.
func (rf *readFlags) remote() (*source.Registry, error) {
	fopts, err := rf.fetchOptions()
	if err != nil {
		return nil, err
	}
	reg := &source.Registry{}
	all.RegisterDefaults(reg, fopts)
	return reg, nil
}

// fetchOptions returns the remote backends' settings from the flags.
func (rf *readFlags) fetchOptions() (source.FetchOptions, error) {
	if rf.partSize <= 0 || rf.parallel <= 0 || rf.budget <= 0 || rf.maxBackoff <= 0 {
		return source.FetchOptions{}, fmt.Errorf("%w: --fetch-part-size, --fetch-parallel, --retry-budget and --retry-max-backoff must be more than 0", errUsage)
	}
	if rf.attempts < 0 {
		return source.FetchOptions{}, fmt.Errorf("%w: --retry-attempts must not be negative (0: no cap)", errUsage)
	}
	if rf.singleRate < 0 || rf.maxRate < 0 {
		return source.FetchOptions{}, fmt.Errorf("%w: --fetch-single-rate and --max-request-rate must not be negative", errUsage)
	}
	source.DefaultRateLimiter.SetMaxRate(rf.maxRate)
	single := rf.singleRate * 1e6
	if single == 0 {
		single = -1 // always parallel
	}
	deadline := rf.deadline
	if deadline <= 0 {
		deadline = -1 // none
	}
	minProgress := int64(rf.minProgress)
	if minProgress == 0 {
		minProgress = -1 // any progress
	}
	return source.FetchOptions{PartSize: int64(rf.partSize), Parallel: rf.parallel, SingleRate: single, RetryDeadline: deadline,
		Logf:  func(format string, args ...any) { rf.logf()("shardload: "+format, args...) },
		Retry: source.RetryPolicy{Attempts: rf.attempts, Budget: rf.budget, MaxBackoff: rf.maxBackoff, StallTimeout: rf.stall, MinProgress: minProgress}}, nil
}

// cacheOptions returns the cache's options from the flags.
func (rf *readFlags) cacheOptions() (cache.Options, error) {
	if rf.cacheDisk <= 0 {
		return cache.Options{}, fmt.Errorf("%w: --cache-disk must be more than 0", errUsage)
	}
	policy := cache.DefaultPolicy
	if rf.cachePolicy != "" {
		p, err := cache.ParsePolicy(rf.cachePolicy)
		if err != nil {
			return cache.Options{}, fmt.Errorf("%w: --cache-policy %q: want order or lru", errUsage, rf.cachePolicy)
		}
		policy = p
	}
	within := rf.cacheCheck
	if within <= 0 {
		within = -1 // a Stat on every open
	}
	return cache.Options{
		Dir: rf.cacheDir, DiskBytes: int64(rf.cacheDisk), MemoryBytes: int64(rf.cacheMemory), ValidateWithin: within, Policy: policy,
		Logf: func(format string, args ...any) {
			rf.logf()("shardload: "+strings.TrimSuffix(format, "\n"), args...)
		},
	}, nil
}

// sources returns the registry shards are read through: the built-in backends with
// the fetch and retry flags, and with --cache-dir the cache in front of them for every
// scheme but local files. A cache directory that cannot be used (read-only, locked by
// another process, not a directory) turns the cache off with one warning: local
// files are never cached, and remote shards are read straight from their source. If
// the flags are wrong, every open fails with the reason.
func (rf *readFlags) sources() *source.Registry {
	rf.once.Do(func() {
		var err error
		rf.reg, err = rf.remote()
		if err == nil && rf.first != "" {
			// The client of the first shard's source is built while the cache opens.
			source.Prepare(rf.reg, rf.first)
		}
		if err == nil && rf.cacheDir != "" {
			var opts cache.Options
			if opts, err = rf.cacheOptions(); err == nil {
				if reg, c, cerr := cache.Wrap(opts, rf.reg, "file"); cerr == nil {
					rf.reg, rf.cache = reg, c
				} else {
					opts.Logf("cache off: %v; remote shards are read straight from their source", cerr)
				}
			}
		}
		if err != nil {
			rf.reg = &source.Registry{}
			for _, scheme := range source.Default.Schemes() {
				rf.reg.Register(scheme, failingSource{err})
			}
		}
	})
	return rf.reg
}

// closeCache closes the cache, if one was opened.
func (rf *readFlags) closeCache() {
	if rf.cache != nil {
		rf.cache.Close()
	}
}

// failingSource fails every call with err.
type failingSource struct{ err error }

func (s failingSource) Stat(_ context.Context, url string) (source.Info, error) {
	return source.Info{}, &source.Error{Op: "stat", URL: url, Err: s.err}
}

func (s failingSource) Open(_ context.Context, url string) (io.ReadCloser, error) {
	return nil, &source.Error{Op: "open", URL: url, Err: s.err}
}

// eachShard expands the URL patterns and calls fn with a Reader of each shard in turn,
// made with opts (URL and MaxMemberSize set here). fn passes each sample Next returns
// to rec (nil without an index store): a shard fn reads to its end without an error
// has its entry kept in the node's index store, so that loaders on this node need not
// count it.
func eachShard(ctx context.Context, patterns []string, rf *readFlags, opts shard.Options, fn func(url string, r *shard.Reader, rec *index.Recorder) error) error {
	if len(patterns) == 0 {
		return fmt.Errorf("%w: no shard URLs given", errUsage)
	}
	urls, err := shard.ExpandAll(patterns)
	if err != nil {
		return err
	}
	defer rf.closeCache()
	if len(urls) > 0 {
		rf.first = urls[0]
	}
	if urls, err = rf.sources().Expand(ctx, urls); err != nil {
		return err
	}
	store := rf.indexStore()
	// The next shard is opened while this one is read: its request (or the cache's
	// validation of it) and its first bytes overlap the work on this one.
	type opened struct {
		body io.ReadCloser
		info source.Info // with a store: the object's version, taken before reading it
		err  error
	}
	open := func(url string) <-chan opened {
		ch := make(chan opened, 1)
		go func() {
			var info source.Info
			if store != nil {
				info, _ = rf.sources().Stat(ctx, url) // no version: nothing is kept
			}
			body, err := rf.sources().Open(ctx, url)
			ch <- opened{body, info, err}
		}()
		return ch
	}
	if len(urls) == 0 {
		return nil
	}
	var next <-chan opened
	defer func() {
		if next != nil {
			if o := <-next; o.body != nil {
				o.body.Close()
			}
		}
	}()
	next = open(urls[0])
	for i, url := range urls {
		o := <-next
		next = nil
		if o.err != nil {
			return o.err
		}
		if err := ctx.Err(); err != nil {
			o.body.Close()
			return err
		}
		if i+1 < len(urls) {
			next = open(urls[i+1])
		}
		opts.URL, opts.MaxMemberSize = url, int64(rf.maxMember)
		r := shard.NewReader(o.body, opts)
		var rec *index.Recorder
		if store != nil && o.info.Version != "" {
			rec = index.NewRecorder()
		}
		err := fn(url, r, rec)
		if err == nil && rec != nil {
			if perr := store.Put(rec.Info(url, r, o.info.Version, o.info.Size)); perr != nil {
				storeWarning.Do(func() { rf.logf()("shardload: warning: %v (entries are not kept)", perr) })
			}
		}
		r.Close()
		o.body.Close()
		if err != nil {
			return err
		}
	}
	return nil
}

// byteSize is a flag value in bytes that accepts suffixes: 512, 64KiB, 8MB, 1GiB, 2G.
type byteSize int64

func (b *byteSize) String() string { return formatBytes(int64(*b)) }

func (b *byteSize) Type() string { return "size" }

func (b *byteSize) Set(s string) error {
	v, err := parseBytes(s)
	if err != nil {
		return err
	}
	*b = byteSize(v)
	return nil
}

func parseBytes(s string) (int64, error) { return mem.ParseSize(s) }

func formatBytes(n int64) string { return mem.FormatSize(n) }

func sortedExts(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for e := range m {
		out = append(out, e)
	}
	sort.Strings(out)
	return out
}

// storeWarning says once that the index store cannot be written.
var storeWarning sync.Once

// indexStore returns the node's index store of the flags, or nil (--no-index-store,
// or a directory that cannot be made).
func (rf *readFlags) indexStore() *index.Store {
	if rf.noIndex || rf.indexDir == "" {
		return nil
	}
	s, err := index.Shared(rf.indexDir)
	if err != nil {
		storeWarning.Do(func() { rf.logf()("shardload: warning: %v (entries are not kept)", err) })
		return nil
	}
	return s
}
