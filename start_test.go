package shardload_test

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/shardload/shardload"
	"github.com/shardload/shardload/source"
)

// frozenStore answers nothing: every request waits until its context ends, as a
// store whose process was stopped, or an endpoint that drops packets, does.
type frozenStore struct{}

func (frozenStore) Stat(ctx context.Context, url string) (source.Info, error) {
	<-ctx.Done()
	return source.Info{}, &source.Error{Op: "stat", URL: url, Err: context.Cause(ctx)}
}

func (frozenStore) Open(ctx context.Context, url string) (io.ReadCloser, error) {
	<-ctx.Done()
	return nil, &source.Error{Op: "open", URL: url, Err: context.Cause(ctx)}
}

// TestOpenStartTimeout: a store that does not answer at start fails Open with
// ErrStartTimeout, naming the dataset and the setting, within Config.StartTimeout,
// instead of a hang; a caller's own cancellation is reported as such.
func TestOpenStartTimeout(t *testing.T) {
	reg := &source.Registry{}
	reg.Register("frozen", frozenStore{})
	cfg := shardload.Config{
		URLs: []string{"frozen://bucket/train-000000.tar", "frozen://bucket/train-000001.tar"}, Sources: reg,
		NoIndexStore: true, StartTimeout: 50 * time.Millisecond,
	}
	_, err := shardload.Open(t.Context(), cfg)
	if !errors.Is(err, shardload.ErrStartTimeout) {
		t.Fatalf("Open: %v, want ErrStartTimeout", err)
	}
	for _, want := range []string{"frozen://bucket/train-000000.tar", "--start-timeout", "50ms"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Open: %v: want %q in it", err, want)
		}
	}

	// The caller's context ending first is the caller's error, not a timeout.
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	cfg.StartTimeout = time.Hour
	if _, err := shardload.Open(ctx, cfg); errors.Is(err, shardload.ErrStartTimeout) || !errors.Is(err, context.Canceled) {
		t.Errorf("Open with a cancelled context: %v, want context.Canceled and not ErrStartTimeout", err)
	}
}
