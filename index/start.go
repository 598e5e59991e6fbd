package index

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/shardload/shardload/redact"
)

// ErrStartTimeout means planning did not finish within its start bound: the store
// did not answer for the dataset's objects, or kept refusing or throttling.
var ErrStartTimeout = errors.New("shardload: the dataset's store did not answer in time")

// errStart is the cause of a start bound's end.
var errStart = errors.New("start timeout")

// StartBound returns ctx bounded by d for the start of a plan (none when d <= 0),
// and the functions that end it (stop) and that lift the bound once the store has
// answered for the dataset's objects (answered, Lookup.Answered): what follows,
// counting shards the index lacks or reading a first sample, is bounded by the
// sources' retries.
func StartBound(ctx context.Context, d time.Duration) (sctx context.Context, stop, answered func()) {
	sctx, cancel := context.WithCancelCause(ctx)
	if d <= 0 {
		return sctx, func() { cancel(nil) }, func() {}
	}
	t := time.AfterFunc(d, func() { cancel(errStart) })
	return sctx, func() { t.Stop(); cancel(nil) }, func() { t.Stop() }
}

// StartError returns err of a plan's start, or ErrStartTimeout when its bound sctx
// (of d) ran out and the caller's ctx did not, naming the store of the dataset's
// first URL, what to look at, and what the store said last (err).
func StartError(ctx, sctx context.Context, first string, d time.Duration, err error) error {
	if ctx.Err() != nil || !errors.Is(context.Cause(sctx), errStart) {
		return err
	}
	return fmt.Errorf("%w: planning the epoch of %s did not finish within %v (--start-timeout of shardload serve and bench, Config.StartTimeout): check that the endpoint answers (AWS_ENDPOINT_URL, STORAGE_EMULATOR_HOST, the network), the credentials and the bucket; what the store said last: %v",
		ErrStartTimeout, redact.URL(first), d, err)
}
