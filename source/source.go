// Package source reads shard objects from where they are kept. It knows nothing about
// tar or samples, and imports no cloud SDK.
//
// A Source is small and context-first: Stat an object, Open it as a stream. Optional
// capabilities are separate interfaces found by type assertion: RangeReader,
// VersionReader, Lister, Creator. A Source that wraps another (a Fetcher) is a
// Wrapper, and ListerOf and CreatorOf find whether a chain of wrappers can list or
// write.
//
// This package holds the core: the Source interface and its capabilities, the
// Registry of schemes, errors and their sentinels, retry classification, the Fetcher
// (parallel ranged parts, resumed retries, version pinning), listing, and the File
// backend for local paths, which Default serves. Each cloud backend is a package of
// its own that registers itself in Default when imported: source/s3, source/gcs and
// source/httpsrc; source/all imports them all, as the command line does. The
// conformance suite every Source passes is source/sourcetest.
//
// Every per-object failure is an *Error that names the operation and the URL, and wraps
// a cause that errors.Is can match against ErrNotFound, ErrPermission or the backend's
// own error.
package source

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/shardload/shardload/redact"
)

// Info describes one object. Size is -1 when a backend cannot tell (an HTTP server
// that sends no Content-Length).
type Info struct {
	// URL is the object's URL as given to Stat.
	URL string
	// Size is the object's length in bytes.
	Size int64
	// Version identifies the object's content where the backend knows it: an S3 ETag,
	// a GCS generation, an HTTP ETag (or Last-Modified and length when there is
	// no ETag), or a file's size and modification time. Empty when unknown. A cache
	// may key on it; VersionReader pins reads to it.
	Version string
	// ModTime is the last modification time, zero when unknown.
	ModTime time.Time
}

// Source reads objects addressed by URL. Implementations must be safe for concurrent
// use.
type Source interface {
	// Stat returns the object's size and version.
	Stat(ctx context.Context, url string) (Info, error)
	// Open returns the whole object as a stream. The stream fails with an error
	// wrapping ErrShortRead if it ends before the object's size.
	Open(ctx context.Context, url string) (io.ReadCloser, error)
}

// RangeReader is the optional capability to read part of an object.
type RangeReader interface {
	// OpenRange returns length bytes of the object starting at off. A length < 0 reads
	// to the end. Reading past the end of the object returns the bytes that exist.
	OpenRange(ctx context.Context, url string, off, length int64) (io.ReadCloser, error)
}

// Errors that causes wrapped in an *Error can be matched against with errors.Is.
var (
	// ErrNotFound means the object (or its bucket) does not exist.
	ErrNotFound = errors.New("source: object not found")
	// ErrPermission means the credentials were refused or lack access.
	ErrPermission = errors.New("source: access denied")
	// ErrUnknownScheme means no Source is registered for the URL's scheme.
	ErrUnknownScheme = errors.New("source: unknown URL scheme")
	// ErrShortRead means a stream ended before the object's size was read.
	ErrShortRead = errors.New("source: object shorter than its size")
	// ErrNotCreator means a URL's Source cannot write objects (an http(s) URL).
	ErrNotCreator = errors.New("source: writing not supported for this scheme")
)

// Error is a failure of one operation on one object.
type Error struct {
	Op  string // "stat", "open", "read", ...
	URL string
	Err error
}

func (e *Error) Error() string {
	return fmt.Sprintf("%s %s: %v", e.Op, Redact(e.URL), e.Err)
}

// Unwrap returns the cause.
func (e *Error) Unwrap() error { return e.Err }

// ErrRangeIgnored means a server answered a ranged request with the whole object
// where the backend cannot skip to the offset itself.
var ErrRangeIgnored = errors.New("source: server ignored the Range header")

// Redact returns url without its secrets (see package redact: the user information
// and the values of signature, credential and token query parameters). Errors of
// this package pass their URLs through it.
func Redact(url string) string { return redact.URL(url) }

// Wrapper is implemented by a Source that serves the objects of another Source, as a
// Fetcher does: Unwrap returns the Source it wraps. Callers reach what a wrapper
// wraps through it, never by asserting the wrapper's concrete type.
type Wrapper interface {
	Unwrap() Source
}

// Resolver is implemented by a Source that hands each URL to another Source, as a
// Registry does: Lookup returns the Source that serves url.
type Resolver interface {
	Lookup(url string) (Source, error)
}

// ListerOf returns the Lister that lists through src, or nil when src cannot list:
// src itself when it implements Lister and, if it is a Wrapper, the Source it wraps
// can list too (a Fetcher has a List method whatever it wraps).
func ListerOf(src Source) Lister {
	l, ok := src.(Lister)
	if !ok {
		return nil
	}
	if w, ok := src.(Wrapper); ok && ListerOf(w.Unwrap()) == nil {
		return nil
	}
	return l
}

// Creator is the optional capability to write an object: the File backend, S3 and
// GCS have it; HTTP does not. It is how a small object such as a dataset index is
// published beside the shards.
//
// The object appears, whole, only when Close returns nil: never half-written. A
// write that fails (a Write or Close error) or is abandoned (its ctx canceled, then
// Close) leaves the object as it was before, the previous object if there was one.
// Once a Write failed, every later Write and Close fail too, so a writer whose
// errors were ignored until Close still publishes nothing. Close of a writer whose
// ctx was canceled fails and publishes nothing; to abandon a write, cancel its ctx
// and Close. A writer must be closed, and is not safe for concurrent use; Close may
// be called more than once and returns the first call's result.
type Creator interface {
	// Create returns a writer of the object at url, replacing any object there when
	// it is closed. A URL that cannot name an object fails here, before any byte.
	Create(ctx context.Context, url string) (io.WriteCloser, error)
}

// CreatorOf returns the Creator that writes through src, or nil when src cannot
// write: src itself when it implements Creator, else, if src is a Wrapper, the
// Creator of the Source it wraps. A Fetcher is such a Wrapper: writes go to the
// backend it reads from. A cache is not in the chain: writes never go through one.
func CreatorOf(src Source) Creator {
	for src != nil {
		if c, ok := src.(Creator); ok {
			return c
		}
		w, ok := src.(Wrapper)
		if !ok {
			return nil
		}
		src = w.Unwrap()
	}
	return nil
}
