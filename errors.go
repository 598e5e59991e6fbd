package shardload

// The loader's errors: its sentinels, for errors.Is, and its error types, for errors.As.

import (
	"errors"

	"github.com/shardload/shardload/index"
	"github.com/shardload/shardload/internal/budget"
	"github.com/shardload/shardload/internal/pipeline"
)

var (
	// ErrStartTimeout means Open's planning did not finish within Config.StartTimeout:
	// the store did not answer, or kept refusing or throttling.
	ErrStartTimeout = index.ErrStartTimeout

	// ErrEstimated means a job of several ranks would plan its epoch from estimated
	// sample counts without Config.AllowEstimate.
	ErrEstimated = errors.New("shardload: no exact sample counts for a job of several ranks")

	// ErrResume means a State cannot resume the loader: it was saved under another
	// order, or it does not fit the epoch.
	ErrResume = pipeline.ErrResume

	// ErrEmpty means the shards hold no samples.
	ErrEmpty = pipeline.ErrNoSample

	// ErrMemory means a Config's settings need more memory than its budget
	// (Config.Memory).
	ErrMemory = budget.ErrMemory

	// ErrClosed is returned by Next after Close.
	ErrClosed = pipeline.ErrClosed

	// ErrPanic is wrapped by the error of a loader whose goroutine panicked: in a Source,
	// a decoder or the loader itself. The error says where, with the stack.
	ErrPanic = pipeline.ErrPanic

	// ErrMissingField means a sample lacks a configured field.
	ErrMissingField = pipeline.ErrMissingField

	// ErrCountMismatch means a shard holds another number of samples than the counts
	// the epoch was planned from (Config.Shards, Config.Index or the counting pass).
	ErrCountMismatch = pipeline.ErrCountMismatch

	// ErrErrorBudget means the Skip policy left out more than Config.ErrorBudget.
	ErrErrorBudget = pipeline.ErrErrorBudget
)

// SampleError is a sample that could not be decoded: a missing field, a wrong shape, a
// label that is not a number. Match it with errors.As; Err is the cause, which
// errors.Is matches against ErrMissingField, decode.ErrWrongShape and the like.
type SampleError = pipeline.SampleError

// CountError is an ErrCountMismatch found in one shard, with the shard's URL as the
// plan has it: a loader process (serve) fails every session planned from the same
// count of that shard at once, found by any of them.
type CountError = pipeline.CountError

// BatchError is the error of CheckBatch (and of Open) for a batch too large for the
// slabs: its size, the limit or budget it exceeds, and the largest batch that fits.
type BatchError = budget.BatchError
