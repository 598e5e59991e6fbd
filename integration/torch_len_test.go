package integration

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
)

// The PyTorch conventions a trainer relies on: len() of a ShardloadDataset is the
// batches its epoch yields, with estimated counts too; a DataLoader that would batch
// its batches again is refused naming batch_size=None; a column name that is not one
// is a KeyError listing the columns; ranks that disagree on their seed are told so.

var torchCheckScript = func() string {
	p, _ := filepath.Abs("../client/python/tests/torch_check.py")
	return p
}()

// torchCheck runs torch_check.py with args and returns its output lines as JSON
// objects; it fails the test when the script fails.
func torchCheck(t *testing.T, py string, args ...string) []map[string]json.RawMessage {
	t.Helper()
	out, err := startPy(t, py, nil, append([]string{torchCheckScript}, args...)...).wait(t)
	if err != nil {
		t.Fatalf("torch_check.py %s: %v", strings.Join(args, " "), err)
	}
	return out
}

// skewedShardFile writes a shard of first samples of firstBytes then rest of
// restBytes (a .bin and a .cls each): counts estimated from its first samples' bytes
// miss its true count.
func skewedShardFile(t *testing.T, dir, name string, first, firstBytes, rest, restBytes int) string {
	t.Helper()
	var members []tarMember
	for i := range first + rest {
		n := firstBytes
		if i >= first {
			n = restBytes
		}
		key := fmt.Sprintf("%s-%05d", strings.TrimSuffix(name, ".tar"), i)
		members = append(members, tarMember{key + ".bin", strings.Repeat("x", n)}, tarMember{key + ".cls", fmt.Sprint(i % 10)})
	}
	return writeTar(t, dir, name, members...)
}

// TestClientLenEstimated: a server planning from counts estimated from the shards'
// sizes (no index), for shards holding fewer samples than estimated and for shards
// holding more: len(ShardloadDataset) and len(DataLoader) equal the batches each
// epoch yields (padded, or trimmed, to the plan), and the client's last_epoch says
// how many samples were repeated or left out.
func TestClientLenEstimated(t *testing.T) {
	py := python(t)
	for _, tc := range []struct {
		name                               string
		first, firstBytes, rest, restBytes int
		over                               bool
	}{
		{"over", 64, 200, 60, 6000, true},
		{"under", 64, 6000, 250, 200, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			skewedShardFile(t, dir, "a.tar", tc.first, tc.firstBytes, tc.rest, tc.restBytes)
			skewedShardFile(t, dir, "b.tar", tc.first, tc.firstBytes, tc.rest/2, tc.restBytes)
			truth := 2*tc.first + tc.rest + tc.rest/2
			srv := startServer(t, "", "--no-index-store", filepath.Join(dir, "{a,b}.tar"))
			lines := torchCheck(t, py, "len", srv.socket, "8", "label=cls:int")
			var r struct {
				LenDataset int `json:"len_dataset"`
				LenLoader  int `json:"len_loader"`
				Epochs     []struct {
					Batches    int  `json:"batches"`
					EndBatches int  `json:"end_batches"`
					Rows       int  `json:"rows"`
					Distinct   int  `json:"distinct"`
					Padded     int  `json:"padded"`
					LeftOut    int  `json:"left_out"`
					Estimated  bool `json:"estimated"`
					LenAfter   int  `json:"len_after"`
				} `json:"epochs"`
			}
			b, _ := json.Marshal(lines[0])
			if err := json.Unmarshal(b, &r); err != nil || len(r.Epochs) != 2 {
				t.Fatalf("torch_check.py printed %s: %v", b, err)
			}
			t.Logf("%s: %+v (the shards hold %d samples)", tc.name, r, truth)
			if r.LenDataset != r.LenLoader || r.LenDataset == 0 {
				t.Errorf("len(dataset) %d, len(DataLoader) %d", r.LenDataset, r.LenLoader)
			}
			for i, e := range r.Epochs {
				if e.Batches != r.LenDataset || e.EndBatches != e.Batches || e.LenAfter != r.LenDataset {
					t.Errorf("epoch %d: %d batches yielded (the end says %d), len() %d before and %d after", i, e.Batches, e.EndBatches, r.LenDataset, e.LenAfter)
				}
				if !e.Estimated {
					t.Errorf("epoch %d: not said to be estimated", i)
				}
				// Every sample is yielded once or counted as left out; the padding
				// repeats rows of the epoch.
				if e.Distinct+e.LeftOut != truth || e.Rows != e.Distinct+e.Padded {
					t.Errorf("epoch %d: %d distinct samples, %d left out, %d rows, %d padded; the shards hold %d", i, e.Distinct, e.LeftOut, e.Rows, e.Padded, truth)
				}
				if tc.over && e.Padded == 0 || !tc.over && e.LeftOut == 0 {
					t.Errorf("epoch %d: %d padded and %d left out: the estimate's miss is not reported", i, e.Padded, e.LeftOut)
				}
			}
		})
	}
}

// TestClientDataLoaderBatchSize: a DataLoader that batches ShardloadDataset's batches
// again (DataLoader's default batch_size=1, batch_size=4, in a worker process, or
// default_collate called on its batches) fails at once with a ShardloadError naming
// batch_size=None, instead of yielding (1, B, ...) tensors; batch_size=None yields
// the batches. A column name that is not one, of the dataset's batches and of the
// client's, is a KeyError listing the columns.
func TestClientDataLoaderBatchSize(t *testing.T) {
	py := python(t)
	images, _ := datasets(t)
	srv := startServer(t, "", images)
	// A fixed-shape column alone: torch would stack such batches without a word.
	lines := torchCheck(t, py, "batching", srv.socket, "8", "label=cls:int")
	got := map[string]struct {
		Error, Message string
		Batches        int
		Shape          []int
	}{}
	for _, l := range lines {
		var c struct {
			Case, Error, Message string
			Batches              int
			Shape                []int
		}
		b, _ := json.Marshal(l)
		json.Unmarshal(b, &c)
		got[c.Case] = struct {
			Error, Message string
			Batches        int
			Shape          []int
		}{c.Error, c.Message, c.Batches, c.Shape}
	}
	for _, c := range []string{"default", "batch_size=4", "worker", "collate"} {
		g := got[c]
		if g.Error != "ShardloadError" || !strings.Contains(g.Message, "batch_size=None") || !strings.Contains(g.Message, "batches again") {
			t.Errorf("%s: %+v; want a ShardloadError naming batch_size=None", c, g)
		}
	}
	// 115 samples in batches of 8.
	if g := got["none"]; g.Error != "" || g.Batches != 15 || len(g.Shape) != 1 || g.Shape[0] != 8 {
		t.Errorf("batch_size=None: %+v; want 15 batches of 8 labels", g)
	}
	for _, c := range []string{"missing", "client missing"} {
		g := got[c]
		if g.Error != "KeyError" || !strings.Contains(g.Message, "no column 'lable'; columns: label") {
			t.Errorf("%s: %+v; want a KeyError listing the columns", c, g)
		}
	}
}

// TestClientOrderMessages: the message of ranks whose settings differ names the
// setting and how a trainer makes it the same on every rank: for the seed, that it
// must be the same on every rank (not seed=rank), not the servers' settings.
func TestClientOrderMessages(t *testing.T) {
	py := python(t)
	lines := clientCheck(t, py, nil, "messages")
	msgs := map[string]string{}
	for _, l := range lines {
		var c, m string
		field(t, l, "case", &c)
		field(t, l, "message", &m)
		msgs[c] = m
	}
	if m := msgs["seed"]; !strings.Contains(m, "disagree on seed") || !strings.Contains(m, "seed must be the same on every rank") ||
		!strings.Contains(m, "not seed=rank") || strings.Contains(m, "server") {
		t.Errorf("seeds differ: %q; want the ranks' disagreement on seed and that it must be the same on every rank", m)
	}
	if m := msgs["lanes"]; !strings.Contains(m, "lanes 2 (rank 1) vs 4 (rank 0)") || !strings.Contains(m, "open_shards=") || !strings.Contains(m, "--open-shards") {
		t.Errorf("lanes differ: %q; want open_shards= and the server's --open-shards", m)
	}
}
