package source

import "testing"

// A presigned URL's query is no glob: "?" starts a query in http(s) URLs only.
func TestIsListPattern(t *testing.T) {
	for u, want := range map[string]bool{
		"https://h/b/k.tar?X-Amz-Signature=abc":    false,
		"https://h/b/train-*.tar?sig=1":            true,
		"https://h/b/dir/?sig=1":                   true,
		"http://h/b/k.tar#frag?":                   false,
		"s3://bucket/train-?.tar":                  true,
		"s3://bucket/train-0.tar":                  false,
		"s3://bucket/train/":                       true,
		"/data/train-[01].tar":                     true,
		"gs://bucket/k.tar":                        false,
		"https://h/b/k-[0-9].tar?X-Goog-Signature": true,
	} {
		if got := IsListPattern(u); got != want {
			t.Errorf("IsListPattern(%q) = %v, want %v", u, got, want)
		}
	}
}

// ListerOf sees through a Fetcher: it lists only when what it wraps lists.
func TestListerOf(t *testing.T) {
	if ListerOf(&File{}) == nil || ListerOf(NewFetcher(&File{}, FetchOptions{})) == nil {
		t.Error("File, alone or behind a Fetcher, does not list")
	}
	var plain struct{ Source }
	plain.Source = &File{}
	if ListerOf(plain) != nil || ListerOf(NewFetcher(plain, FetchOptions{})) != nil {
		t.Error("a Source without List lists")
	}
}

func TestSplitBucket(t *testing.T) {
	for _, tt := range []struct{ url, scheme, bucket, key string }{
		{"s3://b/train/x.tar", "s3", "b", "train/x.tar"},
		{"S3://b/x.tar", "s3", "b", "x.tar"},
		{"gs://b/o", "gs", "b", "o"},
		{"s3://b/", "s3", "", ""},
		{"s3://b", "s3", "", ""},
		{"gs://b/o", "s3", "", ""},
		{"/data/x.tar", "s3", "", ""},
	} {
		b, k, err := SplitBucket(tt.url, tt.scheme)
		if b != tt.bucket || k != tt.key || (err == nil) != (tt.bucket != "") {
			t.Errorf("SplitBucket(%q, %q) = %q, %q, %v", tt.url, tt.scheme, b, k, err)
		}
	}
}
