package plan

import (
	"cmp"
	"errors"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/shardload/shardload/internal/testutil"
	"github.com/shardload/shardload/shard"
)

// twoStreams returns shards of stream A (na shards of per samples) then B (nb).
func twoStreams(na, nb, per int) []shard.Info {
	counts := make([]int, na+nb)
	for i := range counts {
		counts[i] = per
	}
	return testShards(counts...)
}

// mixEpoch reads epoch epoch of the mix through the plans of world ranks (their
// slices, in rank order), with runs.
func mixEpoch(t *testing.T, shards []shard.Info, m Mix, epoch, world, batch int, runs []Run) []sampleID {
	t.Helper()
	var out []sampleID
	for r := range world {
		p, err := New(shards, Config{Seed: 7, Epoch: epoch, Rank: r, World: world, Shuffle: true, Lanes: 4, Window: 300, BatchSize: batch, Mix: &m, Runs: runs})
		if err != nil {
			t.Fatal(err)
		}
		got := readPlan(t, p)
		var per int64
		for _, n := range p.Streams {
			per += n
		}
		if per != int64(len(got)) || len(got) != p.Samples {
			t.Fatalf("rank %d: read %d samples, plan says %d (streams %v)", r, len(got), p.Samples, p.Streams)
		}
		byStream := make([]int64, len(m.Streams))
		for _, id := range got {
			for s, st := range m.Streams {
				if id.shard >= st.First && id.shard < st.First+st.Count {
					byStream[s]++
				}
			}
		}
		if !slices.Equal(byStream, p.Streams) {
			t.Fatalf("rank %d: read %v samples of each stream, plan says %v", r, byStream, p.Streams)
		}
		out = append(out, got...)
	}
	return out
}

func TestSplit(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for trial := range 200 {
		k := 1 + rng.IntN(9)
		counts := make([]int64, k)
		var total int64
		for i := range counts {
			counts[i] = rng.Int64N(1000)
			total += counts[i]
		}
		sp := newSplit(counts, func(t int64) uint64 { return rng.Uint64N(uint64(t)) })
		depth := int64(0)
		for 1<<depth < k {
			depth++
		}
		got := make([]int64, k)
		for x := range total + 1 {
			var sum int64
			for i := range counts {
				c := sp.count(i, x)
				if c < got[i] || c > got[i]+1 {
					t.Fatalf("trial %d: part %d at %d: %d after %d", trial, i, x, c, got[i])
				}
				got[i] = c
				sum += c
				if ideal := float64(x) * float64(counts[i]) / float64(total); float64(c) < ideal-float64(depth)-1 || float64(c) > ideal+float64(depth)+1 {
					t.Fatalf("trial %d: part %d has %d of the first %d, ideal %.1f", trial, i, c, x, ideal)
				}
			}
			if sum != x {
				t.Fatalf("trial %d: the parts hold %d of the first %d positions", trial, sum, x)
			}
			if x < total {
				p, idx := sp.part(x)
				if sp.count(p, x+1) != sp.count(p, x)+1 || idx != sp.count(p, x) {
					t.Fatalf("trial %d: position %d goes to part %d (index %d)", trial, x, p, idx)
				}
			}
		}
		for i, c := range counts {
			if got[i] != c {
				t.Fatalf("trial %d: part %d got %d of %d", trial, i, got[i], c)
			}
		}
	}
}

// TestMixRotates: streams of 1,000 and 4,000 samples at 1:1 in epochs of 2,000: each
// epoch holds 1,000 of each, none twice; B's samples over 4 epochs are all its
// samples once; every 256 positions hold A at 0.35-0.65; the same settings give
// the same order; two ranks read the one-rank epoch.
func TestMixRotates(t *testing.T) {
	shards := twoStreams(10, 40, 100)
	m := Mix{Streams: []Stream{{First: 0, Count: 10, Weight: 1}, {First: 10, Count: 40, Weight: 1}}, Samples: 2000}
	seenB := map[sampleID]int{}
	for epoch := range 4 {
		seq := mixEpoch(t, shards, m, epoch, 1, 16, nil)
		if len(seq) != 2000 {
			t.Fatalf("epoch %d: %d samples", epoch, len(seq))
		}
		seen := map[sampleID]bool{}
		a := 0
		for _, id := range seq {
			if seen[id] {
				t.Fatalf("epoch %d: %v twice", epoch, id)
			}
			seen[id] = true
			if id.shard < 10 {
				a++
			} else {
				seenB[id]++
			}
		}
		if a != 1000 {
			t.Fatalf("epoch %d: %d of A", epoch, a)
		}
		if lo, hi := testutil.WindowCounts(seq, 256, func(id sampleID) bool { return id.shard < 10 }); lo < 90 || hi > 166 {
			t.Fatalf("epoch %d: 256 consecutive positions hold %d to %d of A", epoch, lo, hi)
		}
		equalSeq(t, "again", mixEpoch(t, shards, m, epoch, 1, 16, nil), seq)
		// Two ranks read the same samples between them (the window they share split
		// by items: each its runs of every lane, in the window's order).
		two := mixEpoch(t, shards, m, epoch, 2, 16, nil)
		sorted := func(ids []sampleID) []sampleID {
			return slices.SortedFunc(slices.Values(ids), func(a, b sampleID) int {
				return cmp.Or(cmp.Compare(a.shard, b.shard), cmp.Compare(a.idx, b.idx))
			})
		}
		equalSeq(t, "world 2", sorted(two), sorted(seq))
	}
	if len(seenB) != 4000 {
		t.Fatalf("B: %d distinct samples over 4 epochs, want 4000", len(seenB))
	}
	for id, n := range seenB {
		if n != 1 {
			t.Fatalf("B: %v read %d times", id, n)
		}
	}
}

// TestMixRepeat: a stream repeated 2.5 times holds each sample 2 or 3 times an epoch,
// never twice in one window; choose draws its count.
func TestMixRepeat(t *testing.T) {
	shards := twoStreams(4, 6, 50)
	m := Mix{Streams: []Stream{{First: 0, Count: 4, Repeat: 2.5}, {First: 4, Count: 6, Choose: 120}}}
	p, err := New(shards, Config{Seed: 3, Shuffle: true, Lanes: 2, Window: 64, BatchSize: 8, Mix: &m})
	if err != nil {
		t.Fatal(err)
	}
	if p.Samples != 620 || p.Streams[0] != 500 || p.Streams[1] != 120 {
		t.Fatalf("%d samples, streams %v; want 620: 500 + 120", p.Samples, p.Streams)
	}
	seq := readPlan(t, p)
	times := map[sampleID]int{}
	for _, id := range seq {
		times[id]++
	}
	for id, n := range times {
		if id.shard < 4 && (n < 2 || n > 3) || id.shard >= 4 && n != 1 {
			t.Fatalf("%v read %d times", id, n)
		}
	}
	if len(times) != 200+120 {
		t.Fatalf("%d distinct samples", len(times))
	}
	// No sample twice within one window.
	off := 0
	for w := range p.Windows() {
		in := map[sampleID]bool{}
		for _, id := range seq[off : off+int(w.Held)] {
			if in[id] {
				t.Fatalf("window %d holds %v twice", w.Index, id)
			}
			in[id] = true
		}
		off += int(w.Held)
	}
}

// TestMixBatching: stratified batches of 16 at 3:1 hold 12 + 4; per_stream batches
// hold one stream each, in proportion.
func TestMixBatching(t *testing.T) {
	shards := twoStreams(30, 10, 40)
	for _, kind := range []Batching{Stratified, PerStream} {
		m := Mix{Streams: []Stream{{First: 0, Count: 30, Weight: 3}, {First: 30, Count: 10, Weight: 1}}, Samples: 1000, Batching: kind}
		for _, world := range []int{1, 3} {
			seq := mixEpoch(t, shards, m, 1, world, 16, nil)
			if len(seq)%16 != 0 {
				t.Fatalf("%s world %d: %d samples", kind, world, len(seq))
			}
			ones := 0
			for b := 0; b < len(seq); b += 16 {
				a := 0
				for _, id := range seq[b : b+16] {
					if id.shard < 30 {
						a++
					}
				}
				switch {
				case kind == Stratified && a != 12:
					t.Fatalf("world %d: batch %d holds %d of A", world, b/16, a)
				case kind == PerStream && a != 0 && a != 16:
					t.Fatalf("world %d: batch %d holds %d of A", world, b/16, a)
				}
				if a == 0 {
					ones++
				}
			}
			if kind == PerStream && (ones < len(seq)/16/4-1 || ones > len(seq)/16/4+1) {
				t.Fatalf("world %d: %d of %d batches from B", world, ones, len(seq)/16)
			}
		}
	}
}

// TestMixResume: what a job of 3 ranks left after 2 batches, read by 2 ranks, is the
// rest of the one-rank epoch, once each.
func TestMixResume(t *testing.T) {
	shards := twoStreams(10, 40, 100)
	for _, kind := range []Batching{Random, Stratified} {
		m := Mix{Streams: []Stream{{First: 0, Count: 10, Weight: 1}, {First: 10, Count: 40, Weight: 2}}, Samples: 3000, Batching: kind}
		full := mixEpoch(t, shards, m, 2, 1, 16, nil)
		first := mixEpoch(t, shards, m, 2, 3, 16, nil)
		per := len(first) / 3
		var consumed []sampleID
		for r := range 3 {
			consumed = append(consumed, first[r*per:r*per+32]...)
		}
		rest := mixEpoch(t, shards, m, 2, 2, 16, []Run{{World: 3, Consumed: 32}})
		count := map[sampleID]int{}
		for _, id := range append(consumed, rest...) {
			count[id]++
		}
		for id, n := range count {
			if n != 1 {
				t.Fatalf("%s: %v read %d times", kind, id, n)
			}
		}
		if missing := len(full) - len(count); missing < 0 || missing >= 2*16*3 {
			t.Fatalf("%s: %d of the epoch's %d samples read after resuming", kind, len(count), len(full))
		}
	}
}

func TestMixDraws(t *testing.T) {
	shards := twoStreams(2, 3, 10)
	for _, tt := range []struct {
		m     Mix
		draws []int64
		total int64
		err   bool
	}{
		{m: Mix{Streams: []Stream{{0, 2, 0, 0, 0}, {2, 3, 0, 0, 0}}}, draws: []int64{20, 30}, total: 50},
		{m: Mix{Streams: []Stream{{0, 2, 1, 0, 0}, {2, 3, 1, 0, 0}}}, draws: []int64{25, 25}, total: 50},
		{m: Mix{Streams: []Stream{{0, 2, 0, 2, 0}, {2, 3, 0, 0, 0}}, Samples: 35}, draws: []int64{20, 15}, total: 35},
		{m: Mix{Streams: []Stream{{0, 2, 0, 0, 5}, {2, 3, 1, 0, 0}}, Samples: 40}, draws: []int64{5, 35}, total: 40},
		{m: Mix{Streams: []Stream{{0, 2, 1, 1, 0}}}, err: true},
		{m: Mix{Streams: []Stream{{0, 2, 0, 0, 50}, {2, 3, 1, 0, 0}}, Samples: 40}, err: true},
		{m: Mix{Streams: []Stream{{0, 9, 1, 0, 0}}}, err: true},
		{m: Mix{Streams: []Stream{{0, 2, -1, 0, 0}}}, err: true},
	} {
		d, total, err := tt.m.Draws(shards)
		if (err != nil) != tt.err {
			t.Fatalf("%+v: %v", tt.m, err)
		}
		if err == nil && (total != tt.total || len(d) != len(tt.draws) || d[0] != tt.draws[0] || d[1] != tt.draws[1]) {
			t.Fatalf("%+v: draws %v of %d, want %v of %d", tt.m, d, total, tt.draws, tt.total)
		}
	}
}

// TestMixEveryOnceBeforeTwice: a stream drawn at 300 of its 1,000 samples an epoch
// holds no sample twice in an epoch, every sample comes once before any comes twice
// (at epoch granularity), and 10 epochs hold each sample 3 times.
func TestMixEveryOnceBeforeTwice(t *testing.T) {
	shards := twoStreams(10, 2, 100)
	m := Mix{Streams: []Stream{{First: 0, Count: 10, Choose: 300}, {First: 10, Count: 2, Choose: 100}}}
	times := map[sampleID]int{}
	for epoch := range 10 {
		seen := map[sampleID]bool{}
		for _, id := range mixEpoch(t, shards, m, epoch, 1, 8, nil) {
			if seen[id] {
				t.Fatalf("epoch %d: %v twice", epoch, id)
			}
			seen[id] = true
			if id.shard < 10 {
				times[id]++
			}
		}
		lo, hi := 1<<30, 0
		for _, n := range times {
			lo, hi = min(lo, n), max(hi, n)
		}
		if drawn := 300 * (epoch + 1); drawn >= 1000 && len(times) != 1000 || drawn < 1000 && len(times) != drawn || len(times) == 1000 && hi-lo > 1 {
			t.Fatalf("after epoch %d: %d distinct samples, drawn %d to %d times", epoch, len(times), lo, hi)
		}
	}
	for id, n := range times {
		if n != 3 {
			t.Fatalf("%v drawn %d times in 10 epochs", id, n)
		}
	}
}

// A stream that its weight leaves without a row of a stratified batch is refused.
func TestMixNoRowRefused(t *testing.T) {
	shards := twoStreams(4, 4, 50)
	m := Mix{Streams: []Stream{{First: 0, Count: 4, Weight: 100}, {First: 4, Count: 4, Weight: 1}}, Batching: Stratified}
	if _, err := New(shards, Config{BatchSize: 8, Mix: &m}); !errors.Is(err, ErrMix) {
		t.Fatalf("a stream without a row: %v", err)
	}
}

// TestMixSplitReadsOnce: the ranks of a shuffled mix of random batching split the
// windows they share by items, as a single dataset's do: with reads across gaps taken
// to cost nothing, no two ranks read the same sample (stratified batches, which keep
// runs of positions, may).
func TestMixSplitReadsOnce(t *testing.T) {
	shards := twoStreams(10, 40, 100)
	for i := range shards {
		for k := range shards[i].Samples {
			shards[i].Offsets = append(shards[i].Offsets, int64(k)*4096)
		}
	}
	m := Mix{Streams: []Stream{{First: 0, Count: 10, Weight: 1}, {First: 10, Count: 40, Weight: 2}}, Samples: 3000}
	for _, world := range []int{2, 3, 7} {
		var read, yielded int
		for r := range world {
			p, err := New(shards, Config{Seed: 3, Rank: r, World: world, Shuffle: true, Lanes: 4, Window: 300, BatchSize: 16, Mix: &m, GapBytes: 1 << 40})
			if err != nil {
				t.Fatal(err)
			}
			yielded += len(readPlan(t, p))
			for _, sp := range p.Spans {
				read += sp.Take
			}
		}
		if read != yielded {
			t.Fatalf("world %d: the ranks read %d samples to yield %d", world, read, yielded)
		}
	}
}
