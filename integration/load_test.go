package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shardload/shardload/internal/shardgen"
)

// TestServeLoad: one serve under load: eight trainer ranks of one job reading an
// epoch at once, 200 connections opened and closed (half after one batch), and a
// trainer that takes two batches and then stops reading. Every rank of the job gets
// exactly its share (every sample once across them); the stalled trainer holds up no
// one; the server's memory stays within its sessions' budgets; and once the sessions
// end its goroutines, open files and sessions return to what they were.
func TestServeLoad(t *testing.T) {
	py := python(t)
	dir := t.TempDir()
	spec := shardgen.Spec{Shards: 16, SamplesPerShard: 100, Seed: 21,
		Fields: []shardgen.Field{{Ext: "bin", Kind: shardgen.Random, MinBytes: 2000, MaxBytes: 8000}, {Ext: "cls", Kind: shardgen.Class}}}
	if _, err := shardgen.Generate(dir, spec); err != nil {
		t.Fatal(err)
	}
	pattern := filepath.Join(dir, spec.Pattern())
	ok(t, nil, "index", "--output", dir+"/", pattern)
	const world, total, budget = 8, 1600, 128 << 20
	addr := "127.0.0.1:" + freePort(t)
	srv := startServer(t, "", "--memory", "128MiB", "--shuffle-bytes", "16MiB", "--max-sessions", "16", "--metrics", addr, pattern)
	srv.out.next(t, 30*time.Second) // the metrics line
	url := "http://" + addr + "/metrics"
	base := scrape(t, url)
	goroutines0, _ := value(base, "go_goroutines")
	fds0, _ := value(base, "process_open_fds")

	// The server's RSS, sampled until the load is over.
	var peak int64
	stop := make(chan struct{})
	var sampler sync.WaitGroup
	sampler.Go(func() {
		for {
			peak = max(peak, rssOf(t, srv.pid()))
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	})

	// The trainer that stops reading, holding two slabs.
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	stall := exec.CommandContext(ctx, py, jobCheck, "stall", srv.socket)
	stall.Env = append(os.Environ(), "PYTHONDONTWRITEBYTECODE=1")
	out, err := stall.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stallErr strings.Builder
	stall.Stderr = &lockedWriter{w: &stallErr}
	if err := stall.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { stall.Process.Kill(); stall.Wait() }()
	select {
	case l, open := <-newLineReader(out).lines:
		if !open || !strings.Contains(l, `"stalled": 2`) {
			stall.Wait()
			t.Fatalf("the stalling trainer said %q; stderr: %s", l, stallErr.String())
		}
	case <-time.After(time.Minute):
		t.Fatal("the stalling trainer said nothing in a minute")
	}

	churn := startScript(t, py, jobCheck, "churn", srv.socket, "200")
	var ranks []*checkRun
	for rank := range world {
		ranks = append(ranks, startScript(t, py, jobCheck, "epoch", srv.socket, strconv.Itoa(rank), strconv.Itoa(world)))
	}
	seen := map[string]int{}
	for rank, r := range ranks {
		lines, err := r.wait(t)
		if err != nil || len(lines) != 1 {
			t.Fatalf("rank %d: %v %v", rank, lines, err)
		}
		var res jobResult
		raw, _ := json.Marshal(lines[0])
		json.Unmarshal(raw, &res)
		if res.Error != "" || len(res.Keys) != total/world {
			t.Errorf("rank %d: %s %s, %d samples; want %d", rank, res.Error, res.Message, len(res.Keys), total/world)
		}
		for _, k := range res.Keys {
			seen[k]++
		}
	}
	if lines, err := churn.wait(t); err != nil || len(lines) != 1 || string(lines[0]["connections"]) != "200" {
		t.Errorf("churn: %v %v", lines, err)
	}
	for k, n := range seen {
		if n != 1 {
			t.Errorf("sample %s delivered %d times", k, n)
		}
	}
	if len(seen) != total {
		t.Errorf("%d distinct samples across the ranks, want %d", len(seen), total)
	}
	stall.Process.Kill()
	stall.Wait()
	close(stop)
	sampler.Wait()
	// At most 10 sessions at once (8 ranks, the stalled one, a churning one), each
	// within its budget, and the process's own overhead (MemoryOverhead, 160 MiB).
	if bound := int64(10*budget + 160<<20); peak > bound || peak == 0 {
		t.Errorf("peak RSS %d MiB, want under %d MiB", peak>>20, bound>>20)
	}
	// Everything the sessions held is given back (the deadline is a guard against a
	// leak that never returns, not a measure).
	var goroutines, fds, sessions float64
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		fams := scrape(t, url)
		sessions, _ = value(fams, "shardload_sessions")
		goroutines, _ = value(fams, "go_goroutines")
		fds, _ = value(fams, "process_open_fds")
		if sessions == 0 && goroutines <= goroutines0+3 && fds <= fds0+1 || time.Now().After(deadline) {
			break
		}
	}
	t.Logf("peak RSS %d MiB; after: %v sessions, goroutines %v (before %v), open files %v (before %v), RSS %d MiB",
		peak>>20, sessions, goroutines, goroutines0, fds, fds0, rssOf(t, srv.pid())>>20)
	if sessions != 0 || goroutines > goroutines0+3 || fds > fds0+1 {
		t.Errorf("after the sessions: %v sessions, %v goroutines (before %v), %v open files (before %v)", sessions, goroutines, goroutines0, fds, fds0)
	}
}

// rssOf returns the resident memory of process pid, in bytes (0 once it is gone).
func rssOf(t *testing.T, pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10
		}
	}
	return 0
}
