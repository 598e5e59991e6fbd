package shardload_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/shardload/shardload"
	"github.com/shardload/shardload/decode"
)

// Slabs are sized from the batch: exact for fixed-size fields, from the shards' mean
// sample size for ragged ones; a batch larger than its slab grows it (once, logged)
// instead of failing, and the epoch delivers every sample; a batch whose fixed-size
// fields cannot fit the memory budget is refused at Open, with the size it needs.
func TestSlabsFitTheBatch(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	var paths []string
	for i := range 3 {
		var members [][2]string
		for j := range 40 {
			key := fmt.Sprintf("g%d-%03d", i, j)
			bin := strings.Repeat("b", 1000)
			if i == 1 && j == 7 {
				bin = strings.Repeat("B", 5<<20) // one sample far above the mean
			}
			members = append(members, [2]string{key + ".bin", bin}, [2]string{key + ".cls", fmt.Sprint(j)})
		}
		paths = append(paths, writeTar(t, filepath.Join(dir, fmt.Sprintf("g-%d.tar", i)), members...))
	}
	fields := []decode.Field{mustField(t, "bin"), mustField(t, "cls")}
	infos, err := shardload.Count(ctx, shardload.Config{URLs: paths, NoIndexStore: true})
	if err != nil {
		t.Fatal(err)
	}
	var logs []string
	cfg := shardload.Config{Shards: infos, Fields: fields, BatchSize: 16, NoLock: true, Logf: func(f string, a ...any) { logs = append(logs, fmt.Sprintf(f, a...)) }}
	size := shardload.SlabSize(cfg, infos, fields)
	if size > 4<<20 {
		t.Errorf("slab sized %d for batches of 16 samples of about 1 KB (and one of 5 MiB)", size)
	}
	l, err := shardload.Open(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for b, err := range l.All(ctx) {
		if err != nil {
			t.Fatal(err)
		}
		n += b.Rows
	}
	st := l.Stats()
	l.Close()
	if n != 120 || st.SlabBytes < 5<<20 {
		t.Errorf("%d samples, largest slab %d; want 120 and a slab grown past 5 MiB", n, st.SlabBytes)
	}
	grew := 0
	for _, line := range logs {
		if strings.Contains(line, "did not fit the slabs") {
			grew++
		}
	}
	if grew != 1 {
		t.Errorf("%d log lines about growing slabs; want 1: %q", grew, logs)
	}

	// Images: the slab is exactly what a batch takes.
	img := []decode.Field{mustField(t, "img=bin:image:uint8:3x224x224"), mustField(t, "cls")}
	c := shardload.Config{Shards: infos, Fields: img, BatchSize: 256}
	if got, least := shardload.SlabSize(c, infos, img), int64(256*3*224*224); got < least || got > least+4<<20 {
		t.Errorf("slab for 256 images of 3x224x224: %d bytes, want %d and a little", got, least)
	}
	// One that cannot fit the budget is refused before any batch, naming the size.
	c.Memory, c.ShuffleBytes = 64<<20, 4<<20
	if _, err := shardload.Open(ctx, c); !errors.Is(err, shardload.ErrMemory) || !strings.Contains(err.Error(), "batch of 256") {
		t.Errorf("a batch of 256 images in a 64 MiB budget: %v; want ErrMemory naming the batch", err)
	}
}

// A loader given a *slog.Logger logs through it alone: nothing reaches the log
// package's output.
func TestLoggerGetsEverything(t *testing.T) {
	dir := t.TempDir()
	var members [][2]string
	for j := range 30 {
		bin := strings.Repeat("b", 100)
		if j == 20 {
			bin = strings.Repeat("B", 3<<20) // a slab grows: one line
		}
		members = append(members, [2]string{fmt.Sprintf("k%02d.bin", j), bin})
	}
	p := writeTar(t, filepath.Join(dir, "a.tar"), members...)
	var std bytes.Buffer
	log.SetOutput(&std)
	defer log.SetOutput(os.Stderr)
	var got bytes.Buffer
	logger := slog.New(slog.NewTextHandler(&got, nil))
	ctx := context.Background()
	l, err := shardload.Open(ctx, shardload.Config{URLs: []string{p}, NoIndexStore: true, Logger: logger, NoLock: true, BatchSize: 8})
	if err != nil {
		t.Fatal(err)
	}
	if err := runToError(ctx, l); err != nil {
		t.Fatal(err)
	}
	l.Close()
	if std.Len() > 0 || !strings.Contains(got.String(), "estimated") || !strings.Contains(got.String(), "did not fit the slabs") {
		t.Errorf("the logger got:\n%s\nthe log package got:\n%s", got.String(), std.String())
	}
}

// A warning said once per process is said once to each logger: a second loader with
// a logger of its own hears it too, the same logger does not hear it twice.
func TestWarningsOncePerLogger(t *testing.T) {
	dir := t.TempDir()
	p := writeTar(t, filepath.Join(dir, "a.tar"), [2]string{"k0.bin", "x"}, [2]string{"k1.bin", "y"})
	notDir := filepath.Join(dir, "not-a-dir")
	if err := os.WriteFile(notDir, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	run := func(logger *slog.Logger) {
		t.Helper()
		ctx := context.Background()
		l, err := shardload.Open(ctx, shardload.Config{URLs: []string{p}, IndexDir: filepath.Join(notDir, "index"), Logger: logger, NoLock: true})
		if err != nil {
			t.Fatal(err)
		}
		if err := runToError(ctx, l); err != nil {
			t.Fatal(err)
		}
		l.Close()
	}
	var a, b bytes.Buffer
	la, lb := slog.New(slog.NewTextHandler(&a, nil)), slog.New(slog.NewTextHandler(&b, nil))
	run(la)
	run(la)
	run(lb)
	const warning = "shards are counted on every run"
	if n := strings.Count(a.String(), warning); n != 1 {
		t.Errorf("the first logger heard the store's warning %d times, want once:\n%s", n, a.String())
	}
	if n := strings.Count(b.String(), warning); n != 1 {
		t.Errorf("the second logger heard the store's warning %d times, want once:\n%s", n, b.String())
	}
}
