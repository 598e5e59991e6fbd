package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"

	"github.com/spf13/pflag"

	"github.com/shardload/shardload/serve"
)

var serveCommand = command{
	name:  "serve",
	short: "the loader process beside the trainers of a node (unix socket, shared slabs)",
	args:  "[URL...]",
	summary: `Serve trainer ranks on this node over a unix socket: each rank that connects (the
Python client in client/python) gets its own pipeline and a ring of page-locked
slabs, shared as memfds, into which its batches are collated; only small messages
cross the socket (protocol: docs/protocol.md). The URLs are the server's dataset; a
trainer may name other URLs only under a prefix given by --allow. The rank, world,
seed, epoch, batch size, drop_last and fields come from each trainer's hello; the
other pipeline flags below apply to every session. Before it listens, it checks that
the store serves its dataset (--check, within --start-timeout): with --allow alone,
the datasets come from the trainers, and the prefixes given are listed instead. Stops
on SIGTERM or SIGINT, removing its socket.`,
	setup: func(fs *pflag.FlagSet) func(context.Context, []string, io.Writer, io.Writer) error {
		var lf loaderFlags
		lf.register(fs, false) // the trainer's hello says its rank, world, seed, epoch and batching
		socket := fs.String("socket", defaultSocket(), "path of the unix socket; its directory is created with mode 0700")
		allow := fs.StringArray("allow", nil, "URL prefix trainers may ask for besides the server's URLs, repeatable (e.g. s3://bucket/train/, file:///data/shards/)")
		allowUIDs := fs.IntSlice("allow-uid", nil, "uids accepted besides the server's own, comma-separated")
		maxSessions := fs.Int("max-sessions", serve.DefaultMaxSessions, "trainers served at once; each holds --slabs slabs of page-locked memory (each one batch by default, or --slab-size), and --memory in all")
		place := fs.Bool("numa", true, "place each trainer's session on the NUMA node of its GPU (the GPU the client names, else its local rank as a CUDA device number): the session's loader threads on that node's CPUs, its slabs in that node's memory (nothing to do on one node)")
		maxShards := fs.Int("max-shards", serve.DefaultMaxShards, "shards one trainer may name in its hello, after brace expansion")
		maxDatasets := fs.Int("max-datasets", serve.DefaultMaxDatasets, "datasets whose sample counts the server keeps for later sessions (least recently used dropped)")
		metrics := fs.String("metrics", "", "serve Prometheus metrics on this TCP address at /metrics (e.g. 127.0.0.1:9400; :0 picks a port, printed at start): per session (label rank) samples, batches, bytes, stage seconds, wait; totals; the cache's hits, fetches, evictions and bytes per tier; and the probes /livez (200 while the process answers, whatever the store does) and /readyz (200 while the socket listens and the store answered for the dataset's first shard within 90s) (default: none)")
		withPprof := fs.Bool("pprof", false, "with --metrics on a loopback address, also serve Go's profiles at /debug/pprof there (they can hold URLs and credentials)")
		pprofAddr := fs.String("pprof-addr", "", "serve Go's profiles at /debug/pprof on this TCP address, loopback or not (no authentication: profiles can hold URLs and credentials)")
		check := fs.Bool("check", true, "before listening, ask the store for the dataset's first shard (and its --index; with --allow alone, a listing of each s3:// or gs:// prefix) and exit with what to fix when it does not answer as it should: a missing bucket or object, refused credentials, an endpoint that does not answer")
		packSpec := fs.String("pack", "", "pack the documents of a field into rows of tokens for every trainer that does not say otherwise (its pack=): FIELD:SEQ_LEN[:eos=ID][:pad=ID], over 1-D integer .npy members of indexed, uncompressed tar shards, or Megatron datasets (URLs ending in .idx, field tokens); batches hold input_ids, position_ids, cu_seqlens and max_seqlen (default: none, samples)")
		epochTokens := fs.Int64("epoch-tokens", 0, "with --pack and a mix of streams (--stream, --streams): an epoch's length in tokens, each stream's weight its share of them (0: what the streams give)")
		batchPolicy := fs.Bool("sched-batch", true, "run the loader's threads under SCHED_BATCH (Linux), so that they never delay a trainer that wakes on their CPU")
		return func(ctx context.Context, args []string, stdout, stderr io.Writer) error {
			if len(args) == 0 && len(*allow) == 0 && len(lf.streams) == 0 && lf.streamsFile == "" {
				return fmt.Errorf("%w: give the dataset's URLs, or --allow prefixes under which trainers name theirs", errUsage)
			}
			if *maxSessions < 1 || *maxDatasets < 1 || *maxShards < 1 {
				return fmt.Errorf("%w: --max-sessions %d, --max-datasets %d, --max-shards %d: want at least 1", errUsage, *maxSessions, *maxDatasets, *maxShards)
			}
			if *batchPolicy {
				if err := setBatchPolicy(); err != nil {
					fmt.Fprintf(stderr, "shardload serve: warning: threads left under the default scheduling policy: %v\n", err)
				}
			}
			cfg, err := lf.config(args, stderr)
			if err != nil {
				return err
			}
			if cfg.Pack, cfg.EpochTokens = *packSpec, *epochTokens; cfg.Pack != "" || cfg.EpochTokens != 0 {
				if err := cfg.Validate(); err != nil {
					return fmt.Errorf("%w: --pack, --epoch-tokens: %v", errUsage, err)
				}
				cfg.Fields = nil
			}
			setMemoryLimit(int64(*maxSessions) * cfg.MemoryBudget())
			logf := cfg.Logf
			opts := serve.Options{
				Socket: *socket, URLs: args, Allow: *allow, AllowUIDs: *allowUIDs,
				Pipeline: cfg, MaxSessions: *maxSessions, MaxDatasets: *maxDatasets, MaxShards: *maxShards, NoPlace: !*place, Logf: logf,
			}
			if *check {
				// The store itself, not the cache: a cached shard does not say that
				// the store answers.
				reg, err := lf.rf.remote()
				if err != nil {
					return err
				}
				if err := serve.Check(ctx, opts, reg, cfg.StartTimeout); err != nil {
					return err
				}
			}
			srv, err := serve.Listen(opts)
			if err != nil {
				return err
			}
			metricsAddr := ""
			var probes *health // /livez and /readyz, beside /metrics
			if *metrics != "" {
				reg, err := lf.rf.remote() // the store itself, not the cache
				if err != nil {
					srv.Close()
					return err
				}
				probes = newHealth(srv.Addr(), reg, cfg)
				defer probes.start()()
				addr, stop, err := serveMetrics(*metrics, *withPprof, srv.Stats, lf.rf.cache, stderr, probes.handle)
				if err != nil {
					srv.Close()
					return err
				}
				defer stop()
				metricsAddr = addr
			} else if *withPprof {
				srv.Close()
				return fmt.Errorf("%w: --pprof needs --metrics ADDR (or give --pprof-addr)", errUsage)
			}
			if *pprofAddr != "" {
				addr, stop, err := servePprof(*pprofAddr, stderr)
				if err != nil {
					srv.Close()
					return err
				}
				defer stop()
				fmt.Fprintf(stderr, "shardload serve: profiles on http://%s/debug/pprof/\n", addr)
			}
			fmt.Fprintf(stdout, "shardload serve: listening on %s (protocol version %d)\n", srv.Addr(), serve.Version)
			if metricsAddr != "" {
				fmt.Fprintf(stdout, "shardload serve: metrics on http://%s/metrics\n", metricsAddr)
			}
			if f, ok := stdout.(interface{ Sync() error }); ok {
				f.Sync()
			}
			probes.setServing(true)
			err = srv.Serve(ctx)
			probes.setServing(false)
			if err == nil {
				fmt.Fprintf(stdout, "shardload serve: stopped\n")
			}
			return err
		}
	},
}

// defaultSocket is $XDG_RUNTIME_DIR/shardload/loader.sock, or
// /tmp/shardload-UID/loader.sock without a runtime directory. The Python client
// computes the same default.
func defaultSocket() string {
	if d := os.Getenv("XDG_RUNTIME_DIR"); d != "" {
		return filepath.Join(d, "shardload", "loader.sock")
	}
	return filepath.Join(os.TempDir(), "shardload-"+strconv.Itoa(os.Getuid()), "loader.sock")
}
