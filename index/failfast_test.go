package index_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync/atomic"
	"testing"

	"github.com/shardload/shardload/index"
	"github.com/shardload/shardload/source"
)

// deniedStore refuses the Stat of one object and holds every other Stat until its
// context ends, as a store that answers one request with an error and leaves the
// rest hanging (throttled, or frozen) does.
type deniedStore struct {
	bad     string
	held    atomic.Int64 // Stats waiting
	stopped atomic.Int64 // Stats ended by their context
}

func (s *deniedStore) Stat(ctx context.Context, url string) (source.Info, error) {
	if url == s.bad {
		return source.Info{}, &source.Error{Op: "stat", URL: url, Err: source.ErrPermission}
	}
	s.held.Add(1)
	<-ctx.Done()
	s.stopped.Add(1)
	return source.Info{}, ctx.Err()
}

func (s *deniedStore) Open(ctx context.Context, url string) (io.ReadCloser, error) {
	return nil, &source.Error{Op: "open", URL: url, Err: source.ErrNotFound}
}

// TestLookupFailsOnFirstError: a lookup whose first failing request is refused
// returns that error at once, ending the requests still waiting, instead of waiting
// for every shard's request to end (with a store that leaves them hanging: for ever).
func TestLookupFailsOnFirstError(t *testing.T) {
	for _, quick := range []bool{false, true} {
		t.Run(fmt.Sprintf("quick=%v", quick), func(t *testing.T) {
			urls := make([]string, 40)
			for i := range urls {
				urls[i] = fmt.Sprintf("mem://bucket/train-%06d.tar", i)
			}
			st := &deniedStore{bad: urls[2]} // among the first Workers requests
			reg := &source.Registry{}
			reg.Register("mem", st)
			lk := index.Lookup{Sources: reg, NoBeside: true, Workers: 4}
			var err error
			if quick {
				_, err = lk.Quick(t.Context(), urls, 1)
			} else {
				_, err = lk.Resolve(t.Context(), urls)
			}
			if !errors.Is(err, source.ErrPermission) {
				t.Fatalf("lookup: %v, want the refusal (source.ErrPermission)", err)
			}
			if h, s := st.held.Load(), st.stopped.Load(); h != s || h > 10 {
				t.Errorf("%d Stats were held and %d of them ended: want all ended, and no more started after the refusal than workers allow", h, s)
			}
		})
	}
}
