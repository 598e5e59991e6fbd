package serve

import (
	"errors"
	"strings"
	"testing"

	"github.com/shardload/shardload"
	"github.com/shardload/shardload/wire"
)

// TestBatchTooLargeRefusedAtHello: a batch whose fixed columns need a slab over the
// server's limit, or a ring over its budget, is refused at the hello, in the terms of
// the trainer's settings and the server's flags, with no slab made for it; the
// server's other sessions go on.
func TestBatchTooLargeRefusedAtHello(t *testing.T) {
	pattern := dataset(t)
	s := start(t, Options{URLs: []string{pattern}, Pipeline: shardload.Config{Memory: 256 << 20}})
	images := []string{"img=jpg:image:uint8:3x224x224", "cls"} // 150,528 bytes a sample and a label

	// A session that fits, before and through the refusals.
	cl, m := dial(t, s.Addr(), wire.Hello{Version: Version, World: 1, BatchSize: 5, Fields: []string{"cls"}})
	if m != nil {
		t.Fatalf("small session: %v", m)
	}
	for _, tc := range []struct {
		name  string
		h     wire.Hello
		wants []string
	}{
		{"over --max-slab-size", wire.Hello{Version: Version, World: 1, BatchSize: 8192, Fields: images},
			[]string{"batch of 8192 samples", "batch_size=", "slab_bytes=", "--max-slab-size of 1GiB", "needs a slab of 1178MiB", "samples of these fields fit"}},
		{"over --memory", wire.Hello{Version: Version, World: 1, BatchSize: 512, Fields: images},
			[]string{"batch of 512 samples", "batch_size=", "slabs=", "--memory of 256MiB", "needs a slab of 74MiB", "4 slabs of it", "samples of these fields fit"}},
		{"protocol 2", wire.Hello{Version: 2, World: 1, BatchSize: 8192, Fields: images},
			[]string{"batch_size=", "--max-slab-size"}},
	} {
		_, m := dial(t, s.Addr(), tc.h)
		if m == nil {
			t.Fatalf("%s: the server made the session's slabs", tc.name)
		}
		msg, _ := m["message"].(string)
		if m["code"] != CodeBadRequest {
			t.Errorf("%s: %v", tc.name, m)
		}
		for _, w := range tc.wants {
			if !strings.Contains(msg, w) {
				t.Errorf("%s: the message does not say %q: %s", tc.name, w, msg)
			}
		}
		if strings.Contains(msg, "Config.") {
			t.Errorf("%s: the message names the Go library's settings to a trainer: %s", tc.name, msg)
		}
	}
	if live, _ := s.Stats(); len(live) != 1 {
		t.Errorf("%d sessions served after the refusals, want the one that fits", len(live))
	}
	// The one that fits is served as usual, and another one can start.
	if _, e := cl.epoch(); e.Samples != 100 {
		t.Errorf("the small session's epoch: %+v", e)
	}
	if _, m := dial(t, s.Addr(), wire.Hello{Version: Version, World: 1, BatchSize: 64, Fields: images}); m != nil {
		t.Errorf("a batch that fits after the refusals: %v", m)
	}
}

// TestCheckBatchLimits: shardload.CheckBatch refuses from the settings alone what the
// limit or the budget cannot hold, says the largest batch that fits, and accepts it.
func TestCheckBatchLimits(t *testing.T) {
	fs := fields(t, "img=jpg:image:uint8:3x224x224")
	cfg := shardload.Config{BatchSize: 8192}
	err := shardload.CheckBatch(cfg, fs)
	var be *shardload.BatchError
	if err == nil || !strings.Contains(err.Error(), "Config.MaxSlabBytes") || !errors.As(err, &be) {
		t.Fatalf("8192 images under the default limit: %v", err)
	}
	if be.Need <= be.MaxSlab || be.MaxRows <= 0 || be.MaxRows >= 8192 {
		t.Fatalf("figures %+v", be)
	}
	cfg.BatchSize = be.MaxRows
	if err := shardload.CheckBatch(cfg, fs); err != nil {
		t.Errorf("the largest batch said to fit (%d) is refused: %v", be.MaxRows, err)
	}
	cfg.BatchSize++
	if err := shardload.CheckBatch(cfg, fs); err == nil {
		t.Errorf("one more than the largest batch said to fit (%d) is accepted", cfg.BatchSize)
	}
}
