package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	sl "github.com/shardload/shardload"
	"github.com/shardload/shardload/shard"
)

// The tests of the Python client's own behaviour: batch lifetime, DataLoader workers,
// leaving an epoch early, errors without a server, and the order check across ranks.
// client/python/tests/client_check.py does the Python side; every mode of it reads
// fields jpg, label=cls:int and txt with seed 5 and batch size 8.

var clientCheckScript = func() string {
	p, _ := filepath.Abs("../client/python/tests/client_check.py")
	return p
}()

var checkFields = []string{"jpg", "label=cls:int", "txt"}

const (
	checkSeed  = 5
	checkBatch = 8
)

// clientCheck runs client_check.py with args and extra environment variables, and
// returns its output lines as JSON objects. It fails the test when the script fails.
func clientCheck(t *testing.T, py string, env []string, args ...string) []map[string]json.RawMessage {
	t.Helper()
	out, err := startClientCheck(t, py, env, args...).wait(t)
	if err != nil {
		t.Fatalf("client_check.py %s: %v", strings.Join(args, " "), err)
	}
	return out
}

type checkRun struct {
	cmd    *exec.Cmd
	stdout bytes.Buffer
	stderr bytes.Buffer
	cancel context.CancelFunc
}

func startClientCheck(t *testing.T, py string, env []string, args ...string) *checkRun {
	t.Helper()
	return startPy(t, py, env, append([]string{clientCheckScript}, args...)...)
}

// startPy starts py with args (a script and its arguments) and extra environment
// variables.
func startPy(t *testing.T, py string, env []string, args ...string) *checkRun {
	t.Helper()
	// A guard against a hang, not a measurement.
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	r := &checkRun{cancel: cancel}
	r.cmd = exec.CommandContext(ctx, py, args...)
	r.cmd.Env = append(os.Environ(), "PYTHONDONTWRITEBYTECODE=1")
	r.cmd.Env = append(r.cmd.Env, env...)
	r.cmd.Stdout, r.cmd.Stderr = &r.stdout, &r.stderr
	if err := r.cmd.Start(); err != nil {
		cancel()
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); r.cmd.Wait() })
	return r
}

// wait waits for the script and decodes its output lines; the error says how it
// failed, with its stderr.
func (r *checkRun) wait(t *testing.T) ([]map[string]json.RawMessage, error) {
	t.Helper()
	err := r.cmd.Wait()
	r.cancel()
	if err != nil {
		return nil, &scriptError{err: err, stderr: r.stderr.String()}
	}
	var lines []map[string]json.RawMessage
	for _, l := range strings.Split(strings.TrimSpace(r.stdout.String()), "\n") {
		if l == "" {
			continue
		}
		var m map[string]json.RawMessage
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("client_check.py printed %q: %v", l, err)
		}
		lines = append(lines, m)
	}
	return lines, nil
}

type scriptError struct {
	err    error
	stderr string
}

func (e *scriptError) Error() string { return e.err.Error() + "; stderr:\n" + e.stderr }

// field decodes member name of a line into v.
func field(t *testing.T, line map[string]json.RawMessage, name string, v any) {
	t.Helper()
	raw, ok := line[name]
	if !ok {
		t.Fatalf("no %q in %v", name, line)
	}
	if err := json.Unmarshal(raw, v); err != nil {
		t.Fatalf("%q of %s: %v", name, raw, err)
	}
}

// membersOf reads the member ext of every sample of the shard files paths: key ->
// bytes.
func membersOf(t *testing.T, paths []string, ext string) map[string][]byte {
	t.Helper()
	out := map[string][]byte{}
	for key, m := range readSamples(t, paths) {
		if v, ok := m[ext]; ok {
			out[key] = []byte(v)
		}
	}
	return out
}

// samplesOf reads every sample of the shards of pattern: key -> extension -> bytes.
func samplesOf(t *testing.T, pattern string) map[string]map[string]string {
	t.Helper()
	urls, err := shard.Expand(pattern)
	if err != nil {
		t.Fatal(err)
	}
	return readSamples(t, urls)
}

// readSamples reads every sample of the shard files paths: key -> extension -> bytes.
func readSamples(t *testing.T, paths []string) map[string]map[string]string {
	t.Helper()
	out := map[string]map[string]string{}
	for _, p := range paths {
		f, err := os.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		r := shard.NewReader(f, shard.Options{})
		for {
			s, err := r.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			m := map[string]string{}
			for _, fl := range s.Fields {
				m[fl.Ext] = string(fl.Data)
			}
			out[s.Key] = m
		}
		r.Close()
		f.Close()
	}
	return out
}

// checkLabels fails unless labels are the cls members of the samples keys names.
func checkLabels(t *testing.T, what string, samples map[string]map[string]string, keys []string, labels []int) {
	t.Helper()
	if len(keys) == 0 || len(keys) != len(labels) {
		t.Fatalf("%s: %d keys, %d labels", what, len(keys), len(labels))
	}
	bad := 0
	for i, k := range keys {
		s, ok := samples[k]
		if !ok {
			t.Fatalf("%s: key %q is no sample of the shards", what, k)
		}
		if want, _ := strconv.Atoi(s["cls"]); labels[i] != want {
			if bad == 0 {
				t.Errorf("%s: row %d (%s): label %d, the shard says %d", what, i, k, labels[i], want)
			}
			bad++
		}
	}
	if bad > 1 {
		t.Errorf("%s: %d of %d labels differ from the shards'", what, bad, len(keys))
	}
}

// libraryKeys returns the keys of each batch of an epoch as the Go library reads it.
func libraryKeys(t *testing.T, cfg sl.Config) [][]string {
	t.Helper()
	var out [][]string
	for _, b := range libraryBatches(t, cfg, 1) {
		out = append(out, b.Keys)
	}
	return out
}

func sameKeys(t *testing.T, what string, got, want [][]string) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d batches, want %d", what, len(got), len(want))
	}
	for i := range want {
		if !slices.Equal(got[i], want[i]) {
			t.Fatalf("%s: batch %d: keys %v, want %v", what, i, got[i], want[i])
		}
	}
}

// A training loop that keeps each step's labels (and a text column, and the tensor of
// a batch it released itself) reads them unchanged after the slabs were refilled many
// times; a loop that keeps nothing never pays for a copy; a released batch hands out
// no columns.
func TestClientKeepsBatches(t *testing.T) {
	py := python(t)
	images, _ := datasets(t)
	samples := samplesOf(t, images)
	// Three slabs: each is refilled about five times in the epoch of 15 batches.
	srv := startServer(t, "", "--slabs", "3", "--slab-size", "4MiB", images)
	for _, output := range []string{"numpy", "torch", "memoryview"} {
		t.Run(output, func(t *testing.T) {
			lines := clientCheck(t, py, nil, "keep", srv.socket, output)
			if len(lines) != 2 {
				t.Fatalf("%d lines: %v", len(lines), lines)
			}
			var ready struct {
				Batches, Slabs int
				Order          *struct {
					Fingerprint string
					Settings    map[string]any
				}
				Placement map[string]any
			}
			field(t, lines[0], "ready", &ready)
			if ready.Batches != 15 || ready.Slabs != 3 {
				t.Fatalf("ready %+v", ready)
			}
			if ready.Order == nil || !regexp.MustCompile(`^[0-9a-f]{16}$`).MatchString(ready.Order.Fingerprint) ||
				ready.Order.Settings["seed"] != float64(checkSeed) {
				t.Errorf("client.order %+v: want the ready's fingerprint and settings", ready.Order)
			}
			if _, ok := ready.Placement["reason"]; !ok {
				t.Errorf("client.placement %v: want the ready's placement", ready.Placement)
			}

			res := lines[1]
			var kept []struct {
				Keys   []string
				Labels []int
			}
			field(t, res, "labels", &kept)
			if len(kept) != 10 {
				t.Fatalf("%d kept batches, want 10", len(kept))
			}
			for i, k := range kept {
				checkLabels(t, "kept labels of step "+strconv.Itoa(i), samples, k.Keys, k.Labels)
			}
			var ragged struct {
				Keys []string
				Rows []string
			}
			field(t, res, "ragged", &ragged)
			if len(ragged.Rows) != len(ragged.Keys) {
				t.Fatalf("kept ragged column: %d rows for %d keys", len(ragged.Rows), len(ragged.Keys))
			}
			for i, k := range ragged.Keys {
				if ragged.Rows[i] != samples[k]["txt"] {
					t.Errorf("kept txt row %d (%s): %q, the shard says %q", i, k, ragged.Rows[i], samples[k]["txt"])
				}
			}
			var explicit struct {
				Keys         []string
				Labels       []int
				Row1         string
				AfterRelease string `json:"after_release"`
			}
			field(t, res, "explicit", &explicit)
			checkLabels(t, "tensor of a batch released by the trainer", samples, explicit.Keys, explicit.Labels)
			if explicit.Row1 != samples[explicit.Keys[1]]["txt"] {
				t.Errorf("row of a batch released by the trainer: %q, want %q", explicit.Row1, samples[explicit.Keys[1]]["txt"])
			}
			if !strings.Contains(explicit.AfterRelease, "batch 5 of epoch 0 was released") || !strings.Contains(explicit.AfterRelease, "copy()") {
				t.Errorf("b[\"label\"] after b.release(): %q", explicit.AfterRelease)
			}
			var toTorch struct {
				Keys   []string
				Labels []int
			}
			field(t, res, "to_torch", &toTorch)
			checkLabels(t, "kept to_torch() tensor", samples, toTorch.Keys, toTorch.Labels)

			var readonly []*bool
			field(t, res, "readonly", &readonly)
			for i, ro := range readonly {
				if output != "torch" && (ro == nil || !*ro) {
					t.Errorf("step %d: label column writable", i)
				}
			}
			var detached int
			field(t, res, "detached_keeping", &detached)
			if detached == 0 {
				t.Errorf("no batch detached while the loop kept views of 10 of them")
			}
			var normal struct {
				Detached, Deferred, Released int
				AfterRelease                 string `json:"after_release"`
				KeysAfterRelease             int    `json:"keys_after_release"`
			}
			field(t, res, "normal", &normal)
			if normal.Detached != 0 || normal.Released < 14 {
				t.Errorf("a loop that keeps nothing: %+v; want no detach and every batch but the last released", normal)
			}
			if !strings.Contains(normal.AfterRelease, "batch 14 of epoch 1 was released") || normal.KeysAfterRelease != 3 {
				t.Errorf("the last batch after the loop: %+v", normal)
			}
			var stats map[string]float64
			field(t, res, "stats", &stats)
			if stats["detached_bytes"] > 0 {
				t.Logf("%s: %v detaches, %.1f MB copied in %.2f ms (%.3f ms/MB)", output, stats["detached"],
					stats["detached_bytes"]/1e6, stats["detach_seconds"]*1e3, stats["detach_seconds"]*1e3/(stats["detached_bytes"]/1e6))
			}
		})
	}
}

// DataLoader worker processes would each read the epoch as the same rank: the dataset
// refuses more than one, and with none or one reads each sample once.
func TestClientDataLoaderWorkers(t *testing.T) {
	py := python(t)
	images, _ := datasets(t)
	all := slices.Sorted(func(yield func(string) bool) {
		for k := range samplesOf(t, images) {
			if !yield(k) {
				return
			}
		}
	})
	srv := startServer(t, "", images)
	lines := clientCheck(t, py, nil, "workers", srv.socket)
	if len(lines) != 3 {
		t.Fatalf("%d lines: %v", len(lines), lines)
	}
	var refused struct {
		Workers   int
		Error     string
		Shardload bool
		Message   string
	}
	b, _ := json.Marshal(lines[0])
	json.Unmarshal(b, &refused)
	if refused.Workers != 2 || !refused.Shardload || !strings.Contains(refused.Message, "num_workers=2") ||
		!strings.Contains(refused.Message, "DataLoader(ds, batch_size=None, num_workers=0)") {
		t.Errorf("num_workers=2: %+v; want a ShardloadError saying to use num_workers=0", refused)
	}
	for _, l := range lines[1:] {
		var workers int
		var keys []string
		field(t, l, "workers", &workers)
		field(t, l, "keys", &keys)
		if !slices.Equal(slices.Sorted(slices.Values(keys)), all) {
			t.Errorf("num_workers=%d: %d keys, %d distinct; want each of the %d samples once",
				workers, len(keys), len(slices.Compact(slices.Sorted(slices.Values(keys)))), len(all))
		}
	}
}

// Leaving an epoch early and starting another works at once, through the client and
// through ShardloadDataset, and yields what a fresh client reads at that epoch.
func TestClientBreakEpoch(t *testing.T) {
	py := python(t)
	images, _ := datasets(t)
	samples := samplesOf(t, images)
	srv := startServer(t, "", images)
	lines := clientCheck(t, py, nil, "break", srv.socket)
	want := map[int][][]string{}
	for _, e := range []int{1, 3, 4} {
		want[e] = libraryKeys(t, sl.Config{URLs: []string{images}, Fields: fields(t, checkFields...), Seed: checkSeed,
			Epoch: e, BatchSize: checkBatch, Logf: t.Logf})
	}
	seen := map[string]bool{}
	for _, l := range lines {
		var what string
		var epoch int
		var batches [][]string
		field(t, l, "what", &what)
		field(t, l, "epoch", &epoch)
		field(t, l, "batches", &batches)
		name := what + " epoch " + strconv.Itoa(epoch)
		seen[name] = true
		sameKeys(t, name, batches, want[epoch])
		if what == "client" && epoch == 1 {
			var end struct {
				Type      string
				Epoch     int
				Abandoned bool
				Batches   int
			}
			field(t, l, "abandoned_end", &end)
			if end.Type != "end" || end.Epoch != 0 || !end.Abandoned || end.Batches < 2 {
				t.Errorf("end of the epoch left after 2 batches: %+v", end)
			}
			var stale string
			var staleReleased int
			field(t, l, "stale", &stale)
			field(t, l, "stale_released", &staleReleased)
			if stale != "stopped" || staleReleased != 0 {
				t.Errorf("the generator of the abandoned epoch, resumed: %s, %d releases", stale, staleReleased)
			}
			var held struct {
				Keys   []string
				Labels []int
			}
			field(t, l, "held", &held)
			checkLabels(t, "labels held across the abandon", samples, held.Keys, held.Labels)
		}
	}
	for _, name := range []string{"client epoch 1", "client epoch 3", "fresh epoch 1", "dataset epoch 1", "dataset epoch 4"} {
		if !seen[name] {
			t.Errorf("no result for %s: %v", name, lines)
		}
	}
}

// Without a server, the client raises its own errors, never a bare OSError.
func TestClientNoServer(t *testing.T) {
	py := python(t)
	images, _ := datasets(t)
	socket := filepath.Join(t.TempDir(), "run", "loader.sock")
	srv := startServer(t, socket, images)
	srv.cmd.Process.Signal(syscall.SIGKILL)
	srv.wait(t)
	if _, err := os.Lstat(socket); err != nil {
		t.Fatalf("a killed server leaves its socket file: %v", err)
	}
	want := map[string]string{
		"killed-server": "NoServer", "bound-closed": "NoServer", "missing": "NoServer",
		"stream-socket": "ShardloadError", "silent": "Timeout",
	}
	lines := clientCheck(t, py, nil, "noserver", socket, t.TempDir())
	if len(lines) != len(want) {
		t.Fatalf("%d lines: %v", len(lines), lines)
	}
	for _, l := range lines {
		var c struct {
			Case      string
			Error     string
			Shardload bool
			Message   string
		}
		b, _ := json.Marshal(l)
		json.Unmarshal(b, &c)
		if c.Error != want[c.Case] || !c.Shardload {
			t.Errorf("%s: %s (a ShardloadError: %v): %s; want %s", c.Case, c.Error, c.Shardload, c.Message, want[c.Case])
		}
	}
}

// freePort returns a TCP port on the loopback that nothing listened on a moment ago.
func freePort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
}

// The acceptance test: two servers of a node pair, one world of four ranks
// (two on each server). When the servers' settings differ, every rank fails at start
// naming the setting, comparing through torch.distributed's store or, without one,
// all_gather_object; when they agree, the ranks read disjoint parts that cover the
// epoch once. A rank whose peers never report fails with Timeout.
func TestClientOrderAcrossRanks(t *testing.T) {
	py := python(t)
	images, _ := datasets(t)
	a := startServer(t, "", "--open-shards", "3", images)
	b := startServer(t, "", "--open-shards", "2", images) // differs from a
	c := startServer(t, "", "--open-shards", "3", images) // agrees with a
	port := freePort(t)
	var runs []*checkRun
	for rank := range 4 {
		first, second := a.socket, a.socket
		if rank >= 2 {
			first, second = b.socket, c.socket
		}
		env := []string{"MASTER_ADDR=127.0.0.1", "MASTER_PORT=" + port, "GLOO_SOCKET_IFNAME=lo", "RANK=" + strconv.Itoa(rank),
			"WORLD_SIZE=4", "LOCAL_RANK=" + strconv.Itoa(rank%2)}
		runs = append(runs, startClientCheck(t, py, env, "dist", first, second))
	}
	results := make([][]map[string]json.RawMessage, 4)
	errs := make([]error, 4)
	var wg sync.WaitGroup
	for rank, r := range runs {
		wg.Go(func() { results[rank], errs[rank] = r.wait(t) })
	}
	wg.Wait()
	union := map[string]int{}
	var fingerprints []string
	for rank, lines := range results {
		if errs[rank] != nil {
			t.Fatalf("rank %d: %v", rank, errs[rank])
		}
		if want := map[bool]int{true: 4, false: 3}[rank == 0]; len(lines) != want {
			t.Fatalf("rank %d: %d lines, want %d: %v", rank, len(lines), want, lines)
		}
		if rank == 0 {
			// A client of rank 0 alone: the others' orders never come.
			var missing struct{ Error, Message string }
			b, _ := json.Marshal(lines[3])
			json.Unmarshal(b, &missing)
			if missing.Error != "Timeout" || !strings.Contains(missing.Message, "rank(s) 1, 2, 3 did not report") {
				t.Errorf("rank 0 alone: %+v; want a Timeout naming ranks 1, 2, 3", missing)
			}
		}
		// The first and the last client, through the store and through all_gather_object.
		for _, l := range []map[string]json.RawMessage{lines[0], lines[2]} {
			var mismatch struct {
				What, Error, Message string
			}
			b, _ := json.Marshal(l)
			json.Unmarshal(b, &mismatch)
			if mismatch.Error != "OrderMismatch" || !strings.Contains(mismatch.Message, "lanes") {
				t.Errorf("rank %d with servers of different --open-shards (%s): %+v; want OrderMismatch naming lanes", rank, mismatch.What, mismatch)
			} else {
				t.Logf("rank %d (%s): %s", rank, mismatch.What, mismatch.Message)
			}
		}
		var keys []string
		var order struct{ Fingerprint string }
		if _, ok := lines[1]["error"]; ok {
			t.Fatalf("rank %d with servers that agree: %s", rank, lines[1]["message"])
		}
		field(t, lines[1], "keys", &keys)
		field(t, lines[1], "order", &order)
		fingerprints = append(fingerprints, order.Fingerprint)
		var want []string
		for _, b := range libraryBatches(t, sl.Config{URLs: []string{images}, Fields: fields(t, "cls:int"), Seed: checkSeed,
			BatchSize: checkBatch, OpenShards: 3, Rank: rank, World: 4, Logf: t.Logf}, 1) {
			want = append(want, b.Keys[:b.Rows-b.Padded]...)
		}
		if !slices.Equal(keys, want) {
			t.Errorf("rank %d: keys %v, want the library's %v", rank, keys, want)
		}
		for _, k := range keys {
			union[k]++
		}
	}
	if len(slices.Compact(slices.Clone(fingerprints))) != 1 {
		t.Errorf("fingerprints %v of servers that agree", fingerprints)
	}
	// 115 samples in a world of 4: 28 each, 3 read by no rank.
	if len(union) != 112 {
		t.Errorf("%d distinct samples across the ranks, want 112", len(union))
	}
	for k, n := range union {
		if n != 1 {
			t.Errorf("sample %s read %d times", k, n)
		}
	}
}

// $SHARDLOAD_EXPECT_ORDER pins the order a client accepts.
func TestClientExpectOrder(t *testing.T) {
	py := python(t)
	images, _ := datasets(t)
	srv := startServer(t, "", images)
	lines := clientCheck(t, py, nil, "expect", srv.socket)
	if len(lines) != 2 {
		t.Fatalf("%d lines: %v", len(lines), lines)
	}
	for _, l := range lines {
		var c struct {
			Case, Message string
			Error         *string
		}
		b, _ := json.Marshal(l)
		json.Unmarshal(b, &c)
		switch {
		case c.Case == "right" && c.Error != nil:
			t.Errorf("the server's own fingerprint expected: %s: %s", *c.Error, c.Message)
		case c.Case == "wrong" && (c.Error == nil || *c.Error != "OrderMismatch" || !strings.Contains(c.Message, "SHARDLOAD_EXPECT_ORDER")):
			t.Errorf("another fingerprint expected: %+v", l)
		}
	}
}

// The protocol cases a real server makes hard to time, against a scripted server in
// the client's process: a batch of the abandoned epoch that arrives after the epoch
// message, an epoch that ended before the server read the epoch message, two epoch
// messages in a row, a batch held past the next epoch, and the GPU's PCI address and
// CUDA_VISIBLE_DEVICES in the hello.
func TestClientProtocol(t *testing.T) {
	py := python(t)
	lines := clientCheck(t, py, nil, "fake", t.TempDir())
	var cases []string
	for _, l := range lines {
		var c string
		var problems []string
		field(t, l, "case", &c)
		field(t, l, "problems", &problems)
		cases = append(cases, c)
		for _, p := range problems {
			t.Errorf("%s: %s", c, p)
		}
		if len(problems) > 0 {
			t.Logf("%s: the client sent %s", c, l["got"])
		}
	}
	if want := []string{"abandon", "race", "twice", "held", "hello"}; !slices.Equal(cases, want) {
		t.Errorf("cases %v, want %v", cases, want)
	}
}

// TestClientCountsEstimated: a server whose dataset has no index tells the client its
// counts are estimates, and a job of one rank gets its planned batches, each sample
// once or counted as left out; with the index beside the shards the counts are exact
// and every sample comes once.
func TestClientCountsEstimated(t *testing.T) {
	py := python(t)
	images, _ := datasets(t)
	// The same shards without the index.
	bare := t.TempDir()
	shards, _ := filepath.Glob(filepath.Join(filepath.Dir(images), "img-*.tar"))
	for _, p := range shards {
		data, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		os.WriteFile(filepath.Join(bare, filepath.Base(p)), data, 0o644)
	}
	for _, tc := range []struct {
		name      string
		pattern   string
		estimated bool
	}{
		{"index", images, false},
		{"no index", filepath.Join(bare, filepath.Base(images)), true},
	} {
		srv := startServer(t, "", "--no-index-store", tc.pattern)
		lines := clientCheck(t, py, nil, "counts", srv.socket)
		var ready struct {
			Estimated bool
			Batches   int
		}
		var got struct{ Got, Distinct, Yielded, LeftOut int }
		field(t, lines[0], "estimated", &ready.Estimated)
		field(t, lines[0], "batches", &ready.Batches)
		field(t, lines[1], "got", &got.Got)
		field(t, lines[1], "distinct", &got.Distinct)
		field(t, lines[1], "yielded", &got.Yielded)
		field(t, lines[1], "left_out", &got.LeftOut)
		if ready.Estimated != tc.estimated || got.Yielded != ready.Batches || got.Got != got.Distinct || got.Distinct+got.LeftOut != 115 ||
			!tc.estimated && got.Distinct != 115 {
			t.Errorf("%s: estimated %v, %d batches of %d planned, %d samples (%d distinct), %d left out; want %v, the planned batches and the 115 samples once each or left out",
				tc.name, ready.Estimated, got.Yielded, ready.Batches, got.Got, got.Distinct, got.LeftOut, tc.estimated)
		}
	}
}
