package shardload_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"testing"

	"github.com/shardload/shardload"
	"github.com/shardload/shardload/pinned"
)

// ringEpoch runs one epoch of cfg and returns each batch's slab bytes (as far as the
// batch uses them) and padding, the slabs that carried them, and the loader's stats.
// With hold, the first batch is not released before the loader closes (its memory is
// not touched afterwards).
func ringEpoch(t *testing.T, cfg shardload.Config, hold bool) ([]string, map[*pinned.Slab]bool, shardload.Stats) {
	t.Helper()
	ctx := context.Background()
	l, err := shardload.Open(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	var out []string
	slabs := map[*pinned.Slab]bool{}
	for {
		b, err := l.Next(ctx)
		if err == io.EOF {
			return out, slabs, l.Stats()
		}
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, fmt.Sprintf("seq %d rows %d padded %d used %d %x", b.Seq, b.Rows, b.Padded, b.Used, bytes.Clone(b.Data()[:b.Used])))
		slabs[b.Slab()] = true
		if hold && len(out) == 1 {
			continue
		}
		b.Release()
	}
}

// A loader that made its own ring leaves it, when it closes with every batch released,
// for the next loader of the process with the same slab settings (the next epoch's):
// that loader's batches are carried by the same slabs, still holding the last epoch's
// bytes, and are byte for byte those a new ring carries, rows padded where samples
// were left out included. A loader with other slab settings gets a ring of its own,
// and one that closes while a batch is still held does not hand its slabs on.
func TestRingLeftForTheNextEpoch(t *testing.T) {
	infos, fields := slabReadsDataset(t, true)
	cfg := shardload.Config{Shards: infos, Fields: fields, BatchSize: 7, Seed: 3, Slabs: 3,
		ShuffleBuffer: 64, QueueBytes: 16 << 10, NoIndexStore: true, OnError: shardload.Skip,
		ErrorBudget: &shardload.Budget{Fraction: 0.5}, Logf: func(string, ...any) {}}
	other := cfg
	other.Slabs = 5
	next := cfg
	next.Epoch = 1
	common := func(a, b map[*pinned.Slab]bool) int {
		n := 0
		for s := range b {
			if a[s] {
				n++
			}
		}
		return n
	}

	ringEpoch(t, other, false) // whatever an earlier test left is not this ring's
	_, first, _ := ringEpoch(t, cfg, false)
	got, second, _ := ringEpoch(t, next, false)
	if len(second) == 0 || common(first, second) != len(second) {
		t.Fatalf("epoch 1 was carried by %d slabs, %d of them epoch 0's: the ring was not left for it", len(second), common(first, second))
	}
	_, others, _ := ringEpoch(t, other, false)
	if n := common(second, others); n != 0 {
		t.Fatalf("a loader with 5 slabs got %d of the 3-slab ring's", n)
	}
	want, fresh, _ := ringEpoch(t, next, true) // after the 5-slab loader: a new ring
	if n := common(second, fresh) + common(others, fresh); n != 0 {
		t.Fatalf("epoch 1 again was carried by %d slabs of rings it should not have got", n)
	}
	if len(got) != len(want) {
		t.Fatalf("%d batches on the ring left, %d on a new one", len(got), len(want))
	}
	padded := false
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("batch %d on the ring left differs from the new ring's:\n%.300s\n%.300s", i, got[i], want[i])
		}
		padded = padded || !bytes.Contains([]byte(got[i]), []byte(" padded 0 "))
	}
	if !padded {
		t.Fatal("no batch had padded rows")
	}
	// The last loader closed holding a batch: its ring is not handed on.
	_, after, _ := ringEpoch(t, next, false)
	if n := common(fresh, after); n != 0 {
		t.Fatalf("a ring closed with a batch held gave %d of its slabs to the next loader", n)
	}
}
