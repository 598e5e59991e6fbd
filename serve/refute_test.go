package serve

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/shardload/shardload"
	"github.com/shardload/shardload/index"
	"github.com/shardload/shardload/internal/shardgen"
	"github.com/shardload/shardload/wire"
)

// TestCountFoundWrongStopsEveryRank: an index whose count of one shard is too low
// (20 of its 25 samples, counts alone, so that nothing but reading shows it) is
// found wrong by the one rank that reads the shard's end; the server then fails
// every session planned from that count, the other rank too, in this epoch or at
// the start of its next, instead of that rank finishing "exact" epochs that left
// the shard's last samples out. A session of another dataset goes on.
func TestCountFoundWrongStopsEveryRank(t *testing.T) {
	dir := t.TempDir()
	spec := shardgen.Spec{Shards: 4, SamplesPerShard: 25, Fields: shardgen.Presets["default"]}
	paths, err := shardgen.Generate(dir, spec)
	if err != nil {
		t.Fatal(err)
	}
	infos, err := shardload.Count(context.Background(), shardload.Config{URLs: paths, NoIndexStore: true, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	for i := range infos {
		infos[i].Offsets, infos[i].Members = nil, nil
	}
	infos[1].Samples = 20
	var b bytes.Buffer
	if err := index.Write(&b, infos, false); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, index.FileName), b.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	other := dataset(t)
	s := start(t, Options{URLs: []string{filepath.Join(dir, spec.Pattern())}, Allow: []string{"file://" + filepath.Dir(other) + "/"},
		Pipeline: shardload.Config{NoIndexStore: true, Slabs: 2, SlabBytes: 4 << 20}})

	bystander, m := dial(t, s.Addr(), wire.Hello{Version: Version, World: 1, BatchSize: 5, URLs: []string{"file://" + other}})
	if m != nil {
		t.Fatal(m)
	}
	var wg sync.WaitGroup
	msgs := make([]string, 2)
	for rank := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cl, m := dial(t, s.Addr(), wire.Hello{Version: Version, Rank: rank, World: 2, BatchSize: 5})
			for epoch := 1; m == nil && epoch <= 3; {
				typ, b := cl.recv()
				switch typ {
				case wire.TypeBatch:
					var bm wire.Batch
					json.Unmarshal(b, &bm)
					cl.release(bm)
				case wire.TypeEnd:
					cl.send(wire.EpochRequest{Type: wire.TypeEpoch, Epoch: epoch})
					epoch++
				case wire.TypeError:
					json.Unmarshal(b, &m)
				}
			}
			if m != nil {
				msgs[rank], _ = m["message"].(string)
			}
		}()
	}
	wg.Wait()
	for rank, msg := range msgs {
		if !strings.Contains(msg, "sample count disagree") || !strings.Contains(msg, "train-000001.tar") {
			t.Errorf("rank %d: %q; want the count of train-000001.tar found wrong", rank, msg)
		}
	}
	if !strings.Contains(msgs[0]+msgs[1], "found by session") {
		t.Errorf("no rank was told another found the count wrong: %q", msgs)
	}
	// The other dataset's session is not concerned.
	if _, e := bystander.epoch(); e.Samples != 100 {
		t.Errorf("the session of another dataset: end %+v, want its 100 samples", e)
	}
}
