package serve

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/shardload/shardload"
	"github.com/shardload/shardload/shard"
	"github.com/shardload/shardload/source"
)

// errFound stops a listing at its first object.
var errFound = errors.New("serve: found")

// Check asks the stores of the datasets a server of opts is started with whether
// they serve them, before the server listens, so that a wrong bucket, endpoint or
// credential is said at start instead of to the first trainer: a Stat of the first
// shard of the server's dataset (opts.URLs, or the first URL of each of its streams;
// a listing stopped at its first object where the URL asks for a listing) and of its
// index when one is named (Pipeline.Index). A server whose trainers name their
// datasets (opts.Allow only) has its remote prefixes listed instead, stopped at their
// first object. Requests go through src, which should reach the stores themselves,
// not a cache (nil: Pipeline.Sources, else source.Default), with its retries.
//
// All of it is bounded by timeout (0: shardload.DefaultStartTimeout, a minute;
// negative: ctx alone): a store that does not answer within it fails the check. The error is one line naming the URL, the bucket,
// where the requests went and with which credentials (source.Describe), and what to
// fix.
func Check(ctx context.Context, opts Options, src source.Source, timeout time.Duration) error {
	if timeout == 0 {
		timeout = shardload.DefaultStartTimeout
	}
	if src == nil && opts.Pipeline.Sources != nil {
		src = opts.Pipeline.Sources
	}
	if src == nil {
		src = source.Default
	}
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	var firsts []string
	urls := opts.URLs
	if len(urls) == 0 {
		urls = opts.Pipeline.URLs
	}
	if len(urls) > 0 {
		firsts = append(firsts, urls[0])
	}
	for _, st := range opts.Pipeline.Streams {
		if len(st.URLs) > 0 {
			firsts = append(firsts, st.URLs[0])
		}
	}
	for _, p := range firsts {
		u := p
		if all, err := shard.Expand(p); err == nil && len(all) > 0 {
			u = all[0]
		}
		if source.IsListPattern(u) {
			if err := checkList(ctx, src, u[:strings.LastIndex(u, "/")+1], false); err != nil {
				return checkError(ctx, src, u, "the dataset's listing", timeout, err)
			}
			continue
		}
		if _, err := src.Stat(ctx, u); err != nil {
			return checkError(ctx, src, u, "the dataset's first shard", timeout, err)
		}
	}
	if ix := opts.Pipeline.Index; ix != "" {
		if _, err := src.Stat(ctx, ix); err != nil {
			return checkError(ctx, src, ix, "the dataset's index (--index)", timeout, err)
		}
	}
	if len(firsts) == 0 {
		for _, p := range opts.Allow {
			if s := source.Scheme(p); s != "s3" && s != "gs" {
				continue // local files are checked when a trainer names them; http cannot be listed
			}
			if err := checkList(ctx, src, p, true); err != nil {
				return checkError(ctx, src, p, "an --allow prefix", timeout, err)
			}
		}
	}
	return nil
}

// checkList lists dir through src, stopped at its first object; an empty listing is
// an error unless empty is allowed.
func checkList(ctx context.Context, src source.Source, dir string, empty bool) error {
	l := source.ListerOf(src)
	if r, ok := src.(source.Resolver); ok {
		s, err := r.Lookup(dir)
		if err != nil {
			return err
		}
		l = source.ListerOf(s)
	}
	if l == nil {
		return fmt.Errorf("%s: this scheme cannot be listed", dir)
	}
	err := l.List(ctx, dir, func(source.Info) error { return errFound })
	switch {
	case errors.Is(err, errFound):
		return nil
	case err == nil && !empty:
		return fmt.Errorf("%w: no objects under %s", source.ErrNotFound, source.Redact(dir))
	}
	return err
}

// checkError says why url did not answer as it should, where its requests went, and
// what to fix, in one line.
func checkError(ctx context.Context, src source.Source, url, what string, timeout time.Duration, err error) error {
	bucket := ""
	if s := source.Scheme(url); s == "s3" || s == "gs" {
		bucket, _, _ = source.SplitBucket(url, s)
		if errors.Is(err, source.ErrNotFound) && !errors.Is(err, source.ErrBucketNotFound) && bucket != "" && ctx.Err() == nil {
			// A HEAD's 404 does not say whether the bucket or the object is missing:
			// a listing of the bucket does.
			if lerr := checkList(ctx, src, s+"://"+bucket+"/", true); errors.Is(lerr, source.ErrBucketNotFound) {
				err = lerr
			}
		}
	}
	// Where the requests went, asked with what time is left (at least a few
	// seconds: the credentials may need a request of their own).
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	where := source.Describe(dctx, src, url)
	if where == "" {
		where = "scheme " + source.Scheme(url)
	}
	var why, fix string
	switch {
	case ctx.Err() != nil:
		why = fmt.Sprintf("no answer from the store within %v", timeout)
		fix = "check that the endpoint is right and up and that this machine reaches it, or allow more time with --start-timeout"
	case errors.Is(err, source.ErrBucketNotFound):
		why = fmt.Sprintf("bucket %q not found", bucket)
		fix = "check the bucket's name in the URL, and that the endpoint and region are those of the store that holds it"
	case errors.Is(err, source.ErrNotFound):
		why = "not found"
		if bucket != "" {
			why = fmt.Sprintf("not found in bucket %q", bucket)
		}
		fix = "check the URL (its path, its brace pattern), or write the data there first"
	case errors.Is(err, source.ErrPermission):
		why = "the store refused the request (access denied or a bad signature)"
		if bucket != "" {
			why += fmt.Sprintf(" for bucket %q", bucket)
		}
		fix = "check the access key and secret key of the credential source named above, and that they may read the bucket"
	default:
		why = "the store failed"
		fix = "see the store's error"
	}
	return fmt.Errorf("serve: %s %s: %s; requests went to %s: %s (the store said: %s; --check=false starts the server without this check)",
		what, source.Redact(url), why, where, fix, oneLine(err))
}
