package packed_test

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/shardload/shardload/megatron"
	"github.com/shardload/shardload/pack"
	"github.com/shardload/shardload/packed"
	"github.com/shardload/shardload/plan"
)

// streamDocs returns n documents of lo to hi tokens, document i's first token
// being id0+i (which names its stream and itself), the others random.
func streamDocs(n, lo, hi int, id0 int64, seed uint64) [][]int64 {
	r := rand.New(rand.NewPCG(seed, 2))
	docs := make([][]int64, n)
	for i := range docs {
		d := make([]int64, lo+r.IntN(hi-lo+1))
		d[0] = id0 + int64(i)
		for j := 1; j < len(d); j++ {
			d[j] = int64(r.IntN(30000))
		}
		docs[i] = d
	}
	return docs
}

// streamOfDocs splits rows (the world-1 epoch, eos after every document) into
// documents, checks each is one of docs (by its first token, id0 of stream s being
// s*streamID), and returns each stream's tokens, eos included.
func streamShares(t *testing.T, rows []int64, docs [][][]int64, spec pack.Spec) []int64 {
	t.Helper()
	tail := len(rows)
	for tail > 0 && rows[tail-1] == spec.Pad {
		tail--
	}
	got := make([]int64, len(docs))
	var cur []int64
	for _, v := range rows[:tail] {
		if v != spec.EOS {
			cur = append(cur, v)
			continue
		}
		s, i := int(cur[0]/streamID), int(cur[0]%streamID)
		if s >= len(docs) || i >= len(docs[s]) || !slices.Equal(cur, docs[s][i]) {
			t.Fatalf("a document of %d tokens starting %d is none of the streams'", len(cur), cur[0])
		}
		got[s] += int64(len(cur)) + 1
		cur = nil
	}
	if len(cur) != 0 {
		t.Fatalf("%d tokens after the last eos", len(cur))
	}
	return got
}

const streamID = 1_000_000

// Streams mixed by tokens: each stream's share of the epoch's tokens is its weight's,
// whatever its documents' lengths (2-20, 100-300 and 30-90 tokens), the small streams
// repeated to reach it; the epoch is exact on every world and after a resume on
// another, and the fingerprint names the mix.
func TestPackedMixByTokens(t *testing.T) {
	const seqLen = 64
	spec := pack.Spec{Field: "tokens.npy", SeqLen: seqLen, HasEOS: true, EOS: 999_999_999, Pad: 999_999_998}
	docs := [][][]int64{
		streamDocs(900, 2, 20, 0, 1),
		streamDocs(400, 100, 300, streamID, 2),
		streamDocs(150, 30, 90, 2*streamID, 3),
	}
	dir := t.TempDir()
	for _, sub := range []string{"a", "b"} {
		os.Mkdir(filepath.Join(dir, sub), 0o755)
	}
	a := writeShards(t, filepath.Join(dir, "a"), docs[0], 100, "<i4")
	b := writeShards(t, filepath.Join(dir, "b"), docs[1], 70, "<i4")
	c := writeMegatron(t, dir, docs[2], megatron.Int32)
	urls := append(append(slices.Clone(a), b...), c)
	streams := []plan.Stream{{First: 0, Count: len(a), Weight: 0.5}, {First: len(a), Count: len(b), Weight: 0.3}, {First: len(a) + len(b), Count: 1, Weight: 0.2}}
	weights := []float64{0.5, 0.3, 0.2}
	const epochTokens = 120_000
	base := packed.Config{URLs: urls, Streams: streams, EpochTokens: epochTokens, Pack: spec, BatchSize: 3, Seed: 5, Epoch: 1,
		ShuffleBuffer: 60, OpenShards: 4, ReadGap: 1, Logf: t.Logf}

	one, _, _, l := epoch(t, base)
	rows := interleave([][][]int64{one})[:l.Rows()*seqLen]
	got := streamShares(t, rows, docs, spec)
	if !slices.Equal(got, l.StreamTokens()) {
		t.Errorf("streams' tokens in the rows %v, StreamTokens %v", got, l.StreamTokens())
	}
	var total int64
	for _, n := range got {
		total += n
	}
	if total != l.Tokens() {
		t.Errorf("%d tokens in the rows, Tokens %d", total, l.Tokens())
	}
	// Drawn by documents at their streams' mean lengths, the epoch's tokens and
	// shares are those asked for within the sampling error of the documents drawn
	// of a stream's partial cycle: here under 1% of the epoch.
	if math.Abs(float64(total-epochTokens)) > 0.01*epochTokens {
		t.Errorf("an epoch of %d tokens, asked for %d", total, epochTokens)
	}
	for s, w := range weights {
		share := float64(got[s]) / float64(total)
		t.Logf("stream %d: %d tokens, share %.4f, weight %.2f", s, got[s], share, w)
		if math.Abs(share-w) > 0.01 {
			t.Errorf("stream %d: a share of %.4f of the epoch's tokens, its weight is %.2f", s, share, w)
		}
	}
	// By documents, the weights would have given the long documents' stream most
	// of the tokens: the check above can fail.
	if got[1] >= got[0] {
		t.Errorf("stream 1 (long documents, weight 0.3) has %d tokens, stream 0 (short, weight 0.5) %d", got[1], got[0])
	}

	// Every world gives the same rows; a state of world 2 resumes on world 3.
	for _, world := range []int{2, 3} {
		var ranks [][][]int64
		for r := range world {
			cf := base
			cf.Rank, cf.World = r, world
			bs, _, _, _ := epoch(t, cf)
			ranks = append(ranks, bs)
		}
		if g := interleave(ranks); !slices.Equal(g[:len(rows)], rows) {
			t.Errorf("world %d: the ranks' rows together differ from world 1's", world)
		}
	}
	for _, k := range []int{1, 7, 40} {
		var first [][][]int64
		var state packed.State
		for r := range 2 {
			cf := base
			cf.Rank, cf.World = r, 2
			bs, _, st, _ := epoch(t, cf)
			first = append(first, bs[:k])
			state = st[k-1]
		}
		var rest [][][]int64
		for r := range 3 {
			cf := base
			cf.Rank, cf.World, cf.Resume = r, 3, &state
			bs, _, _, _ := epoch(t, cf)
			rest = append(rest, bs)
		}
		g := append(interleave(first), interleave(rest)...)
		if len(g) < len(rows) || !slices.Equal(g[:len(rows)], rows) {
			t.Errorf("k %d: 2 ranks then 3 give other rows than one rank", k)
		}
	}

	// The fingerprint names the mix: other weights are another order.
	other := base
	other.Streams = slices.Clone(streams)
	other.Streams[0].Weight = 0.6
	st := l.State()
	st.Rows = 3
	other.Resume = &st
	if _, err := packed.Open(context.Background(), other); !errors.Is(err, packed.ErrResume) {
		t.Errorf("a state of other weights: %v, want ErrResume", err)
	}
	other = base
	other.EpochTokens = 0
	other.Resume = &st
	if _, err := packed.Open(context.Background(), other); !errors.Is(err, packed.ErrResume) {
		t.Errorf("a state of another epoch length: %v, want ErrResume", err)
	}
}

// Without EpochTokens an epoch is every weighted stream's tokens once, shared by
// the weights; Repeat and Choose fix a stream's draws; bad mixes are refused.
func TestPackedMixLengths(t *testing.T) {
	spec := pack.Spec{Field: "tokens.npy", SeqLen: 32, HasEOS: true, EOS: 999_999_999, Pad: 999_999_998}
	docs := [][][]int64{streamDocs(300, 2, 20, 0, 4), streamDocs(100, 100, 300, streamID, 5)}
	dir := t.TempDir()
	os.Mkdir(filepath.Join(dir, "a"), 0o755)
	os.Mkdir(filepath.Join(dir, "b"), 0o755)
	a := writeShards(t, filepath.Join(dir, "a"), docs[0], 100, "<i4")
	b := writeShards(t, filepath.Join(dir, "b"), docs[1], 50, "<i4")
	urls := append(slices.Clone(a), b...)
	var all []int64
	for _, ds := range docs {
		var n int64
		for _, d := range ds {
			n += int64(len(d)) + 1
		}
		all = append(all, n)
	}
	base := packed.Config{URLs: urls, Pack: spec, BatchSize: 4, Seed: 9, ShuffleBuffer: 40, Logf: t.Logf}
	for _, tc := range []struct {
		name    string
		streams []plan.Stream
		want    []float64 // tokens per stream
	}{
		{"weights", []plan.Stream{{First: 0, Count: 3, Weight: 1}, {First: 3, Count: 2, Weight: 1}},
			[]float64{float64(all[0]+all[1]) / 2, float64(all[0]+all[1]) / 2}},
		{"repeat and once", []plan.Stream{{First: 0, Count: 3, Repeat: 3}, {First: 3, Count: 2}},
			[]float64{3 * float64(all[0]), float64(all[1])}},
		{"repeat and weight", []plan.Stream{{First: 0, Count: 3, Repeat: 2}, {First: 3, Count: 2, Weight: 1}},
			[]float64{2 * float64(all[0]), float64(all[1])}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cf := base
			cf.Streams = tc.streams
			bs, _, _, l := epoch(t, cf)
			got := streamShares(t, interleave([][][]int64{bs})[:l.Rows()*32], docs, spec)
			for s, w := range tc.want {
				if math.Abs(float64(got[s])-w) > 0.03*w {
					t.Errorf("stream %d: %d tokens, want about %.0f", s, got[s], w)
				}
			}
		})
	}
	for _, tc := range []struct {
		name string
		cfg  func(*packed.Config)
	}{
		{"past the URLs", func(c *packed.Config) { c.Streams = []plan.Stream{{First: 3, Count: 3, Weight: 1}} }},
		{"two settings", func(c *packed.Config) { c.Streams = []plan.Stream{{First: 0, Count: 5, Weight: 1, Repeat: 2}} }},
		{"sharing a URL", func(c *packed.Config) {
			c.Streams = []plan.Stream{{First: 0, Count: 3, Weight: 1}, {First: 2, Count: 3, Weight: 1}}
		}},
		{"fixed past the epoch", func(c *packed.Config) {
			c.Streams = []plan.Stream{{First: 0, Count: 3, Repeat: 10}, {First: 3, Count: 2, Weight: 1}}
			c.EpochTokens = 100
		}},
		{"negative epoch", func(c *packed.Config) { c.EpochTokens = -1 }},
	} {
		cf := base
		tc.cfg(&cf)
		if _, err := packed.Open(context.Background(), cf); !errors.Is(err, packed.ErrMix) {
			t.Errorf("%s: %v, want ErrMix", tc.name, err)
		}
	}
}
