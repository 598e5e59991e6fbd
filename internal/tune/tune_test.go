package tune

import (
	"math"
	"math/rand/v2"
	"os"
	"testing"
)

// model is a pipeline's rate as a function of its knobs: workers that each wait
// latency per shard and spend cpu per shard, on cores CPUs, with a queue that
// must hold a shard's decoded samples to keep a worker busy, and parts that help
// a shard arrive when its bytes take longer than the latency.
type model struct {
	cores       float64
	cpu         float64 // CPU seconds per shard
	latency     float64 // seconds to first byte of a request
	transfer    float64 // seconds to move a shard's bytes on one connection
	shardBytes  int64
	copyPenalty float64 // CPU seconds per shard that parallel parts add (their copy)
}

func (m model) rate(k Knobs) float64 {
	par := float64(k.FetchParallel)
	fetch := m.latency + m.transfer/par
	cpu := m.cpu
	if k.FetchParallel > 1 {
		cpu += m.copyPenalty
	}
	perWorker := 1 / (fetch + cpu)
	// A queue smaller than a shard stalls its worker part of the time.
	fill := math.Min(1, float64(k.QueueBytes)/float64(m.shardBytes))
	shards := math.Min(float64(k.Workers)*perWorker*(0.5+0.5*fill), m.cores/cpu)
	return shards * 100 // 100 samples a shard
}

func (m model) fetchShare(k Knobs) float64 {
	fetch := m.latency + m.transfer/float64(k.FetchParallel)
	return fetch / (fetch + m.cpu)
}

// run steps the tuner n intervals against m with noise, returning the rates seen
// and the knobs at the end.
func run(t *testing.T, tu *Tuner, m model, n int, noise float64, fits func(Knobs) bool) ([]float64, Knobs) {
	t.Helper()
	rng := rand.New(rand.NewPCG(1, 2))
	var rates []float64
	k := tu.Knobs()
	for range n {
		if fits != nil && !fits(k) {
			t.Fatalf("tuner proposed %v, which does not fit", k)
		}
		r := m.rate(k) * (1 + noise*(2*rng.Float64()-1))
		rates = append(rates, r)
		k = tu.Step(Observation{Rate: r, Bound: true, FetchShare: m.fetchShare(k)})
	}
	return rates, k
}

// best returns the best rate over the grid the benchmark uses.
func best(m model, fits func(Knobs) bool) float64 {
	b := 0.0
	for _, w := range []int{1, 2, 4, 8} {
		for _, q := range []int64{1 << 20, 4 << 20, 16 << 20} {
			for _, p := range []int{1, 4} {
				k := Knobs{Workers: w, QueueBytes: q, FetchParallel: p, FetchPartSize: 8 << 20}
				if fits == nil || fits(k) {
					b = max(b, m.rate(k))
				}
			}
		}
	}
	return b
}

func TestConverges(t *testing.T) {
	start := Knobs{Workers: 2, QueueBytes: 2 << 20, FetchParallel: 4, FetchPartSize: 8 << 20}
	for _, c := range []struct {
		name string
		m    model
	}{
		{"latency", model{cores: 2, cpu: 0.002, latency: 0.05, transfer: 0.001, shardBytes: 400 << 10}},
		{"cpu", model{cores: 2, cpu: 0.05, latency: 0.001, transfer: 0.005, shardBytes: 1 << 20, copyPenalty: 0.02}},
		{"big shards", model{cores: 2, cpu: 0.1, latency: 0.01, transfer: 0.4, shardBytes: 8 << 20}},
	} {
		t.Run(c.name, func(t *testing.T) {
			tu := New(start, Pins(0), Limits{Lanes: 8, Fetch: true})
			_, _ = run(t, tu, c.m, 60, 0.03, nil)
			if !tu.Settled() && tu.holdFor == firstHold {
				t.Errorf("no round ended without a change in 60 intervals (at %v)", tu.Knobs())
			}
			rates, k := run(t, tu, c.m, 60, 0.03, nil)
			b := best(c.m, nil)
			// The second 60 intervals: holding, with the re-checks' trials.
			var sum float64
			for _, r := range rates {
				sum += r
			}
			got := sum / 60
			if got < 0.95*b {
				t.Errorf("settled at %v: %.0f samples/s, best grid point %.0f (%.2f)", k, got, b, got/b)
			}
		})
	}
}

func TestBudgetAndPins(t *testing.T) {
	m := model{cores: 8, cpu: 0.002, latency: 0.05, transfer: 0.2, shardBytes: 8 << 20}
	start := Knobs{Workers: 2, QueueBytes: 2 << 20, FetchParallel: 4, FetchPartSize: 8 << 20}
	fits := func(k Knobs) bool {
		return int64(k.Workers)*(k.QueueBytes+int64(k.FetchParallel)*k.FetchPartSize) <= 160<<20
	}
	tu := New(start, Pins(0).With(QueueBytes, true), Limits{Lanes: 8, Fetch: true, Fits: fits})
	_, k := run(t, tu, m, 200, 0.02, fits)
	if k.QueueBytes != start.QueueBytes {
		t.Errorf("pinned queue bytes changed to %d", k.QueueBytes)
	}
	if k == start {
		t.Errorf("nothing changed from %v on a latency-bound pipeline with room in the budget", k)
	}
}

func TestHoldsWhenNotBound(t *testing.T) {
	start := Knobs{Workers: 2, QueueBytes: 2 << 20, FetchParallel: 4, FetchPartSize: 8 << 20}
	tu := New(start, Pins(0), Limits{Lanes: 8, Fetch: true})
	for range 50 {
		if k := tu.Step(Observation{Rate: 1000, Bound: false}); k != start {
			t.Fatalf("changed to %v while the consumer did not wait", k)
		}
	}
}

func TestNoFetchKnobsForLocalShards(t *testing.T) {
	m := model{cores: 2, cpu: 0.002, latency: 0.05, transfer: 0.1, shardBytes: 400 << 10}
	start := Knobs{Workers: 2, QueueBytes: 2 << 20, FetchParallel: 4, FetchPartSize: 8 << 20}
	tu := New(start, Pins(0), Limits{Lanes: 8})
	_, k := run(t, tu, m, 100, 0, nil)
	if k.FetchParallel != start.FetchParallel || k.FetchPartSize != start.FetchPartSize {
		t.Errorf("fetch knobs moved to %v with no remote shards", k)
	}
}

// TestSaturatedCPU: with the CPU saturated the tuner adds no workers, read-ahead or
// parts, even where they would raise the model's rate (a store on the same cores
// makes the workers wait, but not for want of workers).
func TestSaturatedCPU(t *testing.T) {
	m := model{cores: 8, cpu: 0.002, latency: 0.05, transfer: 0.01, shardBytes: 400 << 10}
	start := Knobs{Workers: 2, QueueBytes: 2 << 20, FetchParallel: 1, FetchPartSize: 8 << 20}
	tu := New(start, Pins(0), Limits{Lanes: 8, Fetch: true})
	k := start
	for range 100 {
		k = tu.Step(Observation{Rate: m.rate(k), Bound: true, FetchShare: m.fetchShare(k), Saturated: true})
		if k.Workers > start.Workers || k.ReadAhead > 0 || k.FetchParallel > start.FetchParallel {
			t.Fatalf("moved to %v with the CPU saturated", k)
		}
	}
}

// TestOneLuckyInterval: a change measured faster once and then not is undone.
func TestOneLuckyInterval(t *testing.T) {
	start := Knobs{Workers: 2, QueueBytes: 2 << 20, FetchParallel: 1, FetchPartSize: 8 << 20}
	tu := New(start, Pins(0), Limits{Lanes: 8, Fetch: true})
	k := tu.Step(Observation{Rate: 1000, Bound: true, FetchShare: 1})
	if k == start {
		t.Fatal("no change tried")
	}
	tried := k
	// More workers act at once: the next interval is the trial.
	k = tu.Step(Observation{Rate: 1200, Bound: true, FetchShare: 1}) // lucky
	if k != tried {
		t.Fatalf("changed to %v before confirming %v", k, tried)
	}
	k = tu.Step(Observation{Rate: 880, Bound: true, FetchShare: 1}) // not again
	if k == tried || tu.Changes() != 0 {
		t.Errorf("kept %v after one fast and one slow interval (mean 1040 < 1000 x %.2f)", tried, 1+Gain)
	}
}

// TestSureGain: a change that shows a gain no noise explains is kept at once.
func TestSureGain(t *testing.T) {
	start := Knobs{Workers: 2, QueueBytes: 2 << 20, FetchParallel: 1, FetchPartSize: 8 << 20}
	tu := New(start, Pins(0), Limits{Lanes: 8, Fetch: true})
	tried := tu.Step(Observation{Rate: 1000, Bound: true, FetchShare: 1})
	tu.Step(Observation{Rate: 3000, Bound: true, FetchShare: 1})
	if tu.Changes() != 1 || tu.Kept() != tried {
		t.Errorf("a 3x faster interval: %d changes kept, at %v; want %v kept", tu.Changes(), tu.Kept(), tried)
	}
}

// TestJump: workers that wait for the source nearly all the time jump to as many
// readers as the read-ahead allows, in one trial, lowered to fit the budget.
func TestJump(t *testing.T) {
	m := model{cores: 2, cpu: 0.002, latency: 0.1, transfer: 0.001, shardBytes: 100 << 10}
	start := Knobs{Workers: 2, QueueBytes: 2 << 20, FetchParallel: 4, FetchPartSize: 8 << 20}
	fits := func(k Knobs) bool { return int64(8+k.ReadAhead)*k.QueueBytes <= 100<<20 } // 50 open shards at most
	tu := New(start, Pins(0), Limits{Lanes: 8, Fetch: true, Fits: fits})
	k := tu.Step(Observation{Rate: m.rate(start), Bound: true, FetchShare: m.fetchShare(start)})
	if k.Workers < 32 || 8+k.ReadAhead > 50 || k.Workers != 8+k.ReadAhead {
		t.Fatalf("first trial %v: want a jump to 32-50 workers, as many shards open", k)
	}
	tu.Step(Observation{Rate: m.rate(k), Bound: true, FetchShare: m.fetchShare(k)})
	if tu.Kept() != k {
		t.Errorf("the jump (%.0f -> %.0f samples/s) was not kept: at %v", m.rate(start), m.rate(k), tu.Kept())
	}
}

// TestJumpTradesParts: where the parts are what keeps the jump from fitting, it reads
// each shard as one stream and opens as many shards as fit that way.
func TestJumpTradesParts(t *testing.T) {
	start := Knobs{Workers: 2, QueueBytes: 2 << 20, FetchParallel: 4, FetchPartSize: 8 << 20}
	fits := func(k Knobs) bool {
		parts := int64(0)
		if k.FetchParallel > 1 {
			parts = int64(k.FetchParallel) * k.FetchPartSize
		}
		return int64(8+k.ReadAhead)*(k.QueueBytes+parts) <= 800<<20
	}
	tu := New(start, Pins(0), Limits{Lanes: 8, Fetch: true, Fits: fits})
	k := tu.Step(Observation{Rate: 100, Bound: true, FetchShare: 1})
	if k.Workers != 72 || k.ReadAhead != 64 || k.FetchParallel != 1 {
		t.Errorf("jump to %v: want 72 workers, 64 read ahead, one stream", k)
	}
	tu = New(start, Pins(0).With(FetchParallel, true), Limits{Lanes: 8, Fetch: true, Fits: fits})
	if k := tu.Step(Observation{Rate: 100, Bound: true, FetchShare: 1}); k.FetchParallel != 4 || !fits(k) || k.Workers < 16 {
		t.Errorf("jump with pinned parts to %v: want the parts kept, fewer shards", k)
	}
}

func TestCPUTimes(t *testing.T) {
	idle, total, ok := CPUTimes()
	if _, err := os.Stat("/proc/stat"); err != nil {
		if ok {
			t.Errorf("CPU times %d/%d without /proc/stat", idle, total)
		}
		return
	}
	if !ok || total == 0 || idle > total {
		t.Errorf("CPU times: idle %d of %d, ok %v", idle, total, ok)
	}
}
