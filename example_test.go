package shardload_test

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"strings"

	"github.com/shardload/shardload"
	"github.com/shardload/shardload/decode"
	"github.com/shardload/shardload/plan"
	"github.com/shardload/shardload/source"
)

// Read the real WebDataset shard in testdata/ in batches of 4: ten samples, each a
// "txt" and a "bin" member.
func ExampleOpen() {
	ctx := context.Background()
	txt, _ := decode.ParseField("txt:text")
	l, err := shardload.Open(ctx, shardload.Config{
		URLs:      []string{"testdata/pytorch-data__wds.tar"},
		Fields:    []decode.Field{txt},
		BatchSize: 4,
		NoShuffle: true,
	})
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close()
	for b, err := range l.All(ctx) {
		if err != nil {
			log.Fatal(err)
		}
		col, _ := b.Column("txt")
		fmt.Println(b.Seq, b.Keys(), string(col.Row(b.Data(), 0)))
	}
	// Output:
	// 0 [data/0 data/1 data/2 data/3] text0
	// 1 [data/4 data/5 data/6 data/7] text4
	// 2 [data/8 data/9] text8
}

// memSource serves shards from memory under a scheme of its own: a stand-in for any
// storage a user reaches with their own code.
type memSource map[string][]byte

func (m memSource) Stat(_ context.Context, url string) (source.Info, error) {
	data, ok := m[url]
	if !ok {
		return source.Info{}, &source.Error{Op: "stat", URL: url, Err: source.ErrNotFound}
	}
	return source.Info{URL: url, Size: int64(len(data))}, nil
}

func (m memSource) Open(ctx context.Context, url string) (io.ReadCloser, error) {
	if _, err := m.Stat(ctx, url); err != nil {
		return nil, err
	}
	return io.NopCloser(bytes.NewReader(m[url])), nil
}

// A Source from the user's own package, plugged in through Config.Sources.
func ExampleConfig_sources() {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for i := 0; i < 6; i++ {
		for _, m := range []struct{ ext, data string }{{"cls", fmt.Sprint(i % 3)}, {"txt", strings.Repeat("x", i)}} {
			tw.WriteHeader(&tar.Header{Name: fmt.Sprintf("k%d.%s", i, m.ext), Mode: 0o644, Size: int64(len(m.data))})
			tw.Write([]byte(m.data))
		}
	}
	tw.Close()

	reg := &source.Registry{}
	reg.Register("mem", memSource{"mem://shards/0.tar": buf.Bytes()})
	ctx := context.Background()
	l, err := shardload.Open(ctx, shardload.Config{
		URLs:      []string{"mem://shards/0.tar"},
		Sources:   reg,
		BatchSize: 3,
		Seed:      1,
	})
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close()
	for b, err := range l.All(ctx) {
		if err != nil {
			log.Fatal(err)
		}
		labels, _ := b.Column("cls") // fields inferred: cls as int, txt as text
		fmt.Println(b.Rows, len(labels.Int64s(b.Data())), labels.Kind)
	}
	// Output:
	// 3 3 int
	// 3 3 int
}

// Checkpoint a loader's position after two batches and resume there in a new loader,
// as a restarted trainer does: it yields the batches the first would have yielded
// next, reading none of those consumed. The state is small JSON, kept with the
// model's checkpoint.
func ExampleLoader_State() {
	ctx := context.Background()
	txt, _ := decode.ParseField("txt:text")
	cfg := shardload.Config{
		URLs:      []string{"testdata/pytorch-data__wds.tar"},
		Fields:    []decode.Field{txt},
		BatchSize: 3,
		Seed:      7,
	}
	l, err := shardload.Open(ctx, cfg)
	if err != nil {
		log.Fatal(err)
	}
	for range 2 {
		b, err := l.Next(ctx)
		if err != nil {
			log.Fatal(err)
		}
		b.Release()
	}
	saved, _ := json.Marshal(l.State()) // with the model's checkpoint
	l.Close()

	// The restarted process.
	var st shardload.State
	if err := json.Unmarshal(saved, &st); err != nil {
		log.Fatal(err)
	}
	cfg.Resume = &st
	l, err = shardload.Open(ctx, cfg)
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close()
	fmt.Println("runs", st.Runs, "batches", st.Batches)
	for b, err := range l.All(ctx) {
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(b.Seq, b.Rows)
	}
	// Output:
	// runs 1x6 batches 2
	// 2 3
	// 3 1
}

// One tuner for every epoch of a job: each epoch's loader starts from the settings
// the last one's tuner left, within the memory budget. Queue depth is given, so the
// tuner leaves it alone.
func ExampleTuner() {
	ctx := context.Background()
	tuner := shardload.NewTuner()
	for epoch := range 2 {
		l, err := shardload.Open(ctx, shardload.Config{
			URLs:       []string{"testdata/pytorch-data__wds.tar"},
			BatchSize:  4,
			Epoch:      epoch,
			Memory:     256 << 20, // slabs, samples and fetch parts together
			QueueBytes: 1 << 20,   // pinned: not tuned
			Tuner:      tuner,
		})
		if err != nil {
			log.Fatal(err)
		}
		for _, err := range l.All(ctx) {
			if err != nil {
				log.Fatal(err)
			}
		}
		st := l.Stats()
		l.Close()
		fmt.Println("epoch", epoch, "within budget:", st.Memory <= 256<<20, "queue bytes:", tuner.Settings().QueueBytes)
	}
	// Output:
	// epoch 0 within budget: true queue bytes: 1048576
	// epoch 1 within budget: true queue bytes: 1048576
}

// A sample that cannot be decoded fails the loader (the default policy) with a
// *SampleError saying which shard, sample, byte and field.
func ExampleSampleError() {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for i, label := range []string{"1", "2", "three", "4"} {
		tw.WriteHeader(&tar.Header{Name: fmt.Sprintf("k%d.cls", i), Mode: 0o644, Size: int64(len(label))})
		tw.Write([]byte(label))
	}
	tw.Close()
	reg := &source.Registry{}
	reg.Register("mem", memSource{"mem://shards/labels.tar": buf.Bytes()})
	label, _ := decode.ParseField("cls:int")
	ctx := context.Background()
	l, err := shardload.Open(ctx, shardload.Config{URLs: []string{"mem://shards/labels.tar"}, Sources: reg,
		Fields: []decode.Field{label}, BatchSize: 2, NoShuffle: true})
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close()
	for _, err := range l.All(ctx) {
		var se *shardload.SampleError
		if errors.As(err, &se) {
			fmt.Printf("%s: sample %s at byte %d, field %s\n", se.URL, se.Key, se.Offset, se.Field)
		}
	}
	// Output:
	// mem://shards/labels.tar: sample k2 at byte 2048, field cls
}

// Mix two streams into each epoch at 3:1, in epochs of 8 samples and stratified batches
// of 4 (every batch 3 + 1 rows). Here both streams are the real WebDataset shard in
// testdata/ (ten samples); each stream goes through its samples without replacement
// across epochs.
func ExampleConfig_streams() {
	ctx := context.Background()
	cfg := shardload.Config{
		Streams: []shardload.Stream{
			{URLs: []string{"testdata/pytorch-data__wds.tar"}, Weight: 3},
			{URLs: []string{"testdata/pytorch-data__wds.tar"}, Weight: 1},
		},
		EpochSamples: 8,
		Batching:     plan.Stratified,
		BatchSize:    4,
		NoIndexStore: true,
	}
	for epoch := range 2 {
		cfg.Epoch = epoch
		l, err := shardload.Open(ctx, cfg)
		if err != nil {
			log.Fatal(err)
		}
		for b, err := range l.All(ctx) {
			if err != nil {
				log.Fatal(err)
			}
			fmt.Println(epoch, b.Seq, len(b.Keys()))
		}
		st := l.Stats().Streams
		fmt.Println("streams:", st[0].Samples, st[1].Samples)
		l.Close()
	}
	// Output:
	// 0 0 4
	// 0 1 4
	// streams: 6 2
	// 1 0 4
	// 1 1 4
	// streams: 6 2
}

// Learn an epoch's reads before the loader makes any: Config.Planned is called with
// the epoch's plan before the first shard is opened. With a node cache that evicts
// by next use, announce them there, as bench and serve do:
//
//	hints := serve.NewEpochHints("my trainer", log.Printf)
//	cfg.Planned = func(p plan.Plan) { hints.OpenPlan(p, cfg.Sources) }
func ExampleConfig_planned() {
	ctx := context.Background()
	txt, _ := decode.ParseField("txt:text")
	cfg := shardload.Config{
		URLs:      []string{"testdata/pytorch-data__wds.tar"},
		Fields:    []decode.Field{txt},
		BatchSize: 4,
		NoShuffle: true,
	}
	cfg.Planned = func(p plan.Plan) {
		fmt.Println("planned:", p.Batches, "batches of", p.Samples, "samples from", len(p.Spans), "span")
	}
	l, err := shardload.Open(ctx, cfg)
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close()
	n := 0
	for _, err := range l.All(ctx) {
		if err != nil {
			log.Fatal(err)
		}
		n++
	}
	fmt.Println("read:", n, "batches")
	// Output:
	// planned: 3 batches of 10 samples from 1 span
	// read: 3 batches
}
