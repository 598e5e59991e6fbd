package integration

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// scrape reads url's Prometheus text and returns its families, parsed.
func scrape(t *testing.T, url string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s", url, resp.Status)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("parsing %s: %v", url, err)
	}
	return fams
}

// value returns the value of the metric of family name whose labels include want
// (pairs name, value), and whether there is one.
func value(fams map[string]*dto.MetricFamily, name string, want ...string) (float64, bool) {
	f := fams[name]
	if f == nil {
		return 0, false
	}
	for _, m := range f.Metric {
		labels := map[string]string{}
		for _, l := range m.Label {
			labels[l.GetName()] = l.GetValue()
		}
		match := true
		for i := 0; i+1 < len(want); i += 2 {
			match = match && labels[want[i]] == want[i+1]
		}
		if !match {
			continue
		}
		switch {
		case m.Counter != nil:
			return m.Counter.GetValue(), true
		case m.Gauge != nil:
			return m.Gauge.GetValue(), true
		}
	}
	return 0, false
}

// TestServeMetrics: serve --metrics during and after an epoch served to the Python
// client: the counters a scrape shows, parsed as Prometheus text, agree with the
// run: mid-epoch the session's samples are those the trainer took plus at most what
// the ring holds ahead, and after the session the totals are the epoch's samples and
// batches.
func TestServeMetrics(t *testing.T) {
	py := python(t)
	images, _ := datasets(t)
	addr := "127.0.0.1:" + freePort(t)
	const slabs, batch, pause = 3, 4, 5
	srv := startServer(t, "", "--slabs", fmt.Sprint(slabs), "--slab-size", "4MiB", "--metrics", addr, images)
	if l := srv.out.next(t, 30*time.Second); !strings.Contains(l, "metrics on http://"+addr+"/metrics") {
		t.Fatalf("server said %q", l)
	}
	url := "http://" + addr + "/metrics"
	if n, found := value(scrape(t, url), "shardload_sessions"); !found || n != 0 {
		t.Fatalf("sessions before any trainer: %v %v", n, found)
	}
	tr := startTrainer(t, py, srv.socket, -1, "--batch-size", fmt.Sprint(batch), "--pause-after", fmt.Sprint(pause), "--field", "jpg")
	ready := tr.line(t)
	if ready.Ready == nil {
		t.Fatalf("first line %+v", ready)
	}
	for l := tr.line(t); l.Paused == 0; l = tr.line(t) {
	}
	// Paused, holding batch 5: the loader has collated at most the ring's slabs more.
	fams := scrape(t, url)
	if n, _ := value(fams, "shardload_sessions"); n != 1 {
		t.Fatalf("sessions during the epoch: %v", n)
	}
	samples, found := value(fams, "shardload_session_samples_total", "rank", "0")
	if !found || samples < pause*batch || samples > (pause+slabs)*batch {
		t.Errorf("mid-epoch: session samples %v (found %v), want %d to %d", samples, found, pause*batch, (pause+slabs)*batch)
	}
	batches, _ := value(fams, "shardload_session_batches_total", "rank", "0")
	if batches < pause || batches > pause+slabs {
		t.Errorf("mid-epoch: session batches %v, want %d to %d", batches, pause, pause+slabs)
	}
	if read, _ := value(fams, "shardload_session_read_bytes_total", "rank", "0"); read <= 0 {
		t.Errorf("mid-epoch: %v bytes read", read)
	}
	if out, _ := value(fams, "shardload_session_batch_bytes_total", "rank", "0"); out <= 0 {
		t.Errorf("mid-epoch: %v bytes of batches", out)
	}
	if fetch, found := value(fams, "shardload_session_stage_seconds_total", "rank", "0", "stage", "fetch"); !found || fetch <= 0 {
		t.Errorf("mid-epoch: fetch stage %v s (found %v)", fetch, found)
	}
	if b, _ := value(fams, "shardload_session_memory_budget_bytes", "rank", "0"); b < slabs*4<<20 {
		t.Errorf("mid-epoch: memory budget %v, less than the slabs' %d bytes", b, slabs*4<<20)
	}
	// The settings in effect, and the memory they take within the budget.
	budget, _ := value(fams, "shardload_session_memory_budget_bytes", "rank", "0")
	if m, found := value(fams, "shardload_session_memory_bytes", "rank", "0"); !found || m < slabs*4<<20 || m > budget {
		t.Errorf("mid-epoch: memory at the settings in effect %v (found %v), want from the slabs' %d bytes to the budget %v", m, found, slabs*4<<20, budget)
	}
	if q, found := value(fams, "shardload_session_queued_bytes", "rank", "0"); !found || q < 0 {
		t.Errorf("mid-epoch: queued bytes %v (found %v)", q, found)
	}
	if w, found := value(fams, "shardload_session_setting", "rank", "0", "setting", "workers"); !found || w < 1 {
		t.Errorf("mid-epoch: workers setting %v (found %v)", w, found)
	}
	if q, found := value(fams, "shardload_session_setting", "rank", "0", "setting", "queue_bytes"); !found || q < 256<<10 {
		t.Errorf("mid-epoch: queue_bytes setting %v (found %v)", q, found)
	}
	if n, _ := value(fams, "shardload_session_ring_slabs", "rank", "0"); n != slabs {
		t.Errorf("mid-epoch: ring of %v slabs, want %d", n, slabs)
	}
	if n, _ := value(fams, "shardload_session_ring_slabs_in_use", "rank", "0"); n < 1 || n > slabs {
		t.Errorf("mid-epoch: %v slabs in use (the trainer holds one), want 1 to %d", n, slabs)
	}
	if _, found := value(fams, "shardload_fetch_retries_total"); !found {
		t.Error("no shardload_fetch_retries_total")
	}
	if _, found := value(fams, "go_goroutines"); !found {
		t.Error("no Go runtime metrics")
	}
	// The live view reads the same metrics: one line for the paused session.
	top := ok(t, nil, "top", "--once", "--every", "200ms", addr)
	lines := strings.Split(strings.TrimSpace(string(top)), "\n")
	if len(lines) != 3 || !strings.Contains(lines[0], "samples/s") || !strings.Contains(lines[1], " 0 ") || !strings.HasPrefix(strings.TrimSpace(lines[2]), "all") {
		t.Errorf("shardload top:\n%s", top)
	}
	tr.stdin.Write([]byte("go on\n"))
	got, errLine := tr.run(t)
	if errLine != nil {
		t.Fatalf("trainer: %+v", errLine)
	}
	if len(got)+pause != ready.Ready.Batches {
		t.Fatalf("%d batches after the pause, %d before, ready said %d", len(got), pause, ready.Ready.Batches)
	}
	// The trainer has gone: once its session has ended, the totals are the epoch's.
	eventually(t, "the session ended", func() bool {
		n, _ := value(scrape(t, url), "shardload_sessions")
		return n == 0
	})
	fams = scrape(t, url)
	if n, _ := value(fams, "shardload_samples_total"); int(n) != ready.Ready.Samples {
		t.Errorf("after the epoch: samples_total %v, the epoch has %d", n, ready.Ready.Samples)
	}
	if n, _ := value(fams, "shardload_batches_total"); int(n) != ready.Ready.Batches {
		t.Errorf("after the epoch: batches_total %v, the epoch has %d", n, ready.Ready.Batches)
	}
	if n, _ := value(fams, "shardload_read_bytes_total"); n <= 0 {
		t.Errorf("after the epoch: read_bytes_total %v", n)
	}
}
