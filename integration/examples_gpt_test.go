package integration

import (
	"archive/tar"
	"encoding/binary"
	"encoding/json"
	"errors"
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

	"github.com/shardload/shardload/internal/shardgen"
	"github.com/shardload/shardload/internal/testutil"
)

// The tests of examples/train_gpt.py: a tiny GPT trained on packed token rows through
// "shardload serve" from documents in MinIO (gen's docs preset), as one process and as
// two DDP ranks, and across a failure: two ranks killed after a checkpoint, the job
// resumed on one rank and, from the same checkpoint, on three through torchrun.

var trainGPTScript = func() string {
	p, _ := filepath.Abs("../examples/train_gpt.py")
	return p
}()

// gptResult is train_gpt.py's last output line.
type gptResult struct {
	Rank        int      `json:"rank"`
	World       int      `json:"world"`
	Rows        int      `json:"rows"`
	Tokens      int      `json:"tokens"`
	Targets     int      `json:"targets"`
	Batches     int      `json:"batches"`
	Steps       int      `json:"steps"`
	LossFirst   *float64 `json:"loss_first"`
	LossLast    *float64 `json:"loss_last"`
	ResumedFrom *int     `json:"resumed_from"`
	Digest      string   `json:"digest"`
	RowDigests  []string `json:"row_digests"`
}

func (g gptResult) losses() trainResult {
	return trainResult{LossFirst: g.LossFirst, LossLast: g.LossLast}
}

// gptLine decodes line, one of train_gpt.py's result lines.
func gptLine(t *testing.T, what, line string) gptResult {
	t.Helper()
	var res gptResult
	if err := json.Unmarshal([]byte(line), &res); err != nil {
		t.Fatalf("%s printed %q: %v", what, line, err)
	}
	return res
}

// gptResults returns the result line of each of runs, which must have exited 0.
func gptResults(t *testing.T, runs []*trainRun) []gptResult {
	t.Helper()
	var out []gptResult
	for rank, r := range runs {
		if r.err != nil {
			t.Fatalf("rank %d: %v; stderr:\n%s", rank, r.err, r.stderr.String())
		}
		lines := strings.Split(strings.TrimSpace(r.stdout.String()), "\n")
		res := gptLine(t, fmt.Sprintf("rank %d", rank), lines[len(lines)-1])
		if res.Rank != rank || res.World != len(runs) {
			t.Fatalf("rank %d of %d printed %+v", rank, len(runs), res)
		}
		finite(t, fmt.Sprintf("rank %d", rank), res.losses())
		out = append(out, res)
	}
	return out
}

// torchrunResults returns the result line of each of the world ranks of a torchrun
// run (--redirects 1 --tee 1: each rank's lines prefixed "[default<rank>]:").
func torchrunResults(t *testing.T, r *trainRun, world int) []gptResult {
	t.Helper()
	if err := r.wait(); err != nil {
		t.Fatalf("torchrun: %v; stdout:\n%s\nstderr:\n%s", err, r.stdout.String(), r.stderr.String())
	}
	out := make([]gptResult, world)
	found := make([]bool, world)
	for _, l := range strings.Split(r.stdout.String(), "\n") {
		for rank := range world {
			if rest, ok := strings.CutPrefix(l, fmt.Sprintf("[default%d]:", rank)); ok && strings.Contains(rest, `"rank"`) {
				out[rank], found[rank] = gptLine(t, fmt.Sprintf("rank %d", rank), rest), true
			}
		}
	}
	for rank := range world {
		if !found[rank] {
			t.Fatalf("no result line of rank %d; stdout:\n%s\nstderr:\n%s", rank, r.stdout.String(), r.stderr.String())
		}
		finite(t, fmt.Sprintf("rank %d", rank), out[rank].losses())
	}
	return out
}

// docTokens returns the tokens of the documents of the tar shards at paths, each
// a .npy version 1.0 member of uint16 ids, plus one eos each.
func docTokens(t *testing.T, paths []string) int {
	t.Helper()
	n := 0
	for _, p := range paths {
		f, err := os.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		tr := tar.NewReader(f)
		for {
			_, err := tr.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			b, err := io.ReadAll(tr)
			if err != nil || len(b) < 10 {
				t.Fatalf("%s: a member of %d bytes: %v", p, len(b), err)
			}
			n += (len(b)-10-int(binary.LittleEndian.Uint16(b[8:10])))/2 + 1
		}
		f.Close()
	}
	return n
}

// sameRows fails the test unless got holds the row digests of want, each as often.
func sameRows(t *testing.T, what string, got, want []string) {
	t.Helper()
	g, w := slices.Clone(got), slices.Clone(want)
	slices.Sort(g)
	slices.Sort(w)
	if !slices.Equal(g, w) {
		t.Errorf("%s: %d rows that are not the %d wanted, each once", what, len(got), len(want))
	}
}

// digestSum is the digest of rows as train_gpt.py prints it: the sum of their
// digests modulo 2**64.
func digestSum(t *testing.T, rows []string) string {
	t.Helper()
	var sum uint64
	for _, h := range rows {
		v, err := strconv.ParseUint(h, 16, 64)
		if err != nil {
			t.Fatalf("row digest %q: %v", h, err)
		}
		sum += v
	}
	return fmt.Sprintf("%016x", sum)
}

// TestExampleTrainGPT trains examples/train_gpt.py on gen's docs preset in MinIO: the
// mask checked without a server; one process reads every row of the epoch once, and
// its loss falls; two DDP ranks read the same rows between them, as many batches each;
// two ranks killed after the checkpoint of step 3 resume on one rank (which reads
// exactly the rows the checkpoint's job had not, in the order of the one-rank epoch)
// and, from the same checkpoint, on three ranks through torchrun (those rows, once
// across the ranks, as many batches each).
func TestExampleTrainGPT(t *testing.T) {
	py := python(t)

	t.Run("mask", func(t *testing.T) {
		r := startTrain(t, py, nil, trainGPTScript, "--check-mask")
		if err := r.wait(); err != nil {
			t.Fatalf("--check-mask: %v; stdout:\n%s\nstderr:\n%s", err, r.stdout.String(), r.stderr.String())
		}
		if !strings.Contains(r.stdout.String(), `"check_mask": "ok"`) {
			t.Fatalf("--check-mask printed %q", r.stdout.String())
		}
	})

	m := testutil.MinIO(t)
	m.CreateBucket(t, "gpt")
	spec := shardgen.Spec{Shards: 4, SamplesPerShard: 16, Fields: shardgen.Presets["docs"], Seed: 3}
	paths, _ := putShards(t, m, "gpt", "docs", "", spec)
	const seq, batch, crash = 128, 8, 3
	const pack = "tokens.npy:128:eos=1:pad=0"
	tokens := docTokens(t, paths)
	rows := (tokens + seq - 1) / seq // the epoch's rows: the last one filled with pad
	if rows <= 2*crash*batch+3*batch {
		t.Fatalf("%d rows: too few for a resume on three ranks after step %d", rows, crash)
	}
	pattern := "s3://gpt/docs/" + spec.Pattern()
	// The index beside the shards records every document's length: the rows of an
	// epoch are planned from it.
	ok(t, m.Env(), "index", "--output", "s3://gpt/docs/", pattern)
	srv := startServerEnv(t, m.Env(), "", "--pack", pack, pattern)
	common := []string{"--pack", pack, "--batch-size", strconv.Itoa(batch), "--report-rows"}

	var one gptResult
	t.Run("one-process", func(t *testing.T) {
		one = gptResults(t, scriptRanks(t, py, trainGPTScript, srv.socket, 1, common...))[0]
		if one.Rows != rows || one.Tokens != rows*seq || len(one.RowDigests) != rows || one.Batches != (rows+batch-1)/batch ||
			one.Steps != one.Batches || one.ResumedFrom != nil || one.Targets <= 0 || one.Targets >= tokens {
			t.Fatalf("one process: %d rows, %d tokens, %d targets, %d batches, %d steps, resumed from %v; want %d rows (%d tokens with the eos) in %d batches",
				one.Rows, one.Tokens, one.Targets, one.Batches, one.Steps, one.ResumedFrom, rows, tokens, (rows+batch-1)/batch)
		}
		sameRows(t, "one process", one.RowDigests, slices.Compact(slices.Sorted(slices.Values(one.RowDigests))))
		if one.Digest != digestSum(t, one.RowDigests) {
			t.Errorf("digest %s, the sum of the rows' %s", one.Digest, digestSum(t, one.RowDigests))
		}
		t.Logf("one process: %d rows in %d batches, loss from %.3f to %.3f", one.Rows, one.Batches, *one.LossFirst, *one.LossLast)
		// From about ln(1024) at the start; the documents' ids are skewed and half of
		// them follow their predecessor: a model that trains does better.
		if *one.LossFirst < 6 || *one.LossLast > *one.LossFirst-0.5 {
			t.Errorf("loss from %.3f to %.3f: want it to start near ln(1024) and fall", *one.LossFirst, *one.LossLast)
		}
	})
	if one.RowDigests == nil {
		t.Fatal("no one-process epoch to compare with")
	}

	var two []gptResult
	t.Run("two-ranks", func(t *testing.T) {
		two = gptResults(t, scriptRanks(t, py, trainGPTScript, srv.socket, 2, common...))
		if two[0].Batches != two[1].Batches || two[0].Batches != (rows+2*batch-1)/(2*batch) {
			t.Errorf("batches per rank %d and %d, want %d each", two[0].Batches, two[1].Batches, (rows+2*batch-1)/(2*batch))
		}
		if two[0].Rows+two[1].Rows != rows {
			t.Errorf("two ranks read %d + %d rows, the epoch has %d", two[0].Rows, two[1].Rows, rows)
		}
		sameRows(t, "two ranks", append(slices.Clone(two[0].RowDigests), two[1].RowDigests...), one.RowDigests)
		if sum := digestSum(t, []string{two[0].Digest, two[1].Digest}); sum != one.Digest {
			t.Errorf("the ranks' digests add up to %s, the one-process epoch's is %s", sum, one.Digest)
		}
	})
	if len(two) != 2 || len(two[0].RowDigests) < crash*batch || len(two[1].RowDigests) < crash*batch {
		t.Fatal("no two-rank epoch to compare with")
	}

	// Two ranks killed by themselves after the checkpoint of step 3: 2 x 3 x 8 rows read.
	ckpt := filepath.Join(t.TempDir(), "gpt.pt")
	withCkpt := append(slices.Clone(common), "--checkpoint", ckpt, "--checkpoint-every", "100")
	crashed := scriptRanks(t, py, trainGPTScript, srv.socket, 2, append(slices.Clone(withCkpt), "--crash-after-step", strconv.Itoa(crash))...)
	for rank, r := range crashed {
		var ee *exec.ExitError
		if r.timedOut() || !errors.As(r.err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
			t.Fatalf("rank %d: %v, want killed by SIGKILL; stderr:\n%s", rank, r.err, r.stderr.String())
		}
	}
	if !strings.Contains(crashed[0].stdout.String(), fmt.Sprintf(`"step": %d,`, crash)) {
		t.Fatalf("rank 0 wrote no checkpoint of step %d: %s", crash, crashed[0].stdout.String())
	}
	saved, err := os.ReadFile(ckpt)
	if err != nil {
		t.Fatal(err)
	}
	read := 2 * crash * batch // the rows before the checkpoint: the first 3 batches of each rank
	before := append(slices.Clone(two[0].RowDigests[:crash*batch]), two[1].RowDigests[:crash*batch]...)
	rest := one.RowDigests[read:]
	sameRows(t, "the rows before the checkpoint", before, one.RowDigests[:read])

	t.Run("resume-on-one", func(t *testing.T) {
		res := gptResults(t, scriptRanks(t, py, trainGPTScript, srv.socket, 1, withCkpt...))[0]
		want := (len(rest) + batch - 1) / batch
		if res.ResumedFrom == nil || *res.ResumedFrom != crash || res.Batches != want || res.Steps != crash+want || res.Rows != len(rest) {
			t.Errorf("resumed on one rank: from %v, %d batches, %d steps, %d rows; want step %d, %d batches, %d steps, %d rows",
				res.ResumedFrom, res.Batches, res.Steps, res.Rows, crash, want, crash+want, len(rest))
		}
		if !slices.Equal(res.RowDigests, rest) {
			t.Errorf("resumed on one rank: %d rows, not the %d the one-process epoch read after row %d, in its order", len(res.RowDigests), len(rest), read)
		}
		sameRows(t, "before the checkpoint and resumed on one rank", append(slices.Clone(before), res.RowDigests...), one.RowDigests)
	})

	t.Run("resume-on-three", func(t *testing.T) {
		if err := os.WriteFile(ckpt, saved, 0o644); err != nil { // the checkpoint of step 3 again
			t.Fatal(err)
		}
		r := startTrain(t, py, []string{"SHARDLOAD_SOCKET=" + srv.socket}, append([]string{"-m", "torch.distributed.run",
			"--nproc_per_node", "3", "--master_port", freePort(t), "--redirects", "1", "--tee", "1",
			"--log_dir", t.TempDir(), trainGPTScript}, withCkpt...)...)
		res := torchrunResults(t, r, 3)
		want := (len(rest) + 3*batch - 1) / (3 * batch)
		var got []string
		total := 0
		for rank, rr := range res {
			if rr.World != 3 || rr.ResumedFrom == nil || *rr.ResumedFrom != crash || rr.Batches != want || rr.Steps != crash+want {
				t.Errorf("rank %d resumed on three: world %d, from %v, %d batches, %d steps; want step %d, %d batches, %d steps",
					rank, rr.World, rr.ResumedFrom, rr.Batches, rr.Steps, crash, want, crash+want)
			}
			got = append(got, rr.RowDigests...)
			total += rr.Rows
		}
		if total != len(rest) {
			t.Errorf("three ranks read %d rows after the checkpoint, %d were left", total, len(rest))
		}
		sameRows(t, "resumed on three ranks", got, rest)
	})
}
