package s3

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/shardload/shardload/source"
)

// fakeAIS is an AIStore cluster in miniature, as its S3 API behaves (docs/aistore.md):
// a gateway that serves S3 under /s3 only, lists by itself (ETags unquoted) and
// answers every object request with a 307 to a target, and a target that serves
// objects (ETags quoted, If-Match ignored) only to requests that carry the
// gateway's signed query.
type fakeAIS struct {
	gw, tgt *httptest.Server

	mu      sync.Mutex
	objects map[string][]byte // "bucket/key" -> data
	etags   map[string]string // unquoted
	puts    int
}

func newFakeAIS(t *testing.T) *fakeAIS {
	a := &fakeAIS{objects: map[string][]byte{}, etags: map[string]string{}}
	a.tgt = httptest.NewServer(http.HandlerFunc(a.target))
	a.gw = httptest.NewServer(http.HandlerFunc(a.gateway))
	t.Cleanup(a.gw.Close)
	t.Cleanup(a.tgt.Close)
	return a
}

func (a *fakeAIS) put(name string, data []byte, etag string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.objects[name], a.etags[name] = data, etag
}

func (a *fakeAIS) gateway(w http.ResponseWriter, r *http.Request) {
	rest, ok := strings.CutPrefix(r.URL.Path, "/s3/")
	if !ok {
		http.Error(w, "not the S3 API", http.StatusBadRequest)
		return
	}
	bucket, prefixKey, _ := strings.Cut(rest, "/")
	if prefixKey == "" && r.Method == http.MethodGet {
		a.list(w, bucket, r.URL.Query().Get("prefix"))
		return
	}
	w.Header().Set("Location", a.tgt.URL+r.URL.Path+"?pid=p1&utm=1&sig=ok")
	w.WriteHeader(http.StatusTemporaryRedirect)
}

func (a *fakeAIS) list(w http.ResponseWriter, bucket, prefix string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	var b strings.Builder
	b.WriteString(`<?xml version="1.0" encoding="UTF-8"?><ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01"><Name>` + bucket + `</Name><Prefix>` + prefix + `</Prefix><ContinuationToken></ContinuationToken>`)
	n := 0
	for name, data := range a.objects {
		key, ok := strings.CutPrefix(name, bucket+"/")
		if !ok || !strings.HasPrefix(key, prefix) {
			continue
		}
		n++
		fmt.Fprintf(&b, `<Contents><Key>%s</Key><LastModified>2026-01-02T03:04:05Z</LastModified><ETag>%s</ETag><StorageClass></StorageClass><Size>%d</Size></Contents>`,
			key, a.etags[name], len(data))
	}
	fmt.Fprintf(&b, `<KeyCount>%d</KeyCount><MaxKeys>1000</MaxKeys><IsTruncated>false</IsTruncated></ListBucketResult>`, n)
	w.Header().Set("Content-Type", "application/xml")
	io.WriteString(w, b.String())
}

func (a *fakeAIS) target(w http.ResponseWriter, r *http.Request) {
	name, ok := strings.CutPrefix(r.URL.Path, "/s3/")
	if !ok || r.URL.Query().Get("sig") != "ok" {
		http.Error(w, "unsigned request", http.StatusForbidden)
		return
	}
	if r.Method == http.MethodPut {
		data, err := io.ReadAll(r.Body)
		if err != nil || int64(len(data)) != r.ContentLength {
			http.Error(w, "short body", http.StatusBadRequest)
			return
		}
		a.mu.Lock()
		a.puts++
		a.mu.Unlock()
		a.put(name, data, fmt.Sprintf("v1-%x", len(data)))
		w.Header().Set("ETag", `"`+a.etags[name]+`"`)
		return
	}
	a.mu.Lock()
	data, found := a.objects[name]
	etag := a.etags[name]
	a.mu.Unlock()
	if !found {
		http.Error(w, "NoSuchKey", http.StatusNotFound)
		return
	}
	h := w.Header()
	h.Set("ETag", `"`+etag+`"`)
	h.Set("Last-Modified", "Fri, 02 Jan 2026 03:04:05 GMT")
	h.Set("Accept-Ranges", "bytes")
	if r.Method == http.MethodHead {
		h.Set("Content-Length", strconv.Itoa(len(data)))
		return
	}
	var from, to int
	if _, err := fmt.Sscanf(r.Header.Get("Range"), "bytes=%d-%d", &from, &to); err != nil || from > to || from >= len(data) {
		http.Error(w, "range", http.StatusRequestedRangeNotSatisfiable)
		return
	}
	to = min(to, len(data)-1)
	h.Set("Content-Length", strconv.Itoa(to-from+1))
	h.Set("Content-Range", fmt.Sprintf("bytes %d-%d/%d", from, to, len(data)))
	w.WriteHeader(http.StatusPartialContent)
	w.Write(data[from : to+1])
}

// TestAIStoreS3API: through an AIStore-like gateway at http://host/s3, Stat, List
// and OpenVersion agree on versions (AIStore lists ETags unquoted, sends them quoted
// in headers, ignores If-Match), a changed object still fails with ErrChanged, and
// Create's PutObject follows the gateway's redirect.
func TestAIStoreS3API(t *testing.T) {
	isolateAWS(t)
	a := newFakeAIS(t)
	t.Setenv("AWS_ENDPOINT_URL", a.gw.URL+"/s3")
	t.Setenv("AWS_ACCESS_KEY_ID", "any")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "any")
	data := []byte("0123456789abcdef")
	a.put("b/ds/s-0.tar", data, "0f343b0931126a20f133d67c2b018a3b")
	s := &Source{}
	ctx := t.Context()

	info, err := s.Stat(ctx, "s3://b/ds/s-0.tar")
	if err != nil || info.Size != int64(len(data)) || info.Version != `"0f343b0931126a20f133d67c2b018a3b"` {
		t.Fatalf("Stat = %+v, %v", info, err)
	}
	var listed []source.Info
	if err := s.List(ctx, "s3://b/ds/", func(i source.Info) error { listed = append(listed, i); return nil }); err != nil {
		t.Fatal(err)
	}
	if len(listed) != 1 || listed[0].URL != info.URL || listed[0].Version != info.Version || listed[0].Size != info.Size {
		t.Fatalf("List = %+v; Stat gave %+v", listed, info)
	}
	r, err := s.OpenVersion(ctx, info.URL, listed[0].Version, 4, 6)
	if err != nil {
		t.Fatalf("OpenVersion at the listed version: %v", err)
	}
	got, err := io.ReadAll(r)
	r.Close()
	if err != nil || !bytes.Equal(got, data[4:10]) {
		t.Fatalf("OpenVersion read %q, %v; want %q", got, err, data[4:10])
	}

	// Overwritten: AIStore ignores If-Match, the ETag it answers with tells.
	a.put("b/ds/s-0.tar", data, "ffff")
	if _, err := s.OpenVersion(ctx, info.URL, info.Version, 0, 4); !errors.Is(err, source.ErrChanged) {
		t.Fatalf("OpenVersion of an overwritten object: %v, want ErrChanged", err)
	}

	w, err := s.Create(ctx, "s3://b/ds/index")
	if err != nil {
		t.Fatal(err)
	}
	w.Write([]byte("an index"))
	if err := w.Close(); err != nil {
		t.Fatalf("Create through a redirect: %v", err)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.puts != 1 || string(a.objects["b/ds/index"]) != "an index" {
		t.Fatalf("%d PUTs reached the target, object %q", a.puts, a.objects["b/ds/index"])
	}
}

func TestQuoteETag(t *testing.T) {
	for in, want := range map[string]string{
		"": "", "abc": `"abc"`, `"abc"`: `"abc"`, `"abc-3"`: `"abc-3"`, `W/"abc"`: `W/"abc"`,
	} {
		if got := quoteETag(in); got != want {
			t.Errorf("quoteETag(%q) = %q, want %q", in, got, want)
		}
	}
}
