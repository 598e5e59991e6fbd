package main

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"time"

	"github.com/shardload/shardload"
	"github.com/shardload/shardload/pack"
	"github.com/shardload/shardload/packed"
	"github.com/shardload/shardload/plan"
	"github.com/shardload/shardload/serve"
)

// packReport is what bench --pack reports of a packed token stream.
type packReport struct {
	Pack              string  `json:"pack"`
	Epochs            int     `json:"epochs"`
	Batches           int64   `json:"batches"`
	Rows              int64   `json:"rows"`
	PadRows           int64   `json:"pad_rows"`
	EpochTokens       int64   `json:"epoch_tokens"`
	TokensPerSecond   float64 `json:"tokens_per_second"`
	PlanSeconds       float64 `json:"plan_seconds"`
	FirstBatchSeconds float64 `json:"first_batch_seconds"`
	// CountSeconds is the epochs' Opens' time finding the documents (the index, an
	// .idx), and Seconds the run's time without it, as an unpacked report's seconds
	// leave out its count_seconds: the same work on both sides.
	CountSeconds float64 `json:"count_seconds"`
	Seconds      float64 `json:"seconds"`
	StateBytes   int     `json:"state_bytes"`
	// Hints is what the epochs announced to the node's cache (--cache-policy order).
	Hints *hintReport `json:"hints,omitempty"`
}

// runPackedBench runs epochs (or batches) of the packed stream spec over cfg's
// shards or Megatron datasets through the loader (Config.Pack: the rows written in
// its slabs, each batch released as a trainer that is done with it does, after step
// when above 0) and reports tokens per second.
func runPackedBench(ctx context.Context, cfg shardload.Config, spec string, epochs, batches int, step time.Duration, asJSON bool, stdout io.Writer) error {
	s, err := pack.ParseSpec(spec)
	if err != nil {
		return fmt.Errorf("%w: --pack: %v", errUsage, err)
	}
	rep := packReport{Pack: s.String(), Epochs: epochs}
	cfg.Pack = spec
	cfg.BatchSize = cmp.Or(cfg.BatchSize, packed.DefaultBatchSize)
	first := cfg.Epoch
	start := time.Now()
	// The epochs' reads (the objects, in the order of their first reads), announced
	// to the node's cache before each epoch's first read, as the unpacked bench does.
	hints := serve.NewEpochHints(fmt.Sprintf("bench rank %d", cfg.Rank), cfg.Logf)
	defer hints.Close()
	for e := range epochs {
		t0 := time.Now()
		cfg.Epoch = first + e
		cfg.Planned = func(p plan.Plan) { hints.OpenPlan(p, cfg.Sources) }
		l, err := shardload.Open(ctx, cfg)
		if err != nil {
			return err
		}
		rep.CountSeconds += l.Stats().Stages["find"].Seconds()
		if e == 0 {
			rep.PlanSeconds = time.Since(t0).Seconds()
			rep.EpochTokens = l.Order().Tokens
		}
		for taken := 1; ; taken++ {
			b, err := l.Next(ctx)
			if err == io.EOF {
				break
			}
			if err != nil {
				l.Close()
				return err
			}
			if rep.Batches == 0 {
				rep.FirstBatchSeconds = time.Since(start).Seconds()
			}
			rep.Batches++
			rep.Rows += int64(b.Rows)
			rep.PadRows += int64(b.Padded)
			if step > 0 {
				time.Sleep(step) // the simulated trainer computing on the batch
			}
			b.Release()
			hints.Batch(taken)
			if batches > 0 && rep.Batches >= int64(batches) {
				break
			}
		}
		st, _ := json.Marshal(l.State())
		rep.StateBytes = len(st)
		l.Close()
		if batches > 0 && rep.Batches >= int64(batches) {
			break
		}
	}
	rep.Seconds = time.Since(start).Seconds() - rep.CountSeconds
	hints.Close()
	var hr benchResult
	hr.addHints(hints.Stats())
	rep.Hints = hr.Hints
	if rep.Seconds > 0 {
		rep.TokensPerSecond = float64((rep.Rows-rep.PadRows)*int64(s.SeqLen)) / rep.Seconds
	}
	if asJSON {
		return json.NewEncoder(stdout).Encode(rep)
	}
	fmt.Fprintf(stdout, "packed %s: %d batches (%d rows, %d of pad) in %.2fs (and %.2fs finding the documents): %.0f tokens/s; plan %.3fs for %d tokens, first batch %.3fs, state %d bytes\n",
		rep.Pack, rep.Batches, rep.Rows, rep.PadRows, rep.Seconds, rep.CountSeconds, rep.TokensPerSecond, rep.PlanSeconds, rep.EpochTokens, rep.FirstBatchSeconds, rep.StateBytes)
	return nil
}
