package main

import (
	"github.com/shardload/shardload"

	"bufio"
	"bytes"
	"context"
	"io"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

func parseText(t *testing.T, text string) map[string]*dto.MetricFamily {
	t.Helper()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	return fams
}

const topBefore = `# TYPE shardload_session_samples_total counter
shardload_session_samples_total{rank="1",session="7"} 1000
shardload_session_samples_total{rank="0",session="6"} 500
# TYPE shardload_session_read_bytes_total counter
shardload_session_read_bytes_total{rank="1",session="7"} 1e8
shardload_session_read_bytes_total{rank="0",session="6"} 5e7
# TYPE shardload_session_wait_seconds_total counter
shardload_session_wait_seconds_total{rank="1",session="7"} 1
shardload_session_wait_seconds_total{rank="0",session="6"} 0
# TYPE shardload_session_stage_seconds_total counter
shardload_session_stage_seconds_total{rank="1",session="7",stage="fetch"} 3
shardload_session_stage_seconds_total{rank="1",session="7",stage="decode"} 1
shardload_session_stage_seconds_total{rank="0",session="6",stage="fetch"} 1
shardload_session_stage_seconds_total{rank="0",session="6",stage="decode"} 1
# TYPE shardload_samples_total counter
shardload_samples_total 1500
# TYPE shardload_read_bytes_total counter
shardload_read_bytes_total 1.5e8
`

const topAfter = `# TYPE shardload_session_samples_total counter
shardload_session_samples_total{rank="1",session="7"} 3000
shardload_session_samples_total{rank="0",session="6"} 900
shardload_session_samples_total{rank="2",session="8"} 100
# TYPE shardload_session_read_bytes_total counter
shardload_session_read_bytes_total{rank="1",session="7"} 3e8
shardload_session_read_bytes_total{rank="0",session="6"} 9e7
shardload_session_read_bytes_total{rank="2",session="8"} 1e7
# TYPE shardload_session_wait_seconds_total counter
shardload_session_wait_seconds_total{rank="1",session="7"} 1.5
shardload_session_wait_seconds_total{rank="0",session="6"} 1
shardload_session_wait_seconds_total{rank="2",session="8"} 0
# TYPE shardload_session_backpressure_seconds_total counter
shardload_session_backpressure_seconds_total{rank="2",session="8"} 1.6
# TYPE shardload_session_stage_seconds_total counter
shardload_session_stage_seconds_total{rank="1",session="7",stage="fetch"} 4
shardload_session_stage_seconds_total{rank="1",session="7",stage="decode"} 3
shardload_session_stage_seconds_total{rank="0",session="6",stage="fetch"} 2.5
shardload_session_stage_seconds_total{rank="0",session="6",stage="decode"} 1.2
shardload_session_stage_seconds_total{rank="2",session="8",stage="fetch"} 0.1
# TYPE shardload_session_setting gauge
shardload_session_setting{rank="1",session="7",setting="workers"} 8
shardload_session_setting{rank="1",session="7",setting="read_ahead"} 16
# TYPE shardload_session_memory_bytes gauge
shardload_session_memory_bytes{rank="1",session="7"} 4e8
# TYPE shardload_session_memory_budget_bytes gauge
shardload_session_memory_budget_bytes{rank="1",session="7"} 1e9
# TYPE shardload_samples_total counter
shardload_samples_total 5500
# TYPE shardload_read_bytes_total counter
shardload_read_bytes_total 5.5e8
`

// TestTopView: the rates between two scrapes, per session and in all; a session that
// started in between counts from zero.
func TestTopView(t *testing.T) {
	rows, total := topView(parseText(t, topBefore), parseText(t, topAfter), 2*time.Second)
	want := []topRow{
		{session: "6", rank: "0", samplesPerSec: 200, mbPerSec: 20, wait: 0.5, busiest: "fetch"},
		{session: "7", rank: "1", samplesPerSec: 1000, mbPerSec: 100, wait: 0.25, busiest: "decode", settings: shardload.Settings{Workers: 8, ReadAhead: 16}, memory: 4e8, budget: 1e9},
		// Waiting for the trainer's slabs 80% of the time: the trainer is the limit.
		{session: "8", rank: "2", samplesPerSec: 50, mbPerSec: 5, wait: 0, backpressure: 0.8, busiest: "trainer"},
	}
	if len(rows) != len(want) {
		t.Fatalf("rows %+v", rows)
	}
	for i := range want {
		if rows[i] != want[i] {
			t.Errorf("row %d: %+v, want %+v", i, rows[i], want[i])
		}
	}
	if total.samplesPerSec != 2000 || total.mbPerSec != 200 {
		t.Errorf("total %+v", total)
	}
	var b bytes.Buffer
	writeTop(&b, rows, total)
	if !strings.Contains(b.String(), "50.0%") || !strings.Contains(b.String(), "decode") || !strings.Contains(b.String(), "8 (+16 ahead)") ||
		!strings.Contains(b.String(), "400/1000") || !strings.Contains(b.String(), "80.0%") || !strings.Contains(b.String(), "trainer") || strings.Count(b.String(), "\n") != 5 {
		t.Errorf("view:\n%s", b.String())
	}
}

// TestBenchMetrics: bench --metrics serves the running loader's counters as session 0,
// and shardload top reads them.
func TestBenchMetrics(t *testing.T) {
	dir := t.TempDir()
	if code, _, stderr := runCLI(t, "gen", "--shards", "2", "--samples", "40", dir); code != 0 {
		t.Fatalf("gen: %s", stderr)
	}
	pr, pw := io.Pipe()
	done := make(chan int, 1)
	go func() {
		code := run(context.Background(), []string{"bench", "--metrics", "127.0.0.1:0", "--step-time", "30ms", "--batch-size", "4",
			"--no-index-store", "--field", "jpg", dir + "/train-{000000..000001}.tar"}, io.Discard, pw)
		pw.Close()
		done <- code
	}()
	sc := bufio.NewScanner(pr)
	var url string
	for sc.Scan() {
		if _, after, ok := strings.Cut(sc.Text(), "metrics on "); ok {
			url = after
			break
		}
	}
	go io.Copy(io.Discard, pr)
	if url == "" {
		t.Fatal("bench printed no metrics address")
	}
	fams, _, err := scrapeMetrics(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	if n := counter(fams, "shardload_sessions"); n != 1 {
		t.Errorf("sessions %v, want 1 (the bench loader)", n)
	}
	if _, ok := fams["shardload_session_batches_total"]; !ok {
		t.Error("no shardload_session_batches_total")
	}
	if code := <-done; code != 0 {
		t.Fatalf("bench exited %d", code)
	}
}
