package serve

import (
	"testing"

	"github.com/shardload/shardload/cache"
	"github.com/shardload/shardload/plan"
	"github.com/shardload/shardload/source"
)

// EpochHints announces a shard's runs of samples once, at its first (a plan's
// spans of one shard are one shard read), and a span of no samples each time it
// comes (a packed epoch's reads: an object at its first read and again at its
// last); the shards announced count each URL once an epoch.
func TestEpochHintsAnnounceReads(t *testing.T) {
	reg := &source.Registry{}
	reg.Register("mem", oneObject("x"))
	cached, c, err := cache.Wrap(cache.Options{MemoryBytes: 1 << 20}, reg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for _, tc := range []struct {
		name    string
		spans   []plan.Span
		entries int64
	}{
		{"samples", []plan.Span{{URL: "mem://b/a", Feeds: 1}, {URL: "mem://b/b", Feeds: 2}, {URL: "mem://b/a", Feeds: 1}}, 2},
		{"reads", []plan.Span{{URL: "mem://b/a"}, {URL: "mem://b/b"}, {URL: "mem://b/a"}, {URL: "mem://b/b"}}, 4},
	} {
		h := NewEpochHints("test", t.Logf)
		h.OpenPlan(plan.Plan{Batches: 10, Spans: tc.spans}, cached)
		h.Close()
		st := h.Stats()
		if st.Publishes != 1 || st.Entries != tc.entries || st.ShardEpochs != 2 {
			t.Errorf("%s: %d publishes of %d entries, %d shards announced; want 1 of %d, 2", tc.name, st.Publishes, st.Entries, st.ShardEpochs, tc.entries)
		}
	}
}
