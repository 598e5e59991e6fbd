package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/spf13/pflag"

	"github.com/shardload/shardload"
)

var topCommand = command{
	name:  "top",
	short: "live view of a running serve: per session samples/s, MB/s, wait, busiest stage, tuned workers, memory, cache hit rate",
	args:  "ADDR",
	summary: `Show what a running "shardload serve --metrics ADDR" is doing, from its metrics: one
line per trainer session (its rank) with samples/s, MB/s read from the sources, the
share of the interval its trainer waited for batches that were not ready (starved:
the loader is behind, the figure that matters), the share its loader waited for slabs
the trainer held (backpressure: the loader is ahead), what limits the rate (the
trainer, when the loader is ahead; else the loader's busiest stage), the workers
(and shards read ahead) its tuner has it at, the memory its settings take
against its --memory budget, and, with a cache, its hit rate (the share of the bytes
the cache served that the store did not send for them) and the MB/s the store sent,
then the server's totals. ADDR is
the --metrics address (host:port) or the metrics URL. Every --every it prints anew;
--once prints one view and exits.`,
	setup: func(fs *pflag.FlagSet) func(context.Context, []string, io.Writer, io.Writer) error {
		every := fs.Duration("every", 2*time.Second, "interval between views (the rates are over it)")
		once := fs.Bool("once", false, "print one view (after one interval) and exit")
		return func(ctx context.Context, args []string, stdout, _ io.Writer) error {
			if len(args) != 1 {
				return fmt.Errorf("%w: give the server's --metrics address", errUsage)
			}
			if *every <= 0 {
				return fmt.Errorf("%w: --every %v: want more than 0", errUsage, *every)
			}
			url := args[0]
			if !strings.Contains(url, "://") {
				url = "http://" + url + "/metrics"
			}
			prev, t0, err := scrapeMetrics(ctx, url)
			if err != nil {
				return err
			}
			tick := time.NewTicker(*every)
			defer tick.Stop()
			for {
				select {
				case <-ctx.Done():
					return nil
				case <-tick.C:
				}
				cur, t1, err := scrapeMetrics(ctx, url)
				if err != nil {
					return err
				}
				rows, total := topView(prev, cur, t1.Sub(t0))
				writeTop(stdout, rows, total)
				if *once {
					return nil
				}
				prev, t0 = cur, t1
			}
		}
	},
}

// scrapeMetrics reads url's Prometheus text.
func scrapeMetrics(ctx context.Context, url string) (map[string]*dto.MetricFamily, time.Time, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, time.Time{}, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, time.Time{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, time.Time{}, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("%s: %w", url, err)
	}
	return fams, time.Now(), nil
}

// topRow is one session's rates over an interval.
type topRow struct {
	session, rank string
	samplesPerSec float64
	mbPerSec      float64
	wait          float64            // share of the interval the trainer was starved
	backpressure  float64            // share of the interval the loader waited for the trainer's slabs
	busiest       string             // what limits the rate: "trainer", or the loader's stage with the most seconds
	settings      shardload.Settings // in effect (zero: not reported)
	memory        float64            // bytes the settings in effect may hold, and the budget
	budget        float64
	// The cache over the interval: the share of the bytes it served that the store
	// did not send for them (hit), and the MB/s it read from the store for them;
	// cached is false when nothing went through a cache.
	hit, storeMBPerSec float64
	cached             bool
}

// cacheRates sets r's cache figures from the deltas of family name (its label
// "from": store, memory, disk, joined) over sec seconds, labels selecting the
// series.
func (r *topRow) cacheRates(delta func(string, ...string) float64, sec float64, name string, labels ...string) {
	var store, total float64
	for _, from := range []string{"store", "memory", "disk", "joined"} {
		d := delta(name, append(labels, "from", from)...)
		total += d
		if from == "store" {
			store = d
		}
	}
	if total <= 0 {
		return
	}
	r.cached, r.hit, r.storeMBPerSec = true, 1-store/total, store/1e6/sec
}

// topView returns the sessions' rates between two scrapes dt apart (sessions in cur;
// one that started in between counts from zero), sorted by rank, and the totals.
func topView(prev, cur map[string]*dto.MetricFamily, dt time.Duration) (rows []topRow, total topRow) {
	sec := dt.Seconds()
	if sec <= 0 {
		sec = 1
	}
	delta := func(name string, labels ...string) float64 {
		return counter(cur, name, labels...) - counter(prev, name, labels...)
	}
	for _, m := range family(cur, "shardload_session_samples_total") {
		id, rank := label(m, "session"), label(m, "rank")
		r := topRow{session: id, rank: rank}
		r.samplesPerSec = delta("shardload_session_samples_total", "session", id) / sec
		r.mbPerSec = delta("shardload_session_read_bytes_total", "session", id) / 1e6 / sec
		r.wait = delta("shardload_session_wait_seconds_total", "session", id) / sec
		r.backpressure = delta("shardload_session_backpressure_seconds_total", "session", id) / sec
		r.busiest = busiest(cur, delta, id, r)
		r.settings.Workers = int(counter(cur, "shardload_session_setting", "session", id, "setting", "workers"))
		r.settings.ReadAhead = int(counter(cur, "shardload_session_setting", "session", id, "setting", "read_ahead"))
		r.memory = counter(cur, "shardload_session_memory_bytes", "session", id)
		r.budget = counter(cur, "shardload_session_memory_budget_bytes", "session", id)
		r.cacheRates(delta, sec, "shardload_session_cache_bytes_total", "session", id)
		rows = append(rows, r)
	}
	sort.Slice(rows, func(i, j int) bool {
		if rows[i].rank != rows[j].rank {
			return rows[i].rank < rows[j].rank
		}
		return rows[i].session < rows[j].session
	})
	total = topRow{session: "all", rank: "-", busiest: "-",
		samplesPerSec: delta("shardload_samples_total") / sec,
		mbPerSec:      delta("shardload_read_bytes_total") / 1e6 / sec}
	total.cacheRates(delta, sec, "shardload_cache_served_bytes_total")
	if total.cached {
		// What the node's cache read from the store, background fetches included.
		total.storeMBPerSec = (delta("shardload_cache_store_bytes_total", "how", "fetch") + delta("shardload_cache_store_bytes_total", "how", "bypass")) / 1e6 / sec
	}
	return rows, total
}

// busiest names what limits a session's rate in the interval: its trainer, when
// the loader waited for the trainer's slabs more than half of it and more than the
// trainer waited for batches; else the loader's stage with the most seconds (the
// mixer's starve, its wait for the workers, not counted: a stage of theirs is).
func busiest(cur map[string]*dto.MetricFamily, delta func(string, ...string) float64, id string, r topRow) string {
	if r.backpressure > 0.5 && r.backpressure > r.wait {
		return "trainer"
	}
	most, name := 0.0, "-"
	for _, sm := range family(cur, "shardload_session_stage_seconds_total") {
		if label(sm, "session") != id {
			continue
		}
		st := label(sm, "stage")
		if st == "starve" {
			continue
		}
		if d := delta("shardload_session_stage_seconds_total", "session", id, "stage", st); d > most {
			most, name = d, st
		}
	}
	return name
}

func writeTop(w io.Writer, rows []topRow, total topRow) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "session\trank\tsamples/s\tMB/s\tstarved\tbackpressure\tlimit\tworkers\tmemory MB\tcache hit\tstore MB/s\t\n")
	for _, r := range append(rows, total) {
		wait, bp, workers, memory := fmt.Sprintf("%.1f%%", 100*r.wait), fmt.Sprintf("%.1f%%", 100*r.backpressure), "-", "-"
		hit, store := "-", "-"
		if r.cached {
			hit, store = fmt.Sprintf("%.1f%%", 100*r.hit), fmt.Sprintf("%.1f", r.storeMBPerSec)
		}
		if r.session == "all" {
			wait, bp = "-", "-"
		}
		if r.settings.Workers > 0 {
			workers = fmt.Sprint(r.settings.Workers)
			if r.settings.ReadAhead > 0 {
				workers += fmt.Sprintf(" (+%d ahead)", r.settings.ReadAhead)
			}
		}
		if r.budget > 0 {
			memory = fmt.Sprintf("%.0f/%.0f", r.memory/1e6, r.budget/1e6)
		}
		fmt.Fprintf(tw, "%s\t%s\t%.1f\t%.1f\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", r.session, r.rank, r.samplesPerSec, r.mbPerSec, wait, bp, r.busiest, workers, memory, hit, store)
	}
	tw.Flush()
}

func family(fams map[string]*dto.MetricFamily, name string) []*dto.Metric {
	if f := fams[name]; f != nil {
		return f.Metric
	}
	return nil
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.Label {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// counter returns the value of the first metric of family name whose labels include
// the pairs given; 0 when there is none.
func counter(fams map[string]*dto.MetricFamily, name string, labels ...string) float64 {
	for _, m := range family(fams, name) {
		ok := true
		for i := 0; i+1 < len(labels); i += 2 {
			ok = ok && label(m, labels[i]) == labels[i+1]
		}
		if !ok {
			continue
		}
		switch {
		case m.Counter != nil:
			return m.Counter.GetValue()
		case m.Gauge != nil:
			return m.Gauge.GetValue()
		}
	}
	return 0
}
