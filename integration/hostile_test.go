package integration

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shardload/shardload/index"
	"github.com/shardload/shardload/internal/shardgen"
	"github.com/shardload/shardload/internal/testutil"
	"github.com/shardload/shardload/shard"
)

// TestServeHostileIndex: through serve, from MinIO, indexes that lie about the
// shards (counts above the real ones, with or without versions; offsets moved into
// the samples' members; a billion samples per shard) end both ranks of a job within
// seconds with an error, or with exactly their share of the real samples: no hang,
// no sample twice, and the server alive and small.
func TestServeHostileIndex(t *testing.T) {
	py := python(t)
	m := testutil.MinIO(t)
	m.CreateBucket(t, "hostile")
	spec := shardgen.Spec{Shards: 8, SamplesPerShard: 150, Seed: 31,
		Fields: []shardgen.Field{{Ext: "bin", Kind: shardgen.Random, MinBytes: 500, MaxBytes: 2000}, {Ext: "cls", Kind: shardgen.Class}}}
	putShards(t, m, "hostile", "ds", "", spec)
	pattern := "s3://hostile/ds/" + spec.Pattern()
	// The true index, as "shardload index" writes it, changed by each case.
	infos, err := index.Read(bytes.NewReader(ok(t, m.Env(), "index", "--no-compress", pattern)), "stdout")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		change func(shard.Info) shard.Info
	}{
		{"counts above", func(in shard.Info) shard.Info { in.Samples, in.Offsets, in.Version = 160, nil, ""; return in }},
		{"counts above, versioned", func(in shard.Info) shard.Info { in.Samples, in.Offsets = 160, nil; return in }},
		{"offsets into the members", func(in shard.Info) shard.Info {
			offs := make([]int64, len(in.Offsets))
			for i, o := range in.Offsets {
				offs[i] = o + 1536
			}
			in.Offsets = offs
			return in
		}},
		{"a billion samples", func(in shard.Info) shard.Info { in.Samples, in.Offsets, in.Version = 1_000_000_000, nil, ""; return in }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var bad []shard.Info
			for _, in := range infos {
				bad = append(bad, tc.change(in))
			}
			var b bytes.Buffer
			if err := index.Write(&b, bad, false); err != nil {
				t.Fatal(err)
			}
			m.Put(t, "hostile", "ds/"+index.FileName, b.Bytes())
			srv := startServerEnv(t, m.Env(), "", "--no-index-store", pattern)
			seen := map[string]int{}
			for rank := range 2 {
				t0 := time.Now()
				r := runJobCheck(t, py, "epoch", srv.socket, strconv.Itoa(rank), "2")
				took := time.Since(t0)
				if took > 40*time.Second {
					t.Errorf("rank %d took %v", rank, took)
				}
				if r.Error == "" && len(r.Keys) != 8*150/2 {
					t.Errorf("rank %d delivered %d samples without an error; its share is %d", rank, len(r.Keys), 8*150/2)
				}
				for _, k := range r.Keys {
					if seen[k]++; seen[k] > 1 {
						t.Errorf("rank %d delivered %s twice", rank, k)
					}
				}
				t.Logf("rank %d: %d samples in %v; %s %.200s", rank, len(r.Keys), took.Round(time.Millisecond), r.Error, r.Message)
			}
			if rss := rssOf(t, srv.pid()); rss > 1<<30 || rss == 0 {
				t.Errorf("the server holds %d MiB (0: gone)", rss>>20)
			}
		})
	}
}

// TestServeKilledWithEstimates: a job of two ranks reading a dataset without an index
// (allow_estimate) through serve, which is killed mid-epoch and started again; the
// ranks resume from their last states: no sample twice in an epoch. The ranks are
// independent processes, as a job's ranks are between two collectives: one may be an
// epoch ahead of the other (its interpreter started sooner), so the kill waits until
// each has taken a few batches of epoch 1 or later, wherever the other is.
func TestServeKilledWithEstimates(t *testing.T) {
	py := python(t)
	dir := t.TempDir()
	spec := shardgen.Spec{Shards: 6, Samples: []int{40, 250, 17, 90, 130, 60}, Seed: 5,
		Fields: []shardgen.Field{{Ext: "bin", Kind: shardgen.Random, MinBytes: 200, MaxBytes: 6000}, {Ext: "cls", Kind: shardgen.Class}}}
	if _, err := shardgen.Generate(dir, spec); err != nil {
		t.Fatal(err)
	}
	pattern := filepath.Join(dir, spec.Pattern())
	socket := filepath.Join(t.TempDir(), "run", "loader.sock")
	srv := startServer(t, socket, "--no-index-store", pattern)
	servers := []*server{srv}
	trainer, _ := filepath.Abs("../bench/soak_trainer.py")
	logs := []string{filepath.Join(dir, "rank-0.log"), filepath.Join(dir, "rank-1.log")}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var ranks []*exec.Cmd
	rankErr := make([]*lockedWriter, 2)
	for rank := range 2 {
		cmd := exec.CommandContext(ctx, py, trainer, "--socket", socket, "--rank", strconv.Itoa(rank), "--world", "2",
			"--log", logs[rank], "--batch-size", "8", "--step-ms", "10", "--allow-estimate")
		cmd.Env = append(os.Environ(), "PYTHONDONTWRITEBYTECODE=1")
		rankErr[rank] = &lockedWriter{w: &strings.Builder{}}
		cmd.Stderr = rankErr[rank]
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		ranks = append(ranks, cmd)
		defer func() { cmd.Process.Kill(); cmd.Wait() }()
	}
	// The epoch each rank has reached, from the last whole line of its log.
	reached := func(rank int) (epoch, seq int) {
		f, err := os.Open(logs[rank])
		if err != nil {
			return -1, -1
		}
		defer f.Close()
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		epoch, seq = -1, -1
		for sc.Scan() {
			var rec struct{ Epoch, Seq int }
			if json.Unmarshal(sc.Bytes(), &rec) == nil {
				epoch, seq = rec.Epoch, rec.Seq
			}
		}
		return epoch, seq
	}
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(2 * time.Minute); !cond(); time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				var b strings.Builder
				for r := range 2 {
					e, q := reached(r)
					fmt.Fprintf(&b, "\nrank %d: epoch %d, batch %d; its stderr:\n%s", r, e, q, rankErr[r].String())
				}
				for i, s := range servers {
					fmt.Fprintf(&b, "\nserver %d's log:\n%s", i, s.log())
				}
				t.Fatalf("timed out waiting until %s:%s", what, b.String())
			}
		}
	}
	// Mid-epoch (1 or later): the server is killed and started again.
	past := func(rank int) bool {
		e, q := reached(rank)
		return e > 1 || e == 1 && q >= 3
	}
	waitFor("both ranks are 3 batches into epoch 1 or later", func() bool { return past(0) && past(1) })
	var killed [2]int // the epoch each rank had reached: it is resumed within it or the next
	for r := range 2 {
		e, q := reached(r)
		killed[r] = e
		t.Logf("rank %d: epoch %d, batch %d when the server is killed", r, e, q)
	}
	srv.cmd.Process.Signal(syscall.SIGKILL)
	srv.wait(t)
	servers = append(servers, startServer(t, socket, "--no-index-store", pattern))
	waitFor("both ranks are two epochs past the kill", func() bool {
		e0, _ := reached(0)
		e1, _ := reached(1)
		return e0 >= killed[0]+2 && e1 >= killed[1]+2
	})
	for _, c := range ranks {
		c.Process.Kill()
		c.Wait()
	}
	// Every epoch before the one both ranks have reached is whole in both logs.
	done, _ := reached(0)
	if e1, _ := reached(1); e1 < done {
		done = e1
	}
	per := map[int]map[string]int{}
	for _, log := range logs {
		data, err := os.ReadFile(log)
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(data), "\n") {
			var rec struct {
				Epoch int
				Keys  []string
			}
			if json.Unmarshal([]byte(line), &rec) != nil {
				continue
			}
			if per[rec.Epoch] == nil {
				per[rec.Epoch] = map[string]int{}
			}
			for _, k := range rec.Keys {
				per[rec.Epoch][k]++
			}
		}
	}
	for e := 0; e < done; e++ {
		twice := 0
		for _, n := range per[e] {
			if n > 1 {
				twice++
			}
		}
		t.Logf("epoch %d: %d distinct samples, %d read twice", e, len(per[e]), twice)
		if len(per[e]) == 0 {
			t.Errorf("epoch %d: no sample in the logs", e)
		}
		if twice > 0 {
			t.Errorf("epoch %d: %d samples read twice across the server's restart", e, twice)
		}
	}
}
