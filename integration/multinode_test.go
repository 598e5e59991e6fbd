package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	sl "github.com/shardload/shardload"
	"github.com/shardload/shardload/internal/shardgen"
	"github.com/shardload/shardload/internal/testutil"
	"github.com/shardload/shardload/source"
	"github.com/shardload/shardload/source/s3"
)

var multinodeScript = func() string {
	p, _ := filepath.Abs("../client/python/tests/multinode_rank.py")
	return p
}()

// rankClient is one line of multinode_rank.py: what one client of a rank read.
type rankClient struct {
	Client          string
	Rank, World     int
	LocalRank       int `json:"local_rank"`
	Pid             int
	Session         int
	BatchesPerEpoch int `json:"batches_per_epoch"`
	SamplesPerEpoch int `json:"samples_per_epoch"`
	Estimated       bool
	Order           struct {
		Fingerprint string
		Settings    struct {
			Samples, World, Seed int
			DropLast             bool `json:"drop_last"`
		}
	}
	Batches []struct {
		Epoch, Seq, Rows, Padded int
		Keys                     []string
	}
	Ends []struct {
		Epoch, Batches, Samples, Skipped, Padded int
		Abandoned                                bool
	}
}

// sessionLine is the line serve logs when a trainer's session starts.
var sessionLine = regexp.MustCompile(`serve: session (\d+): pid (\d+) rank (\d+) of (\d+) \(local rank (\d+)\)`)

// TestMultiNode runs a job of two nodes on one machine, as a real one runs: two
// "shardload serve" processes (nodes A and B), each with its own socket, shard cache
// and index store, read one dataset from S3 (MinIO) with an index beside the shards;
// one world of four ranks, started as torchrun starts them (RANK, WORLD_SIZE,
// LOCAL_RANK, a gloo process group through which the clients compare their orders):
// ranks 0 and 1 on node A, 2 and 3 on node B, all at once. Each rank reads two epochs
// (drop_last False), then epoch 0 again with drop_last True. The dataset's 145
// samples do not divide by the world (one sample left out per epoch) nor the ranks'
// 36 by the batch size (a last batch of 4 rows, dropped with drop_last).
//
// Every sample of an epoch but the plan's Dropped reaches exactly one rank; every rank
// gets the same batches count and order fingerprint; each rank's batches are the Go
// library's for its rank; and each server served its own two ranks only.
func TestMultiNode(t *testing.T) {
	py := python(t)
	m := testutil.MinIO(t)
	const bucket = "multinode"
	m.CreateBucket(t, bucket)
	dir := t.TempDir()
	spec := shardgen.Spec{Shards: 6, Samples: []int{23, 31, 17, 29, 26, 19}, Prefix: "train"}
	putShards(t, m, bucket, "train", dir, spec)
	pattern := "s3://" + bucket + "/train/" + spec.Pattern()
	ok(t, m.Env(), "index", "--output", "s3://"+bucket+"/train/", pattern)
	all := samplesOf(t, filepath.Join(dir, spec.Pattern()))
	const (
		world  = 4
		seed   = 7
		batch  = 8
		epochs = 2
		total  = 23 + 31 + 17 + 29 + 26 + 19 // 145
	)
	if len(all) != total {
		t.Fatalf("the shards hold %d samples, want %d", len(all), total)
	}
	fieldSpecs := []string{"jpg", "label=cls:int"}
	// Small windows, so that ranks share windows and read parts of shards.
	pipeline := []string{"--shuffle-buffer", "40", "--open-shards", "3", "--slabs", "3", "--slab-size", "4MiB"}

	// The two nodes.
	type node struct {
		name  string
		srv   *server
		cache string
	}
	var nodes []*node
	for _, name := range []string{"A", "B"} {
		n := &node{name: name, cache: filepath.Join(t.TempDir(), "cache")}
		env := append(m.Env(), "SHARDLOAD_INDEX_DIR="+t.TempDir())
		n.srv = startServerEnv(t, env, "", append(append([]string{"--cache-dir", n.cache}, pipeline...), pattern)...)
		nodes = append(nodes, n)
	}

	// The four ranks, all at once.
	port := freePort(t)
	runs := make([]*checkRun, world)
	for rank := range world {
		n := nodes[rank/2]
		ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute) // a guard against a hang
		r := &checkRun{cancel: cancel}
		args := []string{multinodeScript, "--seed", strconv.Itoa(seed), "--batch-size", strconv.Itoa(batch),
			"--epochs", strconv.Itoa(epochs)}
		for _, f := range fieldSpecs {
			args = append(args, "--field", f)
		}
		r.cmd = exec.CommandContext(ctx, py, args...)
		r.cmd.Env = append(os.Environ(), "PYTHONDONTWRITEBYTECODE=1", "SHARDLOAD_SOCKET="+n.srv.socket,
			"MASTER_ADDR=127.0.0.1", "MASTER_PORT="+port, "GLOO_SOCKET_IFNAME=lo",
			"RANK="+strconv.Itoa(rank), "WORLD_SIZE="+strconv.Itoa(world), "LOCAL_RANK="+strconv.Itoa(rank%2))
		r.cmd.Stdout, r.cmd.Stderr = &r.stdout, &r.stderr
		if err := r.cmd.Start(); err != nil {
			cancel()
			t.Fatal(err)
		}
		t.Cleanup(func() { cancel(); r.cmd.Wait() })
		runs[rank] = r
	}
	results := make([][]map[string]json.RawMessage, world)
	errs := make([]error, world)
	var wg sync.WaitGroup
	for rank, r := range runs {
		wg.Go(func() { results[rank], errs[rank] = r.wait(t) })
	}
	wg.Wait()
	// got[kind][rank]: kind "full" (drop_last False, epochs 0 and 1), "drop_last".
	got := map[string][]rankClient{"full": make([]rankClient, world), "drop_last": make([]rankClient, world)}
	for rank, lines := range results {
		if errs[rank] != nil {
			t.Fatalf("rank %d: %v\nstdout: %s", rank, errs[rank], runs[rank].stdout.String())
		}
		if len(lines) != 2 {
			t.Fatalf("rank %d: %d lines, want 2: %v", rank, len(lines), lines)
		}
		for _, l := range lines {
			var c rankClient
			b, _ := json.Marshal(l)
			if err := json.Unmarshal(b, &c); err != nil {
				t.Fatalf("rank %d: %s: %v", rank, b, err)
			}
			if _, known := got[c.Client]; !known {
				t.Fatalf("rank %d: client %q", rank, c.Client)
			}
			got[c.Client][rank] = c
		}
	}

	// The servers, stopped: their logs are then complete.
	for _, n := range nodes {
		n.srv.cmd.Process.Signal(syscall.SIGTERM)
		if code := n.srv.wait(t); code != 0 {
			t.Errorf("node %s: exit status %d after SIGTERM; stderr: %s", n.name, code, n.srv.stderr)
		}
	}

	// The library reads the same objects, through a registry of this test's own: the
	// default one keeps the S3 client it made first, for the process's life.
	reg := &source.Registry{}
	reg.Register("file", &source.File{})
	reg.Register("s3", source.NewFetcher(&s3.Source{Client: m.Client}, source.FetchOptions{}))
	for _, tc := range []struct {
		kind     string
		dropLast bool
		epochs   int
	}{{"full", false, epochs}, {"drop_last", true, 1}} {
		t.Run(tc.kind, func(t *testing.T) {
			cfg := sl.Config{URLs: []string{pattern}, Fields: fields(t, fieldSpecs...), Seed: seed, BatchSize: batch,
				DropLast: tc.dropLast, ShuffleBuffer: 40, OpenShards: 3, World: world, NoIndexStore: true, Sources: reg,
				Logf: t.Logf}
			// The library's plan and order for rank 0: what every server should have.
			l, err := sl.Open(context.Background(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			plan, order := l.Plan(), l.Order()
			l.Close()
			if plan.Estimated || plan.Dropped != total%world {
				t.Fatalf("library plan: estimated %v, dropped %d; want exact counts and %d dropped", plan.Estimated, plan.Dropped, total%world)
			}
			perRank := (total / world)
			wantBatches := (perRank + batch - 1) / batch // 5: the last of 4 rows
			wantSamples := perRank
			if tc.dropLast {
				wantBatches = perRank / batch // 4
				wantSamples = wantBatches * batch
				if plan.DroppedInBatch != perRank%batch {
					t.Errorf("library plan: %d dropped in the last batch, want %d", plan.DroppedInBatch, perRank%batch)
				}
			}
			if plan.Batches != wantBatches {
				t.Fatalf("library plan: %d batches, want %d", plan.Batches, wantBatches)
			}

			clients := got[tc.kind]
			for rank, c := range clients {
				if c.Rank != rank || c.World != world || c.LocalRank != rank%2 {
					t.Errorf("rank %d: the client took rank %d, world %d, local rank %d from the environment", rank, c.Rank, c.World, c.LocalRank)
				}
				if c.Estimated || c.Order.Settings.Samples != total || c.Order.Settings.World != world ||
					c.Order.Settings.Seed != seed || c.Order.Settings.DropLast != tc.dropLast {
					t.Errorf("rank %d: estimated %v, order settings %+v", rank, c.Estimated, c.Order.Settings)
				}
				if c.Order.Fingerprint != order.Fingerprint() {
					t.Errorf("rank %d (node %s): order %s, the library's %s", rank, nodes[rank/2].name, c.Order.Fingerprint, order.Fingerprint())
				}
				// ready's samples are the plan's: the rank's slice, before drop_last.
				if c.BatchesPerEpoch != plan.Batches || c.SamplesPerEpoch != plan.Samples || plan.Samples != perRank {
					t.Errorf("rank %d: ready says %d batches of %d samples, the plan %d of %d (slice of %d)",
						rank, c.BatchesPerEpoch, c.SamplesPerEpoch, plan.Batches, plan.Samples, perRank)
				}
			}

			for e := range tc.epochs {
				union := map[string]int{}
				var libUnion []string
				for rank, c := range clients {
					var keys [][]string
					for _, b := range c.Batches {
						if b.Epoch != e {
							continue
						}
						if b.Seq != len(keys) || b.Padded != 0 || b.Rows != len(b.Keys) {
							t.Errorf("rank %d epoch %d: batch %d: seq %d, %d rows, %d keys, %d padded", rank, e, len(keys), b.Seq, b.Rows, len(b.Keys), b.Padded)
						}
						keys = append(keys, b.Keys)
					}
					what := fmt.Sprintf("rank %d (node %s) epoch %d", rank, nodes[rank/2].name, e)
					if len(keys) != wantBatches {
						t.Errorf("%s: %d batches, want %d", what, len(keys), wantBatches)
					}
					rows := 0
					for _, k := range keys {
						rows += len(k)
						for _, key := range k {
							if _, ok := all[key]; !ok {
								t.Fatalf("%s: key %q is no sample of the shards", what, key)
							}
							union[key]++
						}
					}
					if rows != wantSamples {
						t.Errorf("%s: %d samples, want %d", what, rows, wantSamples)
					}
					if e >= len(c.Ends) {
						t.Fatalf("%s: no end", what)
					}
					if end := c.Ends[e]; end.Epoch != e || end.Batches != len(keys) || end.Samples != rows || end.Skipped != 0 ||
						end.Padded != 0 || end.Abandoned {
						t.Errorf("%s: end %+v for %d batches of %d samples", what, end, len(keys), rows)
					}
					lc := cfg
					lc.Rank, lc.Epoch = rank, e
					want := libraryKeys(t, lc)
					sameKeys(t, what+" against the library", keys, want)
					for _, k := range want {
						libUnion = append(libUnion, k...)
					}
				}
				// Every sample once, but the plan's dropped ones (and, with drop_last,
				// each rank's last partial batch).
				for k, n := range union {
					if n != 1 {
						t.Errorf("epoch %d: sample %s read %d times", e, k, n)
					}
				}
				missing := total - len(union)
				wantMissing := plan.Dropped
				if tc.dropLast {
					wantMissing += world * plan.DroppedInBatch
				}
				if missing != wantMissing || plan.Dropped >= world {
					t.Errorf("epoch %d: %d of the %d samples read by no rank; the plan drops %d (+%d per rank in the last batch)",
						e, missing, total, plan.Dropped, plan.DroppedInBatch)
				}
				if !slices.Equal(slices.Sorted(func(yield func(string) bool) {
					for k := range union {
						if !yield(k) {
							return
						}
					}
				}), slices.Sorted(slices.Values(libUnion))) {
					t.Errorf("epoch %d: the ranks' samples are not the library's", e)
				}
			}
		})
	}

	// Each server served its own two ranks, two sessions each (one per client), and
	// the sessions are those its trainers were told of.
	for i, n := range nodes {
		type sess struct{ pid, rank, world, local int }
		logged := map[int]sess{}
		for _, m := range sessionLine.FindAllStringSubmatch(n.srv.stderr.String(), -1) {
			id, _ := strconv.Atoi(m[1])
			var s sess
			s.pid, _ = strconv.Atoi(m[2])
			s.rank, _ = strconv.Atoi(m[3])
			s.world, _ = strconv.Atoi(m[4])
			s.local, _ = strconv.Atoi(m[5])
			logged[id] = s
		}
		if len(logged) != 4 {
			t.Errorf("node %s logged %d sessions, want 4 (2 ranks x 2 clients): %s", n.name, len(logged), n.srv.stderr)
		}
		for _, s := range logged {
			if s.rank/2 != i || s.world != world || s.local != s.rank%2 {
				t.Errorf("node %s served rank %d of %d (local rank %d)", n.name, s.rank, s.world, s.local)
			}
		}
		for _, kind := range []string{"full", "drop_last"} {
			for rank := 2 * i; rank < 2*i+2; rank++ {
				c := got[kind][rank]
				if s, ok := logged[c.Session]; !ok || s.pid != c.Pid || s.rank != rank {
					t.Errorf("node %s: rank %d's %s session %d (pid %d): logged %+v (found %v)", n.name, rank, kind, c.Session, c.Pid, s, ok)
				}
			}
		}
		// Its own cache took the shards its ranks read.
		files := 0
		filepath.WalkDir(n.cache, func(_ string, d fs.DirEntry, err error) error {
			if err == nil && d.Type().IsRegular() {
				files++
			}
			return nil
		})
		if files == 0 {
			t.Errorf("node %s: nothing in its cache %s", n.name, n.cache)
		}
	}
}
