// Package all registers every backend shardload ships: importing it makes
// source.Default serve "s3" (source/s3), "gs" (source/gcs) and "http" and "https"
// (source/httpsrc) as well as "file", each cloud backend behind a Fetcher with the
// default options. The command line uses it; a library user who reads only some
// schemes imports just those backend packages, and their binary carries no SDK it
// does not use.
package all

import (
	"github.com/shardload/shardload/source"
	"github.com/shardload/shardload/source/gcs"
	"github.com/shardload/shardload/source/httpsrc"
	"github.com/shardload/shardload/source/s3"
)

// RegisterDefaults registers the built-in backends in r: source.File for "file",
// and the S3, GCS and HTTP sources behind a Fetcher with opts for "s3", "gs",
// "http" and "https", replacing what was registered for those schemes.
func RegisterDefaults(r *source.Registry, opts source.FetchOptions) {
	r.Register("file", &source.File{})
	s3.Register(r, opts)
	gcs.Register(r, opts)
	httpsrc.Register(r, opts)
}
