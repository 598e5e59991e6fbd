package integration

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/shardload/shardload/internal/shardgen"
)

// What a training job gets on the default path, through serve and the Python client
// (client/python/tests/job_check.py does the trainer's side).

var jobCheck = func() string { p, _ := filepath.Abs("../client/python/tests/job_check.py"); return p }()

// jobResult is job_check.py's output line.
type jobResult struct {
	Error, Message     string
	Keys               []string
	Batches, Planned   int
	Rows               int
	Estimated          bool
	Warnings           []string
	LastEpoch          map[string]any `json:"last_epoch"`
	Shapes             map[string][]any
	SlabBytes          int64  `json:"slab_bytes"`
	LargestSlab        int64  `json:"largest_slab"`
	LenDataset         int    `json:"len_dataset"`
	LenDataLoader      int    `json:"len_dataloader"`
	EpochBatches       int    `json:"epoch_batches"`
	SecondEpoch        int    `json:"second_epoch"`
	StateOrder         string `json:"state_order"`
	Fingerprint, Job   string
	Images, References int
	Shape              []int
	DType              string
	MaxAbsDiff, Bound  float64
	Seconds, Wait      float64
	WaitFraction       float64 `json:"wait_fraction"`
	Backpressure       float64
	Session            int
}

func runJobCheck(t *testing.T, py string, args ...string) jobResult {
	t.Helper()
	out := runPy(t, py, append([]string{jobCheck}, args...)...)
	var r jobResult
	if err := json.Unmarshal(out, &r); err != nil {
		t.Fatalf("job_check.py %s printed %q: %v", strings.Join(args, " "), out, err)
	}
	return r
}

// TestJobWithoutIndex: a job of three ranks through serve, on shards of very uneven
// sizes (10 to 400 samples) with no index: every rank fails before its first batch
// with a message naming "shardload index"; with allow_estimate each rank reads an
// approximate epoch, no sample twice, and is told in a Python warning what was left
// out or repeated; once "shardload index" has written an index beside the shards
// (while the server runs), every sample arrives exactly once across the ranks.
func TestJobWithoutIndex(t *testing.T) {
	py := python(t)
	dir := t.TempDir()
	spec := shardgen.Spec{Shards: 8, Samples: []int{10, 400, 35, 250, 12, 180, 60, 333}, Seed: 9,
		Fields: []shardgen.Field{{Ext: "bin", Kind: shardgen.Random, MinBytes: 200, MaxBytes: 6000}, {Ext: "cls", Kind: shardgen.Class}}}
	if _, err := shardgen.Generate(dir, spec); err != nil {
		t.Fatal(err)
	}
	const total, world = 10 + 400 + 35 + 250 + 12 + 180 + 60 + 333, 3
	pattern := filepath.Join(dir, spec.Pattern())
	srv := startServer(t, "", "--no-index-store", pattern)
	for rank := range world {
		r := runJobCheck(t, py, "epoch", srv.socket, strconv.Itoa(rank), strconv.Itoa(world))
		if r.Error != "ServerError" || r.Batches != 0 || !strings.Contains(r.Message, "shardload index --output") || !strings.Contains(r.Message, "allow_estimate=True") {
			t.Errorf("rank %d without an index: %+v; want a ServerError before any batch naming shardload index", rank, r)
		}
	}
	seen := map[string]int{}
	warned := 0
	for rank := range world {
		r := runJobCheck(t, py, "epoch", srv.socket, strconv.Itoa(rank), strconv.Itoa(world), "allow")
		if r.Error != "" || !r.Estimated || r.Batches != r.Planned {
			t.Fatalf("rank %d with allow_estimate: %+v", rank, r)
		}
		for _, k := range r.Keys {
			seen[k]++
		}
		left, padded := r.LastEpoch["left_out"].(float64), r.LastEpoch["padded"].(float64)
		if left+padded > 0 {
			warned++
			if len(r.Warnings) != 1 || !strings.Contains(r.Warnings[0], fmt.Sprintf("%d samples were left out", int(left))) {
				t.Errorf("rank %d left out %v and repeated %v samples: warnings %q", rank, left, padded, r.Warnings)
			}
		}
		t.Logf("rank %d, estimated: %d batches, %d samples, last epoch %v", rank, r.Batches, len(r.Keys), r.LastEpoch)
	}
	for k, n := range seen {
		if n > 1 {
			t.Errorf("sample %s delivered %d times", k, n)
		}
	}
	if warned == 0 || len(seen) == total {
		t.Errorf("the estimates were exact (%d of %d samples, %d ranks warned): the dataset does not test them", len(seen), total, warned)
	}
	// Indexed while the server runs: the next sessions plan from it.
	ok(t, nil, "index", "--output", dir+"/", pattern)
	clear(seen)
	for rank := range world {
		r := runJobCheck(t, py, "epoch", srv.socket, strconv.Itoa(rank), strconv.Itoa(world))
		if r.Error != "" || r.Estimated || len(r.Warnings) > 0 {
			t.Fatalf("rank %d with the index: %+v", rank, r)
		}
		for _, k := range r.Keys {
			seen[k]++
		}
	}
	dups := 0
	for _, n := range seen {
		dups += n - 1
	}
	if len(seen) != total-total%world || dups != 0 {
		t.Errorf("with the index: %d distinct samples (%d repeats) of %d; want all but the %d left to no rank, once", len(seen), dups, total, total%world)
	}
}

// TestJobBigBatches: through serve with its default flags, batches of 256 images
// decoded to 224x224x3 uint8, of 32 images as 3x224x224 float32 normalised (the
// default layout for torch), and of 256 raw JPEGs (about 110 KB each, 28 MB a batch)
// each run a whole epoch; a batch the memory budget cannot hold fails before the
// first batch, saying how much it needs.
func TestJobBigBatches(t *testing.T) {
	py := pythonPIL(t)
	paths := photoShards(t, py, t.TempDir(), 2, 150, "--seed", "6")
	// Counted first: estimated counts would pad or trim the epoch to its plan.
	srv := startServer(t, "", append([]string{"--no-index-store", "--count-first"}, paths...)...)
	for _, tc := range []struct {
		batch int
		field string
		shape []any
	}{
		{256, "img=jpg:image:uint8:224x224x3", []any{[]any{256.0, 224.0, 224.0, 3.0}, "torch.uint8"}},
		{32, "img=jpg:image:float32:imagenet", []any{[]any{32.0, 3.0, 224.0, 224.0}, "torch.float32"}},
		{256, "img=jpg", []any{"ragged", 256.0}},
	} {
		r := runJobCheck(t, py, "batches", srv.socket, strconv.Itoa(tc.batch), tc.field, "label=cls")
		want := (300 + tc.batch - 1) / tc.batch
		if r.Error != "" || r.Batches != want || r.Rows != 300 {
			t.Errorf("%s, batch %d: %+v; want %d batches of 300 samples", tc.field, tc.batch, r, want)
			continue
		}
		if got, want := fmt.Sprint(r.Shapes["img"]), fmt.Sprint(tc.shape); got != want {
			t.Errorf("%s: the first batch's column is %s, want %s", tc.field, got, want)
		}
		t.Logf("%s, batch %d: %d batches, slabs %d bytes (largest %d), warnings %q", tc.field, tc.batch, r.Batches, r.SlabBytes, r.LargestSlab, r.Warnings)
	}
	// 2,048 float32 images are 1.2 GB a batch: more than a slab may hold (--max-slab-size
	// 1 GiB), refused at the hello naming the Python setting.
	r := runJobCheck(t, py, "batches", srv.socket, "2048", "img=jpg:image:float32:imagenet")
	if r.Error != "ServerError" || r.Batches != 0 || !strings.Contains(r.Message, "batch of 2048") || !strings.Contains(r.Message, "batch_size=") {
		t.Errorf("a batch of 2048 float32 images: %+v; want an error before the first batch naming the batch", r)
	}
}

// TestJobTorchVision: CHW float32 batches normalised with ImageNet's mean and std are
// torchvision's Resize(224) + CenterCrop(224) + ToTensor() + Normalize() of the same
// JPEGs within 1/255 of a pixel; len() of ShardloadDataset and of its DataLoader is
// the batches an epoch yields; the order in state_dict() is client.order's
// fingerprint.
func TestJobTorchVision(t *testing.T) {
	py := pythonPIL(t)
	paths := photoShards(t, py, t.TempDir(), 2, 20, "--seed", "7")
	// Counted first: estimated counts would pad or trim the epoch to its plan.
	srv := startServer(t, "", append([]string{"--no-index-store", "--count-first"}, paths...)...)
	r := runJobCheck(t, py, append([]string{"vision", srv.socket, "img=jpg:image:float32:imagenet"}, paths...)...)
	t.Logf("vision: %+v", r)
	if r.Images != 40 || r.References != 40 || fmt.Sprint(r.Shape) != "[8 3 224 224]" || r.DType != "torch.float32" || r.MaxAbsDiff > r.Bound*1.01 {
		t.Errorf("against torchvision: %d images of %d, shape %v %s, largest difference %.5f (bound %.5f)", r.Images, r.References, r.Shape, r.DType, r.MaxAbsDiff, r.Bound)
	}
	r = runJobCheck(t, py, "torch", srv.socket, "6")
	if r.LenDataset != 7 || r.LenDataLoader != 7 || r.EpochBatches != 7 || r.SecondEpoch != 7 || r.StateOrder == "" || r.StateOrder != r.Fingerprint || r.Job == r.Fingerprint {
		t.Errorf("torch conventions: %+v; want len 7 (40 samples in batches of 6), the state's order equal to the fingerprint", r)
	}
}

// TestJobWait: a trainer stepping 50 ms per batch behind a loader that is well ahead
// waits under 5% of its time, as its client, the server's metrics, top and the
// session's end line all say, and the loader's backpressure is high; a trainer that
// does not wait behind a loader that decodes images on one worker is starved, and
// they all say that too.
func TestJobWait(t *testing.T) {
	py := pythonPIL(t)
	_, tokens := datasets(t)
	photos := photoShards(t, py, t.TempDir(), 2, 40, "--seed", "8")
	for _, tc := range []struct {
		name     string
		args     []string
		step, n  int
		starved  bool
		minLimit string
	}{
		{"ahead", []string{"--field", "npy", tokens}, 50, 60, false, "trainer"},
		{"behind", append([]string{"--workers", "1", "--autotune=false", "--field", "img=jpg:image:uint8:224x224x3", "--image-decoder", "go"}, photos...), 0, 80, true, ""},
	} {
		addr := "127.0.0.1:" + freePort(t)
		srv := startServer(t, "", append([]string{"--metrics", addr}, tc.args...)...)
		srv.out.next(t, 30*time.Second) // the metrics line
		run := startScript(t, py, jobCheck, "wait", srv.socket, strconv.Itoa(tc.step), strconv.Itoa(tc.n))
		// Two scrapes while the trainer reads: the session's shares of the interval.
		url := "http://" + addr + "/metrics"
		var a, b float64
		var wait, bp float64
		// Once the session is under way (a few batches taken; the deadline is a
		// guard against a hang, not a measure).
		for deadline := time.Now().Add(time.Minute); ; {
			if n, _ := value(scrape(t, url), "shardload_session_batches_total"); n >= 5 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: no session took 5 batches", tc.name)
			}
			time.Sleep(20 * time.Millisecond)
		}
		f0, t0 := scrape(t, url), time.Now()
		a, _ = value(f0, "shardload_session_wait_seconds_total")
		b, _ = value(f0, "shardload_session_backpressure_seconds_total")
		top := string(ok(t, nil, "top", "--once", "--every", "1s", addr))
		f1, t1 := scrape(t, url), time.Now()
		w1, found := value(f1, "shardload_session_wait_seconds_total")
		b1, _ := value(f1, "shardload_session_backpressure_seconds_total")
		lines, err := run.wait(t)
		if err != nil || len(lines) != 1 {
			t.Fatalf("%s: job_check wait: %v %v", tc.name, lines, err)
		}
		var res struct {
			WaitFraction float64 `json:"wait_fraction"`
			Backpressure float64
			Seconds      float64
		}
		raw, _ := json.Marshal(lines[0])
		json.Unmarshal(raw, &res)
		dt := t1.Sub(t0).Seconds()
		wait, bp = (w1-a)/dt, (b1-b)/dt
		t.Logf("%s: client waited %.1f%%, backpressure %.1fs of %.1fs; metrics: wait %.1f%%, backpressure %.1f%% (found %v); top:\n%s",
			tc.name, 100*res.WaitFraction, res.Backpressure, res.Seconds, 100*wait, 100*bp, found, top)
		endLine := regexp.MustCompile(`waited for batches ([0-9.]+)% of the time`)
		var logged float64 = -1
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline) && logged < 0; time.Sleep(10 * time.Millisecond) {
			if m := endLine.FindStringSubmatch(srv.log()); m != nil {
				logged, _ = strconv.ParseFloat(m[1], 64)
			}
		}
		if tc.starved {
			if res.WaitFraction < 0.5 || wait < 0.5 || logged < 50 || !strings.Contains(top, "%") {
				t.Errorf("%s: a starved trainer: client %.2f, metrics %.2f, end line %.1f%%; want all above half", tc.name, res.WaitFraction, wait, logged)
			}
			continue
		}
		if res.WaitFraction >= 0.05 || wait >= 0.05 || logged >= 5 || logged < 0 || bp < 0.5 || !strings.Contains(top, tc.minLimit) {
			t.Errorf("%s: a trainer behind which the loader waits: client %.3f, metrics %.3f, end line %.1f%% (want under 5%%), backpressure %.2f (want over half), top:\n%s",
				tc.name, res.WaitFraction, wait, logged, bp, top)
		}
	}
}

// startScript starts a Python script, returning what checkRun.wait reads.
func startScript(t *testing.T, py, script string, args ...string) *checkRun {
	t.Helper()
	return startPy(t, py, nil, append([]string{script}, args...)...)
}
