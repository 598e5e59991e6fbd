package serve

import (
	"bytes"
	"context"
	"io"
	"strings"
	"testing"

	"github.com/shardload/shardload/cache"
	"github.com/shardload/shardload/source"
)

// oneObject is a source of one object.
type oneObject []byte

func (o oneObject) Stat(_ context.Context, url string) (source.Info, error) {
	return source.Info{URL: url, Size: int64(len(o)), Version: "v1"}, nil
}

func (o oneObject) Open(context.Context, string) (io.ReadCloser, error) {
	return io.NopCloser(bytes.NewReader(o)), nil
}

// A session's reads carry its tally: each epoch's figures are the bytes since the
// last epoch's end, the first from the store, the second from the disk tier.
func TestSessionEpochCache(t *testing.T) {
	c, err := cache.New(cache.Options{Dir: t.TempDir(), DiskBytes: 1 << 20, Logf: t.Logf}, oneObject(bytes.Repeat([]byte("x"), 5000)))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var tally sessionTally
	ctx := tally.reads(t.Context())
	var got []cache.Bytes
	for range 2 {
		r, err := c.Open(ctx, "s3://b/a.tar")
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, r)
		r.Close()
		got = append(got, tally.epochCache())
	}
	if got[0] != (cache.Bytes{Store: 5000}) || got[1] != (cache.Bytes{Disk: 5000}) {
		t.Errorf("epochs %v, want 5000 bytes from the store, then from disk", got)
	}
	if s := cacheFigures(tally.cache.Bytes()); !strings.Contains(s, "from the store") || !strings.Contains(s, "hit rate 50.0%") {
		t.Errorf("cacheFigures: %q", s)
	}
	if s := cacheFigures(cache.Bytes{}); s != "" {
		t.Errorf("cacheFigures of nothing: %q", s)
	}
}
