package cache

import (
	"bytes"
	"context"
	"io"
	"testing"

	"github.com/shardload/shardload/source"
)

// OpenAt reads ranges of an object at a known version: the first fetches the whole
// object into the cache (no range from the source, though the source reads ranges),
// the next are served from the cache; none asks the source for the object's Info.
func TestOpenAt(t *testing.T) {
	fake := &rangeFake{fakeSource: newFake()}
	data := randBytes(3, 3<<20)
	fake.put("s3://b/idx", data, `"v1"`)
	c := newCache(t, Options{Dir: t.TempDir()}, fake)
	info := source.Info{URL: "s3://b/idx", Size: int64(len(data)), Version: `"v1"`}
	for _, r := range []struct{ off, n int64 }{{1 << 20, 4096}, {0, -1}, {3<<20 - 10, 100}, {5, 0}} {
		body, err := c.OpenAt(context.Background(), info, r.off, r.n)
		if err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(body)
		body.Close()
		if err != nil {
			t.Fatal(err)
		}
		want := data[r.off:]
		if r.n >= 0 {
			want = want[:min(r.n, int64(len(want)))]
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("range %d+%d: %d bytes, not the object's", r.off, r.n, len(got))
		}
	}
	if opens, stats := fake.openCount("s3://b/idx"), fake.stats; opens != 1 || fake.ranges != 0 || stats != 0 {
		t.Fatalf("the source got %d opens, %d ranges, %d stats; want 1 open (the cache's fetch) and nothing else", opens, fake.ranges, stats)
	}
	if _, err := c.OpenAt(context.Background(), info, -1, 1); err == nil {
		t.Fatal("a negative offset was served")
	}
}
