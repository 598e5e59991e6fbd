package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/shardload/shardload/internal/shardgen"
	"github.com/shardload/shardload/internal/testutil"
	"github.com/shardload/shardload/shard"
)

// The tests of examples/: train.py trained end to end through "shardload serve" on a
// dataset in MinIO, as one process, as two ranks of torch.distributed (gloo), and
// across a failure: ranks killed after a checkpoint, and the job restarted from it
// through torchrun.

var trainScript = func() string {
	p, _ := filepath.Abs("../examples/train.py")
	return p
}()

// trainResult is train.py's last output line.
type trainResult struct {
	Rank        int      `json:"rank"`
	World       int      `json:"world"`
	Samples     int      `json:"samples"`
	Batches     int      `json:"batches"`
	Steps       int      `json:"steps"`
	LossFirst   *float64 `json:"loss_first"`
	LossLast    *float64 `json:"loss_last"`
	ResumedFrom *int     `json:"resumed_from"`
	Keys        []string `json:"keys"`
}

// trainRun is one train.py process, or one torchrun launcher.
type trainRun struct {
	cmd            *exec.Cmd
	stdout, stderr bytes.Buffer
	ctx            context.Context
	cancel         context.CancelFunc
	done           chan struct{}
	err            error
}

// trainEnv is the environment of a train.py process: the caller's, without any
// torchrun or shardload variables it may have, plus env.
func trainEnv(env ...string) []string {
	var out []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		switch name {
		case "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK":
			continue
		}
		if strings.HasPrefix(name, "SHARDLOAD_") || strings.HasPrefix(name, "TORCHELASTIC_") {
			continue
		}
		out = append(out, kv)
	}
	return append(append(out, "PYTHONDONTWRITEBYTECODE=1", "OMP_NUM_THREADS=1"), env...)
}

func startTrain(t *testing.T, py string, env []string, args ...string) *trainRun {
	t.Helper()
	// A guard against a hang, not a measurement.
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	r := &trainRun{ctx: ctx, cancel: cancel, done: make(chan struct{})}
	r.cmd = exec.CommandContext(ctx, py, args...)
	r.cmd.Env = trainEnv(env...)
	r.cmd.Dir = t.TempDir()
	r.cmd.Stdout, r.cmd.Stderr = &r.stdout, &r.stderr
	if err := r.cmd.Start(); err != nil {
		cancel()
		t.Fatal(err)
	}
	go func() { r.err = r.cmd.Wait(); close(r.done) }()
	t.Cleanup(func() { cancel(); <-r.done })
	return r
}

// wait waits for the process and returns its error (nil when it exited 0).
func (r *trainRun) wait() error {
	<-r.done
	r.cancel()
	return r.err
}

// timedOut reports whether the guard's timeout killed the process.
func (r *trainRun) timedOut() bool { return errors.Is(r.ctx.Err(), context.DeadlineExceeded) }

// result decodes the process's last output line.
func (r *trainRun) result(t *testing.T) trainResult {
	t.Helper()
	lines := strings.Split(strings.TrimSpace(r.stdout.String()), "\n")
	var res trainResult
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &res); err != nil {
		t.Fatalf("train.py's last line %q: %v; stderr:\n%s", lines[len(lines)-1], err, r.stderr.String())
	}
	return res
}

// trainRanks runs train.py as world ranks on this node, with the environment torchrun
// would give them, and returns each rank's process once all have exited.
func trainRanks(t *testing.T, py, socket string, world int, args ...string) []*trainRun {
	t.Helper()
	return scriptRanks(t, py, trainScript, socket, world, args...)
}

// scriptRanks is trainRanks for another script.
func scriptRanks(t *testing.T, py, script, socket string, world int, args ...string) []*trainRun {
	t.Helper()
	port := freePort(t)
	var runs []*trainRun
	for rank := range world {
		runs = append(runs, startTrain(t, py, []string{
			"SHARDLOAD_SOCKET=" + socket, "RANK=" + strconv.Itoa(rank), "WORLD_SIZE=" + strconv.Itoa(world),
			"LOCAL_RANK=" + strconv.Itoa(rank), "LOCAL_WORLD_SIZE=" + strconv.Itoa(world),
			"MASTER_ADDR=127.0.0.1", "MASTER_PORT=" + port,
		}, append([]string{script}, args...)...))
	}
	var wg sync.WaitGroup
	for _, r := range runs {
		wg.Go(func() { r.wait() })
	}
	wg.Wait()
	return runs
}

// finite fails the test unless both losses of res are finite.
func finite(t *testing.T, what string, res trainResult) {
	t.Helper()
	if res.LossFirst == nil || res.LossLast == nil || math.IsNaN(*res.LossFirst) || math.IsInf(*res.LossFirst, 0) ||
		math.IsNaN(*res.LossLast) || math.IsInf(*res.LossLast, 0) {
		t.Errorf("%s: losses %v, %v: want finite numbers", what, res.LossFirst, res.LossLast)
	}
}

// onceEach fails the test unless keys holds want distinct keys, each once.
func onceEach(t *testing.T, what string, keys []string, want int) {
	t.Helper()
	seen := map[string]int{}
	for _, k := range keys {
		seen[k]++
	}
	for k, n := range seen {
		if n != 1 {
			t.Errorf("%s: sample %s read %d times", what, k, n)
		}
	}
	if len(seen) != want {
		t.Errorf("%s: %d distinct samples, want %d", what, len(seen), want)
	}
}

// TestExampleTrain trains examples/train.py on the tokens preset in MinIO through a
// "shardload serve" started with the store's environment.
func TestExampleTrain(t *testing.T) {
	py := python(t)
	m := testutil.MinIO(t)
	m.CreateBucket(t, "examples")
	spec := shardgen.Spec{Shards: 4, SamplesPerShard: 40, Compression: shard.Zstd, Fields: shardgen.Presets["tokens"]}
	putShards(t, m, "examples", "tok", "", spec)
	const samples, batch = 160, 8
	pattern := "s3://examples/tok/" + spec.Pattern()
	// The index beside the shards: exact counts, so that a checkpoint resumes.
	ok(t, m.Env(), "index", "--output", "s3://examples/tok/", pattern)
	srv := startServerEnv(t, m.Env(), "", pattern)
	sock := "SHARDLOAD_SOCKET=" + srv.socket

	t.Run("one-process", func(t *testing.T) {
		r := startTrain(t, py, []string{sock}, trainScript, "--batch-size", strconv.Itoa(batch), "--report-keys")
		if err := r.wait(); err != nil {
			t.Fatalf("train.py: %v; stderr:\n%s", err, r.stderr.String())
		}
		res := r.result(t)
		if res.Rank != 0 || res.World != 1 || res.Samples != samples || res.Batches != samples/batch || res.ResumedFrom != nil {
			t.Errorf("one process: %+v", res)
		}
		finite(t, "one process", res)
		onceEach(t, "one process", res.Keys, samples)
	})

	// Two ranks for two epochs: the reference of the restart below.
	var whole [][]string
	t.Run("two-ranks", func(t *testing.T) {
		runs := trainRanks(t, py, srv.socket, 2, "--batch-size", strconv.Itoa(batch), "--epochs", "2", "--report-keys")
		var res []trainResult
		for rank, r := range runs {
			if r.err != nil {
				t.Fatalf("rank %d: %v; stderr:\n%s", rank, r.err, r.stderr.String())
			}
			res = append(res, r.result(t))
			finite(t, fmt.Sprintf("rank %d", rank), res[rank])
		}
		per := samples / 2 // every sample once per epoch across the ranks: 160 % 2 == 0
		for rank, rr := range res {
			if rr.Rank != rank || rr.World != 2 || rr.Batches != 2*per/batch || rr.Samples != 2*per || len(rr.Keys) != 2*per {
				t.Fatalf("rank %d: %+v", rank, rr)
			}
		}
		if res[0].Batches != res[1].Batches {
			t.Errorf("batches per rank %d and %d", res[0].Batches, res[1].Batches)
		}
		for e := range 2 {
			onceEach(t, fmt.Sprintf("epoch %d", e), append(slices.Clone(res[0].Keys[e*per:(e+1)*per]), res[1].Keys[e*per:(e+1)*per]...), samples)
		}
		whole = [][]string{res[0].Keys, res[1].Keys}
	})

	// Both ranks killed after the checkpoint of step 3, then the job restarted
	// through torchrun: it reads from the batch after the checkpoint on, exactly
	// what the uninterrupted job read from there.
	t.Run("restart", func(t *testing.T) {
		if whole == nil {
			t.Skip("two-ranks failed")
		}
		ckpt := filepath.Join(t.TempDir(), "ckpt.pt")
		const crash = 3
		common := []string{"--batch-size", strconv.Itoa(batch), "--epochs", "2", "--checkpoint", ckpt, "--checkpoint-every", "100"}
		runs := trainRanks(t, py, srv.socket, 2, append(slices.Clone(common), "--crash-after-step", strconv.Itoa(crash))...)
		for rank, r := range runs {
			var ee *exec.ExitError
			if r.timedOut() || !errors.As(r.err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
				t.Fatalf("rank %d: %v, want killed by SIGKILL; stderr:\n%s", rank, r.err, r.stderr.String())
			}
		}
		if !strings.Contains(runs[0].stdout.String(), fmt.Sprintf(`"step": %d}`, crash)) {
			t.Fatalf("rank 0 wrote no checkpoint of step %d: %s", crash, runs[0].stdout.String())
		}

		// torchrun (torch.distributed.run) starts both ranks. --redirects 1 --tee 1:
		// Debian's torch 1.13 on Python 3.12 fails with its default of 0 (Std.NONE is
		// not found by iterating over the IntFlag); each rank's lines come out on
		// stdout prefixed with "[default<rank>]:".
		r := startTrain(t, py, []string{sock}, append([]string{"-m", "torch.distributed.run",
			"--nproc_per_node", "2", "--master_port", freePort(t), "--redirects", "1", "--tee", "1",
			"--log_dir", t.TempDir(), trainScript, "--report-keys"}, common...)...)
		if err := r.wait(); err != nil {
			t.Fatalf("torchrun: %v; stdout:\n%s\nstderr:\n%s", err, r.stdout.String(), r.stderr.String())
		}
		var res [2]*trainResult
		for _, l := range strings.Split(r.stdout.String(), "\n") {
			for rank := range 2 {
				if rest, found := strings.CutPrefix(l, fmt.Sprintf("[default%d]:", rank)); found && strings.Contains(rest, `"rank"`) {
					var tr trainResult
					if err := json.Unmarshal([]byte(rest), &tr); err != nil {
						t.Fatalf("rank %d printed %q: %v", rank, rest, err)
					}
					res[rank] = &tr
				}
			}
		}
		for rank, rr := range res {
			if rr == nil {
				t.Fatalf("no result line of rank %d; stdout:\n%s\nstderr:\n%s", rank, r.stdout.String(), r.stderr.String())
			}
			if rr.ResumedFrom == nil || *rr.ResumedFrom != crash || rr.Batches != len(whole[rank])/batch-crash || rr.Steps != len(whole[rank])/batch {
				t.Errorf("rank %d after the restart: resumed from %v, %d batches, %d steps; want step %d, %d batches, %d steps",
					rank, rr.ResumedFrom, rr.Batches, rr.Steps, crash, len(whole[rank])/batch-crash, len(whole[rank])/batch)
			}
			finite(t, fmt.Sprintf("rank %d after the restart", rank), *rr)
			if want := whole[rank][crash*batch:]; !slices.Equal(rr.Keys, want) {
				t.Errorf("rank %d after the restart read %d samples (first %v), want the %d the uninterrupted job read after step %d (first %v)",
					rank, len(rr.Keys), rr.Keys[:min(3, len(rr.Keys))], len(want), crash, want[:min(3, len(want))])
			}
		}
	})
}

var trainVisionScript = func() string {
	p, _ := filepath.Abs("../examples/train_vision.py")
	return p
}()

// visionResult is train_vision.py's last output line.
type visionResult struct {
	trainResult
	Model           string `json:"model"`
	BatchesPerEpoch int    `json:"batches_per_epoch"`
}

// TestExampleTrainVision trains examples/train_vision.py (torchvision's ResNet-18 on
// 64x64 random crops) on photo-like JPEG shards in MinIO through serve, as two DDP
// ranks: every sample once per epoch across them and len(loader) batches each; then
// the ranks are killed after a checkpoint and torchrun restarts the job, which reads
// exactly what the uninterrupted job read after that step.
func TestExampleTrainVision(t *testing.T) {
	py := pythonPIL(t)
	paths := photoShards(t, py, t.TempDir(), 2, 24, "--seed", "9", "--width", "160", "--height", "120", "--detail", "20")
	m := testutil.MinIO(t)
	m.CreateBucket(t, "vision")
	for _, p := range paths {
		data, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		m.Put(t, "vision", "train/"+filepath.Base(p), data)
	}
	pattern := "s3://vision/train/images-{000000..000001}.tar"
	ok(t, m.Env(), "index", "--output", "s3://vision/train/", pattern)
	srv := startServerEnv(t, m.Env(), "", pattern)
	const samples, batch, epochs = 48, 8, 2
	common := []string{"--batch-size", strconv.Itoa(batch), "--epochs", strconv.Itoa(epochs), "--image-size", "64", "--report-keys"}
	result := func(r *trainRun, rank int) visionResult {
		t.Helper()
		if r.err != nil {
			t.Fatalf("rank %d: %v; stderr:\n%s", rank, r.err, r.stderr.String())
		}
		var res visionResult
		lines := strings.Split(strings.TrimSpace(r.stdout.String()), "\n")
		if err := json.Unmarshal([]byte(lines[len(lines)-1]), &res); err != nil {
			t.Fatalf("rank %d's last line %q: %v", rank, lines[len(lines)-1], err)
		}
		return res
	}
	runs := scriptRanks(t, py, trainVisionScript, srv.socket, 2, common...)
	var whole [2][]string
	per := samples / 2
	for rank, r := range runs {
		res := result(r, rank)
		finite(t, fmt.Sprintf("rank %d", rank), res.trainResult)
		if res.World != 2 || res.BatchesPerEpoch != per/batch || res.Batches != epochs*per/batch || len(res.Keys) != epochs*per || res.Model == "" {
			t.Fatalf("rank %d: %+v; want len(loader) %d and %d batches", rank, res, per/batch, epochs*per/batch)
		}
		whole[rank] = res.Keys
	}
	for e := range epochs {
		onceEach(t, fmt.Sprintf("epoch %d", e), append(slices.Clone(whole[0][e*per:(e+1)*per]), whole[1][e*per:(e+1)*per]...), samples)
	}

	// Killed after the checkpoint of step 2, then restarted through torchrun.
	ckpt := filepath.Join(t.TempDir(), "vision.pt")
	const crash = 2
	withCkpt := append(slices.Clone(common), "--checkpoint", ckpt)
	for rank, r := range scriptRanks(t, py, trainVisionScript, srv.socket, 2, append(slices.Clone(withCkpt), "--crash-after-step", strconv.Itoa(crash))...) {
		var ee *exec.ExitError
		if r.timedOut() || !errors.As(r.err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
			t.Fatalf("rank %d: %v, want killed by SIGKILL; stderr:\n%s", rank, r.err, r.stderr.String())
		}
	}
	r := startTrain(t, py, []string{"SHARDLOAD_SOCKET=" + srv.socket}, append([]string{"-m", "torch.distributed.run",
		"--nproc_per_node", "2", "--master_port", freePort(t), "--redirects", "1", "--tee", "1",
		"--log_dir", t.TempDir(), trainVisionScript}, withCkpt...)...)
	if err := r.wait(); err != nil {
		t.Fatalf("torchrun: %v; stdout:\n%s\nstderr:\n%s", err, r.stdout.String(), r.stderr.String())
	}
	for rank := range 2 {
		var res *visionResult
		for _, l := range strings.Split(r.stdout.String(), "\n") {
			if rest, found := strings.CutPrefix(l, fmt.Sprintf("[default%d]:", rank)); found && strings.Contains(rest, `"rank"`) {
				res = &visionResult{}
				if err := json.Unmarshal([]byte(rest), res); err != nil {
					t.Fatalf("rank %d printed %q: %v", rank, rest, err)
				}
			}
		}
		if res == nil {
			t.Fatalf("no result line of rank %d; stdout:\n%s\nstderr:\n%s", rank, r.stdout.String(), r.stderr.String())
		}
		if res.ResumedFrom == nil || *res.ResumedFrom != crash || res.Steps != epochs*per/batch || res.BatchesPerEpoch != per/batch {
			t.Errorf("rank %d after the restart: %+v; want resumed from step %d, %d steps in all", rank, res, crash, epochs*per/batch)
		}
		if want := whole[rank][crash*batch:]; !slices.Equal(res.Keys, want) {
			t.Errorf("rank %d after the restart read %d samples, want the %d the uninterrupted job read after step %d", rank, len(res.Keys), len(want), crash)
		}
		finite(t, fmt.Sprintf("rank %d after the restart", rank), res.trainResult)
	}
}
