package integration

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	sl "github.com/shardload/shardload"
	"github.com/shardload/shardload/internal/shardgen"
	"github.com/shardload/shardload/internal/testutil"
	"github.com/shardload/shardload/source"
	"github.com/shardload/shardload/source/s3"
)

// The tests of checkpoint and resume through the loader process (protocol version 3):
// client/python/tests/client_check.py's state mode checks the Python API, and
// client/python/tests/resume_trainer.py is a torch.distributed job that the test
// kills after a checkpoint and restarts from it.

var resumeTrainerScript = func() string {
	p, _ := filepath.Abs("../client/python/tests/resume_trainer.py")
	return p
}()

// Client.state_dict/load_state_dict and ShardloadDataset's, against a real server:
// the script's own comparisons (a resumed client or dataset reads what an
// uninterrupted one reads after the same batches; states are plain dicts of ints and
// strings; states that do not fit are refused), and its uninterrupted epochs against
// the library's.
func TestResumeClientState(t *testing.T) {
	py := python(t)
	images, _ := datasets(t)
	srv := startServer(t, "", images)
	lines := clientCheck(t, py, nil, "state", srv.socket)
	if len(lines) != 1 {
		t.Fatalf("%d lines: %v", len(lines), lines)
	}
	var problems []string
	field(t, lines[0], "problems", &problems)
	for _, p := range problems {
		t.Error(p)
	}
	for e, name := range []string{"epoch0", "epoch1"} {
		var got [][]string
		field(t, lines[0], name, &got)
		sameKeys(t, "client epoch "+strconv.Itoa(e), got, libraryKeys(t, sl.Config{URLs: []string{images},
			Fields: fields(t, checkFields...), Seed: checkSeed, Epoch: e, BatchSize: checkBatch, Logf: t.Logf}))
	}
}

// rankProc is one running rank of resume_trainer.py.
type rankProc struct {
	rank  int
	cmd   *exec.Cmd
	out   *lineReader
	errb  *strings.Builder
	stdin io.WriteCloser // kept open: a rank that hangs waits for it to close
	done  chan error
	lines []map[string]json.RawMessage
}

// startJob starts the two ranks of resume_trainer.py with args, in a world of their
// own (a fresh MASTER_PORT).
func startJob(t *testing.T, py string, args ...string) []*rankProc {
	t.Helper()
	port := freePort(t)
	var procs []*rankProc
	for rank := range 2 {
		cmd := exec.Command(py, append([]string{resumeTrainerScript}, args...)...)
		cmd.Env = append(os.Environ(), "PYTHONDONTWRITEBYTECODE=1", "MASTER_ADDR=127.0.0.1", "MASTER_PORT="+port,
			"GLOO_SOCKET_IFNAME=lo", "RANK="+strconv.Itoa(rank), "WORLD_SIZE=2", "LOCAL_RANK="+strconv.Itoa(rank))
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		stdin, err := cmd.StdinPipe()
		if err != nil {
			t.Fatal(err)
		}
		p := &rankProc{rank: rank, cmd: cmd, stdin: stdin, errb: &strings.Builder{}, done: make(chan error, 1)}
		cmd.Stderr = &lockedWriter{w: p.errb}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		p.out = newLineReader(stdout)
		go func() { p.done <- cmd.Wait() }()
		t.Cleanup(func() {
			cmd.Process.Kill()
			stdin.Close()
			<-p.done
			p.done <- nil
		})
		procs = append(procs, p)
	}
	return procs
}

// next returns the rank's next output line, decoded; ok is false at the end of its
// output. It fails the test on an error line, or when no line comes within the guard.
func (p *rankProc) next(t *testing.T) (map[string]json.RawMessage, bool) {
	t.Helper()
	select {
	case l, ok := <-p.out.lines:
		if !ok {
			return nil, false
		}
		var m map[string]json.RawMessage
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("rank %d printed %q: %v; stderr:\n%s", p.rank, l, err, p.errb)
		}
		if _, bad := m["error"]; bad {
			t.Fatalf("rank %d: %s; stderr:\n%s", p.rank, l, p.errb)
		}
		p.lines = append(p.lines, m)
		return m, true
	case <-time.After(3 * time.Minute): // a guard against a hang, not a measurement
		t.Fatalf("rank %d: no output within 3 minutes; stderr:\n%s", p.rank, p.errb)
	}
	return nil, false
}

// until reads the rank's output up to a line with member name, and returns it.
func (p *rankProc) until(t *testing.T, name string) map[string]json.RawMessage {
	t.Helper()
	for {
		m, ok := p.next(t)
		if !ok {
			t.Fatalf("rank %d ended without a %q line; stderr:\n%s", p.rank, name, p.errb)
		}
		if _, ok := m[name]; ok {
			return m
		}
	}
}

// finish reads the rank's output to its end and fails the test unless it exited 0.
func (p *rankProc) finish(t *testing.T) {
	t.Helper()
	for {
		if _, ok := p.next(t); !ok {
			break
		}
	}
	if err := <-p.done; err != nil {
		t.Fatalf("rank %d: %v; stderr:\n%s", p.rank, err, p.errb)
	}
	p.done <- nil
}

// line returns the rank's first output line with member name.
func (p *rankProc) line(t *testing.T, name string) map[string]json.RawMessage {
	t.Helper()
	for _, m := range p.lines {
		if _, ok := m[name]; ok {
			return m
		}
	}
	t.Fatalf("rank %d printed no %q line: %v", p.rank, name, p.lines)
	return nil
}

// stepKeys is one line of a rank's keys file: a batch it trained on.
type stepKeys struct {
	Run   string   `json:"run"`
	Epoch int      `json:"epoch"`
	Step  int      `json:"step"`
	Keys  []string `json:"keys"`
}

// trained reads the keys file of rank in dir: the batches of run, those of steps up to
// last (all of them when last is 0).
func trained(t *testing.T, dir string, rank int, run string, last int) []stepKeys {
	t.Helper()
	f, err := os.Open(filepath.Join(dir, fmt.Sprintf("keys-%d.jsonl", rank)))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []stepKeys
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var s stepKeys
		if err := json.Unmarshal(sc.Bytes(), &s); err != nil {
			// A line cut short by the kill can only be the last, and of a step after
			// the checkpoint.
			continue
		}
		if s.Run == run && (last == 0 || s.Step <= last) {
			out = append(out, s)
		}
	}
	return out
}

// The acceptance test of resume: a job of two ranks (torch.distributed, gloo, DDP)
// reads a dataset in MinIO through ShardloadDataset and "shardload serve", saves a
// checkpoint with the dataset's state at step K, is killed (SIGKILL) after it says
// the checkpoint is written, and is started again from the checkpoint. Each rank
// trains on exactly the batches of an uninterrupted run of the same job: those before
// the checkpoint and those after the restart, to the end of the epoch and through the
// next; the model ends the same. K is in the middle of the first epoch, and at its
// last batch.
func TestResumeDistributedJob(t *testing.T) {
	py := python(t)
	m := testutil.MinIO(t)
	m.CreateBucket(t, "train")
	// 197 samples: 98 per rank (one read by neither), 13 batches of 8, the last of 2.
	spec := shardgen.Spec{Shards: 6, Samples: []int{40, 37, 25, 50, 33, 12}, Seed: 7,
		Fields: []shardgen.Field{{Ext: "jpg", Kind: shardgen.Random, MinBytes: 1000, MaxBytes: 3000}, {Ext: "cls", Kind: shardgen.Class}}}
	putShards(t, m, "train", "ds", "", spec)
	pattern := "s3://train/ds/" + spec.Pattern()
	ok(t, m.Env(), "index", "--output", "s3://train/ds/", pattern) // exact counts
	m.SetEnv(t)                                                    // for the server
	// The library reads through a registry of this test's own: the default one keeps
	// the S3 client it made first, for the process's life.
	reg := &source.Registry{}
	reg.Register("s3", source.NewFetcher(&s3.Source{Client: m.Client}, source.FetchOptions{}))
	srv := startServer(t, "", "--open-shards", "3", "--shuffle-buffer", "30", pattern)

	const (
		batch   = 8
		seed    = 3
		epochs  = 2
		perRank = 13
	)
	job := []string{"--socket", srv.socket, "--epochs", strconv.Itoa(epochs), "--batch-size", strconv.Itoa(batch),
		"--seed", strconv.Itoa(seed), "--field", "label=cls:int"}

	// The uninterrupted run.
	full := t.TempDir()
	ranks := startJob(t, py, append(job, "--dir", full, "--run", "full")...)
	for _, p := range ranks {
		p.finish(t)
	}
	var fullParams []float64
	for _, p := range ranks {
		var done struct {
			Steps  int
			Params []float64
		}
		b, _ := json.Marshal(p.line(t, "done"))
		json.Unmarshal(b, &done)
		if done.Steps != epochs*perRank {
			t.Fatalf("uninterrupted rank %d: %d steps, want %d", p.rank, done.Steps, epochs*perRank)
		}
		fullParams = done.Params
	}
	want := [2][]stepKeys{trained(t, full, 0, "full", 0), trained(t, full, 1, "full", 0)}
	// The uninterrupted run reads what the library reads, and the ranks split each
	// epoch.
	for e := range epochs {
		seen := map[string]int{}
		for rank := range 2 {
			lib := libraryKeys(t, sl.Config{URLs: []string{pattern}, Sources: reg, Fields: fields(t, "label=cls:int"), Seed: seed, Epoch: e,
				Rank: rank, World: 2, BatchSize: batch, OpenShards: 3, ShuffleBuffer: 30, Logf: t.Logf})
			var got [][]string
			for _, s := range want[rank] {
				if s.Epoch == e {
					got = append(got, s.Keys)
					for _, k := range s.Keys {
						seen[k]++
					}
				}
			}
			sameKeys(t, fmt.Sprintf("uninterrupted rank %d epoch %d", rank, e), got, lib)
		}
		if len(seen) != 196 {
			t.Errorf("epoch %d: the ranks read %d distinct samples, want 196", e, len(seen))
		}
		for k, n := range seen {
			if n != 1 {
				t.Errorf("epoch %d: sample %s read %d times", e, k, n)
			}
		}
	}

	for _, k := range []int{5, perRank} {
		t.Run("checkpoint at step "+strconv.Itoa(k), func(t *testing.T) {
			dir := t.TempDir()
			// Killed after the checkpoint: each rank trains on and goes past step k,
			// and stops at step k+2 until it is killed.
			ranks := startJob(t, py, append(job, "--dir", dir, "--run", "killed", "--checkpoint-step", strconv.Itoa(k),
				"--hang-after", strconv.Itoa(k+2))...)
			var states [2]sl.State
			for i, p := range ranks {
				line := p.until(t, "checkpoint")
				var types string
				field(t, line, "types", &types)
				field(t, line, "state", &states[i])
				if types != "ok" {
					t.Errorf("rank %d: state_dict() at the checkpoint: %s", p.rank, types)
				}
			}
			// Both said the checkpoint is written: kill them wherever they are.
			for _, p := range ranks {
				if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
					t.Fatal(err)
				}
			}
			for _, p := range ranks {
				err := <-p.done
				p.done <- err
				if ee, ok := err.(*exec.ExitError); !ok || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
					t.Fatalf("rank %d: %v, want killed by SIGKILL", p.rank, err)
				}
			}
			if states[0] != states[1] {
				t.Errorf("the ranks' states at step %d differ: %+v and %+v", k, states[0], states[1])
			}
			if states[0].Epoch != 0 || states[0].Batches != k || states[0].Order == "" || states[0].Samples != 197 {
				t.Errorf("state at step %d: %+v", k, states[0])
			}
			if _, err := os.Stat(filepath.Join(dir, "checkpoint.pt")); err != nil {
				t.Fatal(err)
			}

			// Restarted from rank 0's checkpoint, to the end of both epochs.
			ranks = startJob(t, py, append(job, "--dir", dir, "--run", "resumed", "--resume")...)
			for _, p := range ranks {
				p.finish(t)
			}
			for _, p := range ranks {
				var resumed struct {
					Resumed int
					Types   string
					State   sl.State
				}
				b, _ := json.Marshal(p.line(t, "resumed"))
				json.Unmarshal(b, &resumed)
				if resumed.Resumed != k || resumed.Types != "ok" || resumed.State != states[0] {
					t.Errorf("rank %d restarted from %+v, want step %d and state %+v", p.rank, resumed, k, states[0])
				}
				var ends []int
				for _, l := range p.lines {
					if raw, ok := l["epoch_end"]; ok {
						e, _ := strconv.Atoi(string(raw))
						ends = append(ends, e)
					}
				}
				if !slices.Equal(ends, []int{0, 1}) {
					t.Errorf("rank %d after the restart: the ends of epochs %v, want [0 1]", p.rank, ends)
				}
				var done struct {
					Steps  int
					Params []float64
				}
				b, _ = json.Marshal(p.line(t, "done"))
				json.Unmarshal(b, &done)
				if done.Steps != epochs*perRank {
					t.Errorf("rank %d after the restart: %d steps in all, want %d", p.rank, done.Steps, epochs*perRank)
				}
				if !slices.Equal(done.Params, fullParams) {
					t.Errorf("rank %d: the model after the restart %v differs from the uninterrupted run's %v", p.rank, done.Params, fullParams)
				}

				got := append(trained(t, dir, p.rank, "killed", k), trained(t, dir, p.rank, "resumed", 0)...)
				if len(got) != len(want[p.rank]) {
					t.Fatalf("rank %d: %d steps before the checkpoint and after the restart, want %d", p.rank, len(got), len(want[p.rank]))
				}
				for i, s := range want[p.rank] {
					if got[i].Epoch != s.Epoch || got[i].Step != s.Step || !slices.Equal(got[i].Keys, s.Keys) {
						t.Fatalf("rank %d step %d: epoch %d step %d keys %v; the uninterrupted run trained on epoch %d keys %v",
							p.rank, i+1, got[i].Epoch, got[i].Step, got[i].Keys, s.Epoch, s.Keys)
					}
				}
			}
		})
	}
}
