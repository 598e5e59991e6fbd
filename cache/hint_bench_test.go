package cache

import (
	"fmt"
	"testing"
	"time"
)

// BenchmarkHintsPublish publishes a reader's schedule of n shards to a cache with a
// disk tier (the file written and renamed into place, the heartbeat) and without
// one (memory only), as a loader republishes its epoch's remaining reads. It
// reports the file's bytes per entry.
func BenchmarkHintsPublish(b *testing.B) {
	for _, n := range []int{24, 1024} {
		urls := make([]string, n)
		for i := range urls {
			urls[i] = fmt.Sprintf("s3://bucket/train/train-%06d.tar", i)
		}
		for _, disk := range []bool{true, false} {
			b.Run(fmt.Sprintf("shards=%d/disk=%v", n, disk), func(b *testing.B) {
				opts := Options{MemoryBytes: 1 << 20, Logf: b.Logf}
				if disk {
					opts = Options{Dir: b.TempDir(), DiskBytes: 1 << 30, Logf: b.Logf}
				}
				c, err := New(opts, newFake())
				if err != nil {
					b.Fatal(err)
				}
				defer c.Close()
				h, err := c.Hint("bench", HintOptions{})
				if err != nil {
					b.Fatal(err)
				}
				defer h.Close()
				next := Schedule(urls, time.Now(), 10*time.Millisecond)
				b.ResetTimer()
				for range b.N {
					if err := h.Publish(next); err != nil {
						b.Fatal(err)
					}
				}
				b.StopTimer()
				st := h.Stats()
				b.ReportMetric(float64(st.FileBytes)/float64(st.Entries), "B/entry")
			})
		}
	}
}
