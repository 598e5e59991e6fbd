package shardload_test

import (
	"context"
	"fmt"
	"io"
	"os"
	"testing"

	"github.com/shardload/shardload"
	"github.com/shardload/shardload/decode"
	"github.com/shardload/shardload/internal/shardgen"
	"github.com/shardload/shardload/shard"
)

// slabReadsDataset writes shards with a field of every kind that is read straight
// into slab rows (raw, text, json) and of every other (int, fixed npy, ragged npy, and
// a second raw field of an extension already placed), counted with their members'
// sizes. With bad set, some samples' json members are broken in place (the same
// sizes, so that the counts and offsets stand): the Skip policy leaves them out and
// their batches are padded.
func slabReadsDataset(t *testing.T, bad bool) ([]shard.Info, []decode.Field) {
	t.Helper()
	spec := shardgen.Spec{Shards: 6, Samples: []int{40, 57, 23, 64, 31, 48}, Seed: 7, Fields: []shardgen.Field{
		{Ext: "bin", Kind: shardgen.Random, MinBytes: 1, MaxBytes: 6000},
		{Ext: "cls", Kind: shardgen.Class},
		{Ext: "js", Kind: shardgen.JSON, MinBytes: 20, MaxBytes: 300},
		{Ext: "npy", Kind: shardgen.Tokens, Tokens: 12},
		{Ext: "txt", Kind: shardgen.Text, MinBytes: 0, MaxBytes: 500},
	}}
	paths, err := shardgen.Generate(t.TempDir(), spec)
	if err != nil {
		t.Fatal(err)
	}
	if bad {
		for i, p := range paths {
			breakJSON(t, p, i%3, 9)
		}
	}
	infos, err := shardload.Count(context.Background(), shardload.Config{URLs: paths, IndexDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	for _, in := range infos {
		if in.Members == nil {
			t.Fatalf("%s: counted without its members' sizes", in.URL)
		}
	}
	var fields []decode.Field
	for _, s := range []string{"bin", "label=cls", "js:json", "tokens=npy:npy:int32:12", "ragged=npy:npy:int32", "txt:text", "again=bin"} {
		fields = append(fields, mustField(t, s))
	}
	return infos, fields
}

// breakJSON overwrites the first byte of the json member of samples from, from+every, ...
func breakJSON(t *testing.T, path string, from, every int) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	r := shard.NewReader(f, shard.Options{URL: path})
	var offs []int64
	for i := 0; ; i++ {
		s, err := r.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		for _, fl := range s.Fields {
			if fl.Ext == "js" && i >= from && (i-from)%every == 0 {
				offs = append(offs, fl.Offset)
			}
		}
	}
	for _, off := range offs {
		if _, err := f.WriteAt([]byte("x"), off); err != nil {
			t.Fatal(err)
		}
	}
}

// slabEpoch runs one epoch of cfg and returns each batch's slab bytes (as far as the
// batch uses them), its padding, and the loader's stats.
func slabEpoch(t *testing.T, cfg shardload.Config) ([]string, shardload.Stats) {
	t.Helper()
	out, _, st := ringEpoch(t, cfg, false)
	return out, st
}

// Members read straight into their slab rows give batches byte for byte those of the
// copying path: every field kind (placed or not), ragged and fixed columns, rows
// padded where samples were left out, several ranks and batch sizes, two slabs (the
// reads ahead wait for free ones) or eight.
func TestSlabReadsAreTheCopyingPathsBytes(t *testing.T) {
	var placed int64 // how many are read in place depends on the timing; some are
	defer func() {
		if placed == 0 && !t.Failed() {
			t.Fatal("no member was read straight into its slab row")
		}
	}()
	for _, bad := range []bool{false, true} {
		infos, fields := slabReadsDataset(t, bad)
		for _, c := range []struct{ world, batch, slabs int }{{1, 16, 8}, {2, 7, 2}, {3, 32, 4}, {1, 1, 3}} {
			for rank := range c.world {
				name := fmt.Sprintf("bad=%v world=%d rank=%d batch=%d slabs=%d", bad, c.world, rank, c.batch, c.slabs)
				cfg := shardload.Config{Shards: infos, Fields: fields, Rank: rank, World: c.world, BatchSize: c.batch, Seed: 3,
					Slabs: c.slabs, ShuffleBuffer: 64, QueueBytes: 16 << 10, NoIndexStore: true, Logf: func(string, ...any) {}}
				if bad {
					cfg.OnError = shardload.Skip
					cfg.ErrorBudget = &shardload.Budget{Fraction: 0.5}
				}
				want, ws := slabEpoch(t, cfg)
				cfg.SlabReads = true
				got, gs := slabEpoch(t, cfg)
				if ws.BytesPlaced != 0 {
					t.Fatalf("%s: %d bytes placed without SlabReads", name, ws.BytesPlaced)
				}
				placed += gs.BytesPlaced
				if len(got) != len(want) {
					t.Fatalf("%s: %d batches, the copying path %d", name, len(got), len(want))
				}
				for i := range want {
					if got[i] != want[i] {
						t.Fatalf("%s: batch %d differs from the copying path's:\n%.300s\n%.300s", name, i, got[i], want[i])
					}
				}
				if bad && ws.Padded == 0 {
					t.Fatalf("%s: no row was padded", name)
				}
				t.Logf("%s: %d batches, %d of %d bytes out placed, %d batches not as planned", name, len(got), gs.BytesPlaced, gs.BytesOut, gs.Replaced)
			}
		}
	}
}
