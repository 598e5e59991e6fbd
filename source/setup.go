package source

import "context"

// ErrBucketNotFound means the bucket a URL names does not exist (S3's NoSuchBucket,
// GCS's bucket-not-exist). It is also ErrNotFound: errors.Is matches both.
var ErrBucketNotFound error = bucketNotFound{}

type bucketNotFound struct{}

func (bucketNotFound) Error() string { return "source: bucket not found" }

// Is makes ErrBucketNotFound match ErrNotFound too.
func (bucketNotFound) Is(target error) bool { return target == ErrNotFound }

// Describer is the optional capability of a Source to say where the requests for a
// URL go and with which credentials, for a message that helps fix a setup: for S3,
// "endpoint http://127.0.0.1:9000 (from AWS_ENDPOINT_URL), region us-east-1,
// credentials from the environment (AWS_ACCESS_KEY_ID)". It may look the credentials
// up (under ctx) but sends no request for the object. A secret is never part of it.
type Describer interface {
	Describe(ctx context.Context, url string) string
}

// Describe returns what the Source that serves url through src says of where its
// requests go (see Describer), following Resolvers (a Registry) and Wrappers (a
// Fetcher); "" when none can say.
func Describe(ctx context.Context, src Source, url string) string {
	for src != nil {
		if d, ok := src.(Describer); ok {
			return d.Describe(ctx, url)
		}
		if r, ok := src.(Resolver); ok {
			next, err := r.Lookup(url)
			if err != nil || next == src {
				return ""
			}
			src = next
			continue
		}
		w, ok := src.(Wrapper)
		if !ok {
			return ""
		}
		src = w.Unwrap()
	}
	return ""
}
