package integration

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/shardload/shardload/internal/shardgen"
	"github.com/shardload/shardload/internal/testutil"
)

// The images scripts/images.sh builds (`make images`); the test runs them as they are.
var (
	loaderImage  = "shardload:local"
	trainerImage = "shardload-trainer:local"
	minioImage   = "shardload-minio:" + testutil.MinIOVersion
)

// mnTimeout bounds every wait of the multi-node test for one thing to happen (a
// container to answer, a rank to reach a point): a hang fails the test instead of
// running into go test's deadline.
const mnTimeout = 3 * time.Minute

// The job every case runs: 32 shards of 16 samples (512, divisible by the world, so
// every sample is read in every epoch), four ranks, batches of 8: 16 per rank and
// epoch.
const (
	mnWorld   = 4
	mnBatch   = 8
	mnSeed    = 11
	mnShards  = 32
	mnSamples = 16
	mnBucket  = "multinode"
)

// inCIEnv reports whether CI is set to something other than false or 0.
func inCIEnv() bool {
	ci := strings.ToLower(os.Getenv("CI"))
	return ci != "" && ci != "false" && ci != "0"
}

// requireDocker fails the test in CI, and skips it with one line elsewhere, when
// Docker does not answer or the images are not built.
func requireDocker(t *testing.T) {
	t.Helper()
	missing := func(msg string) {
		if inCIEnv() {
			t.Fatal(msg)
		}
		t.Skip("SKIPPED, NOT TESTED: " + msg)
	}
	if _, err := exec.LookPath("docker"); err != nil {
		missing("docker is not installed: the multi-node container test needs Docker")
	}
	if out, err := exec.Command("docker", "info", "--format", "{{.ServerVersion}}").CombinedOutput(); err != nil {
		missing(fmt.Sprintf("docker info: %v: %s", err, strings.TrimSpace(string(out))))
	}
	for _, img := range []string{loaderImage, trainerImage, minioImage} {
		if err := exec.Command("docker", "image", "inspect", img).Run(); err != nil {
			missing(fmt.Sprintf("image %s not built: run scripts/images.sh (make images)", img))
		}
	}
}

// dockerCmd runs the docker command line and returns its trimmed output.
func dockerCmd(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), mnTimeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, "docker", args...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("docker %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return strings.TrimSpace(string(out)), nil
}

// mustDocker runs the docker command line and fails the test on error.
func mustDocker(t *testing.T, args ...string) string {
	t.Helper()
	out, err := dockerCmd(args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// mnCluster is the part of the job every case shares: a private network and MinIO
// (a container on it, also published on 127.0.0.1 for the test's own uploads) with
// the indexed dataset.
type mnCluster struct {
	prefix  string // of every container, volume and network name
	network string
	minio   string
	env     []string            // the loader's S3 settings, as -e arguments
	pattern string              // the dataset's URL pattern
	memlock bool                // whether the daemon may lift memlock (else serve's slabs go unlocked)
	samples map[string]struct{} // its keys
}

// newCluster starts MinIO on a network of its own, uploads the dataset and indexes it.
func newCluster(t *testing.T) *mnCluster {
	t.Helper()
	b := make([]byte, 4)
	rand.Read(b)
	c := &mnCluster{prefix: "shardload-mn-" + hex.EncodeToString(b)}
	c.network = c.prefix + "-net"
	c.minio = c.prefix + "-minio"
	secret := hex.EncodeToString(b) + "-secret"
	mustDocker(t, "network", "create", c.network)
	t.Cleanup(func() { dockerCmd("network", "rm", c.network) })
	mustDocker(t, "run", "-d", "--name", c.minio, "--network", c.network, "--network-alias", "minio",
		"-p", "127.0.0.1::9000", "-e", "MINIO_ROOT_USER=shardload", "-e", "MINIO_ROOT_PASSWORD="+secret,
		"-v", c.minio+":/data", minioImage)
	t.Cleanup(func() {
		if t.Failed() {
			out, _ := dockerCmd("logs", "--tail", "30", c.minio)
			t.Logf("MinIO's log tail:\n%s", out)
		}
		dockerCmd("rm", "-f", "-v", c.minio)
		dockerCmd("volume", "rm", c.minio)
	})
	_, err := dockerCmd("run", "--rm", "--network", "none", "--ulimit", "memlock=-1", "--entrypoint", "/bin/true", loaderImage)
	c.memlock = err == nil
	if !c.memlock {
		t.Logf("this Docker daemon may not lift memlock: the serves run with its limit (slabs beyond it unlocked)")
	}
	c.env = []string{"-e", "AWS_ENDPOINT_URL=http://minio:9000", "-e", "AWS_REGION=" + testutil.Region,
		"-e", "AWS_ACCESS_KEY_ID=shardload", "-e", "AWS_SECRET_ACCESS_KEY=" + secret, "-e", "AWS_EC2_METADATA_DISABLED=true"}

	// The test reaches MinIO through its published port.
	hostPort := mustDocker(t, "port", c.minio, "9000/tcp")
	hostPort = strings.Fields(hostPort)[0]
	m := &testutil.MinIOServer{Endpoint: "http://" + hostPort, AccessKey: "shardload", SecretKey: secret}
	m.Client = s3.New(s3.Options{
		Region: testutil.Region, BaseEndpoint: aws.String(m.Endpoint), UsePathStyle: true,
		Credentials:                credentials.NewStaticCredentialsProvider(m.AccessKey, m.SecretKey, ""),
		RequestChecksumCalculation: aws.RequestChecksumCalculationWhenRequired,
		ResponseChecksumValidation: aws.ResponseChecksumValidationWhenRequired,
	})
	waitFor(t, "MinIO in its container", func() error {
		_, err := m.Client.ListBuckets(t.Context(), &s3.ListBucketsInput{})
		return err
	})
	m.CreateBucket(t, mnBucket)
	dir := t.TempDir()
	var sizes []int
	for range mnShards {
		sizes = append(sizes, mnSamples)
	}
	spec := shardgen.Spec{Shards: mnShards, Samples: sizes, Prefix: "train"}
	putShards(t, m, mnBucket, "train", dir, spec)
	c.pattern = "s3://" + mnBucket + "/train/" + spec.Pattern()
	ok(t, m.Env(), "index", "--output", "s3://"+mnBucket+"/train/", c.pattern)
	c.samples = map[string]struct{}{}
	for k := range samplesOf(t, filepath.Join(dir, spec.Pattern())) {
		c.samples[k] = struct{}{}
	}
	if len(c.samples) != mnShards*mnSamples {
		t.Fatalf("the dataset holds %d samples, want %d", len(c.samples), mnShards*mnSamples)
	}
	return c
}

// waitFor calls f until it succeeds, failing the test after mnTimeout.
func waitFor(t *testing.T, what string, f func() error) {
	t.Helper()
	deadline := time.Now().Add(mnTimeout)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not ready after %v: %v", what, mnTimeout, err)
		}
		<-tick.C
	}
}

// mnNode is one "node" of the job: its serve container with its socket volume and
// cache volume.
type mnNode struct {
	name              string
	serve, run, cache string
	c                 *mnCluster
}

// newNode names a node's container and volumes and removes them when the test ends.
func (c *mnCluster) newNode(t *testing.T, kase, name string) *mnNode {
	p := c.prefix + "-" + kase + "-" + name
	n := &mnNode{name: name, serve: p + "-serve", run: p + "-run", cache: p + "-cache", c: c}
	t.Cleanup(func() {
		if t.Failed() {
			out, _ := dockerCmd("logs", "--tail", "40", n.serve)
			t.Logf("node %s: serve's log tail:\n%s", n.name, out)
		}
		dockerCmd("rm", "-f", "-v", n.serve)
		dockerCmd("volume", "rm", n.run, n.cache)
	})
	return n
}

// startServe starts the node's serve container: the loader image on the cluster's
// network, its socket and cache on the node's volumes, memlock unlimited, a
// healthcheck that reads its metrics.
func (n *mnNode) startServe(t *testing.T) {
	t.Helper()
	args := []string{"run", "-d", "--name", n.serve, "--network", n.c.network}
	if n.c.memlock {
		args = append(args, "--ulimit", "memlock=-1")
	}
	args = append(args, "-p", "127.0.0.1::9400", "-v", n.run+":/run/shardload", "-v", n.cache+":/var/cache/shardload",
		"--health-cmd", "/usr/local/bin/shardload top --once --every 200ms 127.0.0.1:9400",
		"--health-interval", "1s", "--health-retries", "60", "--health-timeout", "5s")
	args = append(args, n.c.env...)
	args = append(args, loaderImage, "serve", "--cache-dir=/var/cache/shardload/shards", "--cache-disk=1GiB",
		"--memory=128MiB", "--max-sessions=4", "--metrics=0.0.0.0:9400",
		// Small windows: ranks share windows and read parts of shards.
		"--shuffle-buffer=64", "--open-shards=3", "--slabs=3",
		// A stalled connection given up after 10 s instead of 60; a store away for
		// longer is ridden out by the retry budget (--retry-budget, 2 minutes).
		"--stall-timeout="+mnStall.String(),
		n.c.pattern)
	mustDocker(t, args...)
	n.waitHealthy(t)
}

// waitHealthy waits until the serve container's healthcheck passes: its socket listens.
func (n *mnNode) waitHealthy(t *testing.T) {
	t.Helper()
	waitFor(t, "node "+n.name+"'s serve", func() error {
		out, err := dockerCmd("inspect", "-f", "{{.State.Status}} {{.State.Health.Status}}", n.serve)
		if err != nil {
			return err
		}
		if out != "running healthy" {
			return fmt.Errorf("%s", out)
		}
		return nil
	})
}

// metric returns the sum of a counter family of the node's serve metrics (every
// label), scraped through the port published for them.
func (n *mnNode) metric(t *testing.T, name string) float64 {
	t.Helper()
	addr := strings.Fields(mustDocker(t, "port", n.serve, "9400/tcp"))[0]
	sum := 0.0
	if f := scrape(t, "http://"+addr+"/metrics")[name]; f != nil {
		for _, m := range f.Metric {
			sum += m.GetCounter().GetValue()
		}
	}
	return sum
}

// mnEvent is one line of docker/trainer/rank.py.
type mnEvent struct {
	Event                string
	Epoch, Seq, Batches  int
	Samples, Rank, World int
	Session              int
	EpochBatches         int `json:"epoch_batches"`
	Keys                 []string
	State, Resumed       map[string]any
	Error, Message       string
	raw                  string
	undecoded            bool
	decodeErr            error
}

// mnRank is one rank's container, running docker/trainer/rank.py attached.
type mnRank struct {
	rank   int
	node   *mnNode
	name   string
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	lines  chan mnEvent
	stderr *strings.Builder
	mu     sync.Mutex
	events []mnEvent
	done   chan error
}

// startRank starts rank on node n, reading epochs, pausing at the given points
// (rank.py's --pause E:K).
func (n *mnNode) startRank(t *testing.T, kase string, rank, epochs int, pauses ...string) *mnRank {
	t.Helper()
	r := &mnRank{rank: rank, node: n, name: fmt.Sprintf("%s-%s-rank%d", n.c.prefix, kase, rank),
		lines: make(chan mnEvent, 1024), stderr: &strings.Builder{}, done: make(chan error, 1)}
	args := []string{"run", "-i", "--rm", "--name", r.name, "--network", "none", "-v", n.run + ":/run/shardload",
		"-e", "RANK=" + strconv.Itoa(rank), "-e", "WORLD_SIZE=" + strconv.Itoa(mnWorld),
		"-e", "LOCAL_RANK=" + strconv.Itoa(rank%2), trainerImage, "/opt/shardload/rank.py",
		"--epochs", strconv.Itoa(epochs), "--batch-size", strconv.Itoa(mnBatch), "--seed", strconv.Itoa(mnSeed),
		"--timeout", "120", "--reconnect-timeout", "120"}
	for _, p := range pauses {
		args = append(args, "--pause", p)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*mnTimeout)
	r.cmd = exec.CommandContext(ctx, "docker", args...)
	r.cmd.Stderr = r.stderr
	stdout, err := r.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if r.stdin, err = r.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	if err := r.cmd.Start(); err != nil {
		cancel()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		dockerCmd("rm", "-f", r.name)
		<-r.done
	})
	go func() {
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 1<<20), 16<<20)
		for sc.Scan() {
			e := mnEvent{raw: sc.Text()}
			if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
				e.undecoded, e.decodeErr = true, err
			}
			r.lines <- e
		}
		close(r.lines)
		r.done <- r.cmd.Wait()
	}()
	return r
}

// next returns the rank's next event, failing the test when the rank ends, prints
// an error or says nothing for mnTimeout.
func (r *mnRank) next(t *testing.T) mnEvent {
	t.Helper()
	select {
	case e, ok := <-r.lines:
		if !ok {
			t.Fatalf("rank %d: output ended before it was done; stderr:\n%s", r.rank, r.stderr)
		}
		if e.undecoded {
			t.Fatalf("rank %d: %q: %v; stderr:\n%s", r.rank, e.raw, e.decodeErr, r.stderr)
		}
		if e.Event == "error" {
			t.Fatalf("rank %d: %s: %s", r.rank, e.Error, e.Message)
		}
		r.mu.Lock()
		r.events = append(r.events, e)
		r.mu.Unlock()
		return e
	case <-time.After(mnTimeout):
		t.Fatalf("rank %d: nothing for %v (a hang)", r.rank, mnTimeout)
	}
	return mnEvent{}
}

// until reads the rank's events up to the first of the kind.
func (r *mnRank) until(t *testing.T, kind string) mnEvent {
	t.Helper()
	for {
		if e := r.next(t); e.Event == kind {
			return e
		}
	}
}

// release lets a paused rank go on.
func (r *mnRank) release(t *testing.T) {
	t.Helper()
	if _, err := io.WriteString(r.stdin, "go\n"); err != nil {
		t.Fatalf("rank %d: %v", r.rank, err)
	}
}

// finish reads the rank's events to its end and waits for its container to exit 0.
func (r *mnRank) finish(t *testing.T) {
	t.Helper()
	r.until(t, "done")
	select {
	case err := <-r.done:
		r.done <- err // for the cleanup
		if err != nil {
			t.Fatalf("rank %d: %v; stderr:\n%s", r.rank, err, r.stderr)
		}
	case <-time.After(mnTimeout):
		t.Fatalf("rank %d: did not exit %v after it was done", r.rank, mnTimeout)
	}
}

// count returns how many of the rank's events are of the kind.
func (r *mnRank) count(kind string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, e := range r.events {
		if e.Event == kind {
			n++
		}
	}
	return n
}

// mnJob is one case's two nodes and four ranks.
type mnJob struct {
	nodes []*mnNode
	ranks []*mnRank
}

// startJob starts two nodes (ranks 0 and 1 on node A, 2 and 3 on node B) and the
// four ranks, each reading epochs and pausing at the points given.
func (c *mnCluster) startJob(t *testing.T, kase string, epochs int, pauses ...string) *mnJob {
	t.Helper()
	j := c.startNodes(t, kase)
	j.startRanks(t, kase, epochs, pauses...)
	return j
}

// startNodes starts the serve of each node of a job, healthy, with no rank yet.
func (c *mnCluster) startNodes(t *testing.T, kase string) *mnJob {
	t.Helper()
	j := &mnJob{}
	for _, name := range []string{"A", "B"} {
		n := c.newNode(t, kase, name)
		n.startServe(t)
		j.nodes = append(j.nodes, n)
	}
	return j
}

// startRanks starts the job's ranks on its nodes.
func (j *mnJob) startRanks(t *testing.T, kase string, epochs int, pauses ...string) {
	t.Helper()
	for rank := range mnWorld {
		j.ranks = append(j.ranks, j.nodes[rank/2].startRank(t, kase, rank, epochs, pauses...))
	}
}

// mnOutage is how long the disconnect case cuts a node off: longer than its serve's
// --stall-timeout (mnStall).
const (
	mnStall  = 10 * time.Second
	mnOutage = mnStall + 5*time.Second
)

// pausedAll waits until every rank is paused.
func (j *mnJob) pausedAll(t *testing.T) {
	t.Helper()
	for _, r := range j.ranks {
		r.until(t, "paused")
	}
}

// releaseAll lets every rank go on.
func (j *mnJob) releaseAll(t *testing.T) {
	t.Helper()
	for _, r := range j.ranks {
		r.release(t)
	}
}

// finishAll reads every rank to its end.
func (j *mnJob) finishAll(t *testing.T) {
	t.Helper()
	for _, r := range j.ranks {
		r.finish(t)
	}
}

// check checks that in each of the epochs every sample of the dataset reached
// exactly one rank, that every rank read the same number of batches, and logs the
// counts; resumed names the ranks that must have lost their server and resumed from
// their state (and no other rank may have).
func (j *mnJob) check(t *testing.T, c *mnCluster, kase string, epochs int, resumed ...int) {
	t.Helper()
	perRank := len(c.samples) / mnWorld
	for e := range epochs {
		seen := map[string]int{}
		var counts []string
		for _, r := range j.ranks {
			n, batches := 0, map[int]bool{}
			for _, ev := range r.events {
				if ev.Event != "batch" || ev.Epoch != e {
					continue
				}
				if batches[ev.Seq] {
					t.Errorf("%s: rank %d epoch %d: batch %d yielded twice", kase, r.rank, e, ev.Seq)
				}
				batches[ev.Seq] = true
				for _, k := range ev.Keys {
					if _, ok := c.samples[k]; !ok {
						t.Errorf("%s: rank %d epoch %d: %q is no sample of the dataset", kase, r.rank, e, k)
					}
					seen[k]++
					n++
				}
			}
			if n != perRank || len(batches) != (perRank+mnBatch-1)/mnBatch {
				t.Errorf("%s: rank %d epoch %d: %d samples in %d batches, want %d in %d", kase, r.rank, e, n,
					len(batches), perRank, (perRank+mnBatch-1)/mnBatch)
			}
			counts = append(counts, strconv.Itoa(n))
		}
		twice := 0
		for k, n := range seen {
			if n != 1 {
				twice++
				if twice <= 5 {
					t.Errorf("%s: epoch %d: sample %s read %d times", kase, e, k, n)
				}
			}
		}
		if len(seen) != len(c.samples) || twice != 0 {
			t.Errorf("%s: epoch %d: %d of %d samples read, %d more than once", kase, e, len(seen), len(c.samples), twice)
		} else {
			t.Logf("%s: epoch %d: %d ranks read %s = %d samples, each of the %d exactly once", kase, e, mnWorld,
				strings.Join(counts, " + "), len(c.samples), len(c.samples))
		}
	}
	var lost []int
	for _, r := range j.ranks {
		if r.count("gone") > 0 {
			lost = append(lost, r.rank)
		}
		for _, ev := range r.events {
			if ev.Event == "ready" && ev.Resumed != nil {
				t.Logf("%s: rank %d resumed from %v", kase, r.rank, ev.Resumed)
			}
		}
	}
	if !slices.Equal(lost, resumed) {
		t.Errorf("%s: ranks %v lost their server and resumed, want %v", kase, lost, resumed)
	}
}

// TestMultiNodeDocker is the multi-node fault test in containers: two "nodes" (a
// serve container each, with its own socket and cache volumes) on a private network
// with MinIO in a third container, and one world of four ranks (trainer containers,
// ranks 0 and 1 on node A's socket volume, 2 and 3 on node B's) reading an indexed
// dataset. Each case injects one fault and checks that every epoch still gave every
// sample to exactly one rank, that the ranks that lost their server resumed from
// their last state_dict() (and no other), and that nothing hung (every wait is
// bounded). The faults happen while every rank is paused at a chosen point (rank.py
// --pause), so that they land mid-epoch or between epochs by construction.
func TestMultiNodeDocker(t *testing.T) {
	requireDocker(t)
	start := time.Now()
	c := newCluster(t)
	t.Logf("cluster: MinIO and %d samples in %d shards, indexed, in %v", len(c.samples), mnShards, time.Since(start).Round(time.Second))

	t.Run("kill_serve", func(t *testing.T) {
		// Node A's serve killed mid-epoch (SIGKILL: no clean end), then started again:
		// ranks 0 and 1 get ServerGone and resume from their last state.
		j := c.startJob(t, "kill", 1, "0:2")
		j.pausedAll(t)
		mustDocker(t, "kill", j.nodes[0].serve)
		mustDocker(t, "start", j.nodes[0].serve)
		j.releaseAll(t)
		j.finishAll(t)
		j.check(t, c, "kill_serve", 1, 0, 1)
	})

	t.Run("disconnect", func(t *testing.T) {
		// Node A cut off from the network (MinIO) before its ranks say hello, so that
		// nothing of the dataset is in its cache yet, for longer than its serve's
		// --stall-timeout: its sessions' planning and first reads fail and are retried
		// until the store is back, within the retry budget and --start-timeout; the
		// epoch is exact and no rank loses its server.
		j := c.startNodes(t, "disconnect")
		a := j.nodes[0]
		retries, outages := a.metric(t, "shardload_fetch_retries_total"), a.metric(t, "shardload_fetch_outages_total")
		mustDocker(t, "network", "disconnect", c.network, a.serve)
		j.startRanks(t, "disconnect", 1)
		time.Sleep(mnOutage) // the length of the outage, not a synchronisation
		mustDocker(t, "network", "connect", c.network, a.serve)
		j.finishAll(t)
		j.check(t, c, "disconnect", 1)
		r, o := a.metric(t, "shardload_fetch_retries_total"), a.metric(t, "shardload_fetch_outages_total")
		t.Logf("disconnect: node A: fetch retries %v -> %v, outages %v -> %v", retries, r, outages, o)
		if r <= retries || o <= outages {
			t.Errorf("node A's serve counted %v retries and %v outages during a %v cut: want both more than none (the data came from somewhere else?)", r-retries, o-outages, mnOutage)
		}
	})

	t.Run("minio_restart", func(t *testing.T) {
		// MinIO restarted mid-epoch (its data on its volume): both serves retry.
		j := c.startJob(t, "minio", 1, "0:2")
		j.pausedAll(t)
		retries := j.nodes[0].metric(t, "shardload_fetch_retries_total") + j.nodes[1].metric(t, "shardload_fetch_retries_total")
		mustDocker(t, "restart", "-t", "2", c.minio)
		j.releaseAll(t)
		j.finishAll(t)
		j.check(t, c, "minio_restart", 1)
		t.Logf("minio_restart: fetch retries of both nodes %v -> %v", retries,
			j.nodes[0].metric(t, "shardload_fetch_retries_total")+j.nodes[1].metric(t, "shardload_fetch_retries_total"))
	})

	t.Run("rolling_restart", func(t *testing.T) {
		// Both serves restarted one after the other (SIGTERM, start, healthy) between
		// epochs 0 and 1: every rank resumes epoch 1 from its state.
		j := c.startJob(t, "rolling", 2, "0:end")
		j.pausedAll(t)
		for _, n := range j.nodes {
			mustDocker(t, "stop", "-t", "30", n.serve)
			mustDocker(t, "start", n.serve)
			n.waitHealthy(t)
		}
		j.releaseAll(t)
		j.finishAll(t)
		j.check(t, c, "rolling_restart", 2, 0, 1, 2, 3)
	})

	t.Run("cache_deleted", func(t *testing.T) {
		// Node A's cache volume deleted between epochs (its serve removed with it and
		// started again on a new, empty volume): epoch 1 on node A reads from MinIO.
		j := c.startJob(t, "cache", 2, "0:end")
		j.pausedAll(t)
		a := j.nodes[0]
		before := volumeFiles(t, a.cache)
		mustDocker(t, "rm", "-f", a.serve)
		mustDocker(t, "volume", "rm", a.cache)
		a.startServe(t)
		if after := volumeFiles(t, a.cache); after >= before || before == 0 {
			t.Errorf("node A's cache held %d files before and %d after: not a fresh cache", before, after)
		}
		j.releaseAll(t)
		j.finishAll(t)
		j.check(t, c, "cache_deleted", 2, 0, 1)
		if n := volumeFiles(t, a.cache); n == 0 {
			t.Errorf("node A's new cache is empty after epoch 1")
		}
	})
	t.Logf("all cases in %v", time.Since(start).Round(time.Second))
}

// volumeFiles counts the regular files in a volume, through a throwaway container of
// the loader image.
func volumeFiles(t *testing.T, volume string) int {
	t.Helper()
	out := mustDocker(t, "run", "--rm", "--network", "none", "-v", volume+":/v:ro", "--entrypoint", "find",
		loaderImage, "/v", "-type", "f")
	if out == "" {
		return 0
	}
	return len(strings.Split(out, "\n"))
}
