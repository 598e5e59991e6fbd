package integration

import (
	"bytes"
	"context"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awss3 "github.com/aws/aws-sdk-go-v2/service/s3"

	sl "github.com/shardload/shardload"
	"github.com/shardload/shardload/index"
	"github.com/shardload/shardload/internal/shardgen"
	"github.com/shardload/shardload/internal/testutil"
	"github.com/shardload/shardload/source"
	s3src "github.com/shardload/shardload/source/s3"
)

// aisFront stands in for an AIStore cluster whose bucket has MinIO as its remote S3
// backend: AIStore cannot be built here (the module proxy refuses its module), so
// this serves MinIO's objects the way AIStore's S3 API does, as read in its docs
// and code (docs/aistore.md has the table):
//   - S3 only under /s3 on the gateway (ais/proxy.go registers "/s3"); any other
//     path is refused; the bucket is the first path element (path-style only);
//   - every object request (GET, HEAD, PUT) answered by the gateway with a 307 whose
//     Location is the target holding the object, with signed query parameters
//     (ais/prxs3.go s3Redirect); the target refuses requests without them;
//   - the target keeps what it fetched: a cold GET reads the whole object from the
//     backend once, later GETs are warm; PUT writes through to the backend;
//   - headers (ais/s3/types.go SetS3Headers): ETag quoted, Last-Modified, no
//     x-amz-version-id; a single Range answered 206 with Content-Range, one past the
//     end 416 "bytes */size"; If-Match ignored (nothing in AIStore reads it);
//   - ListObjectsV2 answered by the gateway in one response however many pages
//     (lsAllPagesS3), ETags unquoted and multipart ETags left out (entryToS3,
//     awsEncodeCksum), LastModified in RFC 3339 seconds, IsTruncated false;
//   - no signature checked (AuthN off, the default): the client's keys are not
//     the backend's;
//   - 429 from the gateway's front-end rate limit, here the first request for each
//     throttled key.
type aisFront struct {
	backend *awss3.Client
	bucket  string // the one bucket it serves (a remote s3:// bucket added to AIStore)
	gw, tgt *httptest.Server

	mu       sync.Mutex
	inClust  map[string]*aisObject // key -> object kept in the cluster
	throttle map[string]bool       // keys whose next gateway request gets a 429
	counts   map[string]int        // what happened, by name
}

// aisObject is an object kept in the cluster, with its backend's metadata.
type aisObject struct {
	data    []byte
	etag    string // unquoted, as AIStore keeps it
	modTime time.Time
}

func newAISFront(t *testing.T, m *testutil.MinIOServer, bucket string) *aisFront {
	a := &aisFront{backend: m.Client, bucket: bucket, inClust: map[string]*aisObject{}, throttle: map[string]bool{}, counts: map[string]int{}}
	a.tgt = httptest.NewServer(http.HandlerFunc(a.target))
	a.gw = httptest.NewServer(http.HandlerFunc(a.gateway))
	t.Cleanup(a.gw.Close)
	t.Cleanup(a.tgt.Close)
	return a
}

func (a *aisFront) count(name string) {
	a.mu.Lock()
	a.counts[name]++
	a.mu.Unlock()
}

func (a *aisFront) get(name string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.counts[name]
}

// s3Error writes an S3 error document, as ais/s3/err.go WriteErr does.
func s3Error(w http.ResponseWriter, r *http.Request, status int, code string) {
	w.Header().Set("Content-Type", "application/xml")
	w.WriteHeader(status)
	if r.Method != http.MethodHead {
		fmt.Fprintf(w, `<?xml version="1.0" encoding="UTF-8"?>`+"\n"+`<Error><Code>%s</Code><Message>%s</Message><Resource>%s</Resource><RequestId></RequestId></Error>`,
			code, http.StatusText(status), r.URL.Path)
	}
}

// split returns the bucket and key of an S3 path under /s3, ok false for any
// other path.
func split(path string) (bucket, key string, ok bool) {
	rest, ok := strings.CutPrefix(path, "/s3/")
	if !ok {
		return "", "", false
	}
	bucket, key, _ = strings.Cut(rest, "/")
	return bucket, key, bucket != ""
}

func (a *aisFront) gateway(w http.ResponseWriter, r *http.Request) {
	bucket, key, ok := split(r.URL.Path)
	if !ok {
		a.count("not under /s3")
		s3Error(w, r, http.StatusBadRequest, "InvalidRequest")
		return
	}
	if bucket != a.bucket {
		s3Error(w, r, http.StatusNotFound, "NoSuchBucket")
		return
	}
	if key == "" {
		if r.Method != http.MethodGet || r.URL.Query().Get("list-type") != "2" {
			s3Error(w, r, http.StatusNotImplemented, "NotImplemented")
			return
		}
		a.list(w, r)
		return
	}
	a.mu.Lock()
	throttled := a.throttle[key]
	delete(a.throttle, key)
	a.mu.Unlock()
	if throttled {
		a.count("429")
		s3Error(w, r, http.StatusTooManyRequests, "TooManyRequests")
		return
	}
	a.count("redirect " + r.Method)
	q := r.URL.Query()
	q.Set("pid", "gw1")
	q.Set("utm", strconv.FormatInt(time.Now().UnixNano(), 10))
	q.Set("svgrp", "signed")
	w.Header().Set("Location", a.tgt.URL+r.URL.EscapedPath()+"?"+q.Encode())
	w.Header().Set("Content-Type", "text/xml; charset=utf-8")
	w.Header().Set("Server", "AIStore")
	w.WriteHeader(http.StatusTemporaryRedirect)
	fmt.Fprintf(w, `<?xml version="1.0" encoding="UTF-8"?><Error><Code>TemporaryRedirect</Code><Message>Redirect</Message><Endpoint>%s</Endpoint><Bucket>%s</Bucket></Error>`,
		strings.TrimPrefix(a.tgt.URL, "http://")+"/s3", bucket)
}

// aisList is AIStore's ListObjectsV2 answer (ais/s3/types.go ListObjectResult).
type aisList struct {
	XMLName               xml.Name      `xml:"ListBucketResult"`
	Ns                    string        `xml:"xmlns,attr"`
	Name                  string        `xml:"Name"`
	Prefix                string        `xml:"Prefix"`
	ContinuationToken     string        `xml:"ContinuationToken"`
	NextContinuationToken string        `xml:"NextContinuationToken,omitempty"`
	Contents              []aisListObj  `xml:"Contents"`
	CommonPrefixes        []aisListPref `xml:"CommonPrefixes,omitempty"`
	KeyCount              int           `xml:"KeyCount"`
	MaxKeys               int           `xml:"MaxKeys"`
	IsTruncated           bool          `xml:"IsTruncated"`
}

type aisListObj struct {
	Key          string `xml:"Key"`
	LastModified string `xml:"LastModified"`
	ETag         string `xml:"ETag"`
	Class        string `xml:"StorageClass"`
	Size         int64  `xml:"Size"`
}

type aisListPref struct {
	Prefix string `xml:"Prefix"`
}

// list answers a ListObjectsV2 with every page of the backend's listing at once.
func (a *aisFront) list(w http.ResponseWriter, r *http.Request) {
	a.count("list")
	q := r.URL.Query()
	in := &awss3.ListObjectsV2Input{Bucket: aws.String(a.bucket), Prefix: aws.String(q.Get("prefix"))}
	if q.Get("delimiter") != "" {
		in.Delimiter = aws.String("/")
	}
	res := aisList{Ns: "http://s3.amazonaws.com/doc/2006-03-01", Name: a.bucket, Prefix: q.Get("prefix"),
		ContinuationToken: q.Get("continuation-token"), MaxKeys: 1000}
	pages := awss3.NewListObjectsV2Paginator(a.backend, in)
	for pages.HasMorePages() {
		page, err := pages.NextPage(r.Context())
		if err != nil {
			s3Error(w, r, http.StatusInternalServerError, "InternalError")
			return
		}
		for _, o := range page.Contents {
			etag := strings.Trim(aws.ToString(o.ETag), `"`)
			if strings.Contains(etag, "-") {
				etag = "" // a multipart ETag is no checksum: left out
			}
			res.Contents = append(res.Contents, aisListObj{Key: aws.ToString(o.Key), ETag: etag, Size: aws.ToInt64(o.Size),
				LastModified: aws.ToTime(o.LastModified).UTC().Format(time.RFC3339)})
		}
		for _, p := range page.CommonPrefixes {
			res.CommonPrefixes = append(res.CommonPrefixes, aisListPref{Prefix: aws.ToString(p.Prefix)})
		}
	}
	res.KeyCount = len(res.Contents)
	w.Header().Set("Content-Type", "application/xml")
	io.WriteString(w, xml.Header)
	xml.NewEncoder(w).Encode(res)
}

func (a *aisFront) target(w http.ResponseWriter, r *http.Request) {
	bucket, key, ok := split(r.URL.Path)
	if !ok || r.URL.Query().Get("svgrp") != "signed" {
		a.count("unsigned at target")
		s3Error(w, r, http.StatusForbidden, "AccessDenied")
		return
	}
	if bucket != a.bucket || key == "" {
		s3Error(w, r, http.StatusBadRequest, "InvalidRequest")
		return
	}
	switch r.Method {
	case http.MethodPut:
		a.put(w, r, key)
	case http.MethodHead, http.MethodGet:
		a.read(w, r, key)
	default:
		s3Error(w, r, http.StatusMethodNotAllowed, "MethodNotAllowed")
	}
}

// put writes the object through to the backend and keeps it.
func (a *aisFront) put(w http.ResponseWriter, r *http.Request, key string) {
	data, err := io.ReadAll(r.Body)
	if err != nil || r.ContentLength >= 0 && int64(len(data)) != r.ContentLength {
		s3Error(w, r, http.StatusBadRequest, "IncompleteBody")
		return
	}
	out, err := a.backend.PutObject(r.Context(), &awss3.PutObjectInput{Bucket: aws.String(a.bucket), Key: aws.String(key), Body: bytes.NewReader(data)})
	if err != nil {
		s3Error(w, r, http.StatusInternalServerError, "InternalError")
		return
	}
	o := &aisObject{data: data, etag: strings.Trim(aws.ToString(out.ETag), `"`), modTime: time.Now().UTC().Truncate(time.Second)}
	a.mu.Lock()
	a.inClust[key] = o
	a.counts["put"]++
	a.mu.Unlock()
	w.Header().Set("ETag", `"`+o.etag+`"`)
}

// read serves HEAD and GET: from the cluster when the object is there, else a cold
// HEAD (the backend's metadata, nothing kept) or a cold GET (the whole object read
// from the backend and kept).
func (a *aisFront) read(w http.ResponseWriter, r *http.Request, key string) {
	a.mu.Lock()
	o := a.inClust[key]
	a.mu.Unlock()
	h := w.Header()
	if o == nil && r.Method == http.MethodHead {
		a.count("cold HEAD")
		out, err := a.backend.HeadObject(r.Context(), &awss3.HeadObjectInput{Bucket: aws.String(a.bucket), Key: aws.String(key)})
		if err != nil {
			s3Error(w, r, http.StatusNotFound, "NoSuchKey")
			return
		}
		h.Set("ETag", `"`+strings.Trim(aws.ToString(out.ETag), `"`)+`"`)
		h.Set("Last-Modified", aws.ToTime(out.LastModified).UTC().Format(http.TimeFormat))
		h.Set("Content-Length", strconv.FormatInt(aws.ToInt64(out.ContentLength), 10))
		return
	}
	if o == nil {
		out, err := a.backend.GetObject(r.Context(), &awss3.GetObjectInput{Bucket: aws.String(a.bucket), Key: aws.String(key)})
		if err != nil {
			s3Error(w, r, http.StatusNotFound, "NoSuchKey")
			return
		}
		data, err := io.ReadAll(out.Body)
		out.Body.Close()
		if err != nil {
			s3Error(w, r, http.StatusInternalServerError, "InternalError")
			return
		}
		o = &aisObject{data: data, etag: strings.Trim(aws.ToString(out.ETag), `"`), modTime: aws.ToTime(out.LastModified)}
		a.mu.Lock()
		if a.inClust[key] == nil {
			a.inClust[key] = o
			a.counts["cold GET"]++
		}
		o = a.inClust[key]
		a.mu.Unlock()
	} else if r.Method == http.MethodGet {
		a.count("warm GET")
	}
	size := int64(len(o.data))
	h.Set("ETag", `"`+o.etag+`"`)
	h.Set("Last-Modified", o.modTime.UTC().Format(http.TimeFormat))
	h.Set("Content-Type", "application/octet-stream")
	if r.Method == http.MethodHead {
		h.Set("Content-Length", strconv.FormatInt(size, 10))
		return
	}
	rng := r.Header.Get("Range")
	if rng == "" {
		h.Set("Content-Length", strconv.FormatInt(size, 10))
		w.Write(o.data)
		return
	}
	from, to, err := parseRange(rng, size)
	if err != nil {
		h.Set("Content-Range", fmt.Sprintf("bytes */%d", size))
		s3Error(w, r, http.StatusRequestedRangeNotSatisfiable, "InvalidRange")
		return
	}
	a.count("ranged GET")
	h.Set("Accept-Ranges", "bytes")
	h.Set("Content-Range", fmt.Sprintf("bytes %d-%d/%d", from, to, size))
	h.Set("Content-Length", strconv.FormatInt(to-from+1, 10))
	w.WriteHeader(http.StatusPartialContent)
	w.Write(o.data[from : to+1])
}

// parseRange parses one "bytes=a-b", "bytes=a-" or "bytes=-n" range of an object
// of size bytes; more than one range is refused, as AIStore does.
func parseRange(rng string, size int64) (from, to int64, err error) {
	spec, ok := strings.CutPrefix(rng, "bytes=")
	if !ok || strings.Contains(spec, ",") {
		return 0, 0, errors.New("unsupported range")
	}
	a, b, _ := strings.Cut(spec, "-")
	switch {
	case a == "":
		n, err := strconv.ParseInt(b, 10, 64)
		if err != nil || n <= 0 {
			return 0, 0, errors.New("bad range")
		}
		return max(size-n, 0), size - 1, nil
	default:
		if from, err = strconv.ParseInt(a, 10, 64); err != nil {
			return 0, 0, err
		}
		to = size - 1
		if b != "" {
			if to, err = strconv.ParseInt(b, 10, 64); err != nil || to < from {
				return 0, 0, errors.New("bad range")
			}
			to = min(to, size-1)
		}
	}
	if from >= size {
		return 0, 0, errors.New("range past the end")
	}
	return from, to, nil
}

// aisEnv is the environment a user sets to read through AIStore's S3 API: its
// gateway's /s3 endpoint, path-style (shardload's default with an endpoint), and
// keys AIStore does not check (with AuthN off), here not the backend's own.
func aisEnv(a *aisFront) []string {
	return []string{
		"AWS_ENDPOINT_URL=" + a.gw.URL + "/s3",
		"AWS_ACCESS_KEY_ID=ais", "AWS_SECRET_ACCESS_KEY=ais-does-not-check",
		"AWS_REGION=us-east-1", "AWS_EC2_METADATA_DISABLED=true",
	}
}

// TestAIStoreCompat runs shardload over MinIO behind aisFront, an AIStore stand-in
// at http://gateway/s3: "shardload index" lists, reads and writes the index beside
// the shards through it (the PUT following the gateway's redirect), and a loader
// epoch then delivers every sample exactly once, byte for byte, with its reads
// pinned to the versions the listing gave. Each shard is fetched from the backend
// once (a cold GET) and served warm after; a 429 on some shards is retried; no
// request loses the /s3 prefix or reaches a target without the gateway's redirect.
func TestAIStoreCompat(t *testing.T) {
	m := testutil.MinIO(t)
	m.CreateBucket(t, "remote")
	const shards, samples = 20, 6 // 16 or more in a directory: versions come from a listing
	spec := shardgen.Spec{Shards: shards, SamplesPerShard: samples, Seed: 51,
		Fields: []shardgen.Field{{Ext: "bin", Kind: shardgen.Random, MinBytes: 200, MaxBytes: 3000}, {Ext: "cls", Kind: shardgen.Class}}}
	paths, _ := putShards(t, m, "remote", "ds", "", spec)
	want := membersOf(t, paths, "bin")
	if len(want) != shards*samples {
		t.Fatalf("%d samples in the shards, want %d", len(want), shards*samples)
	}
	a := newAISFront(t, m, "remote")
	env := aisEnv(a)
	pattern := "s3://remote/ds/" + spec.Pattern()

	// The index, written beside the shards through the gateway: a PUT it redirects.
	ok(t, env, "index", "--output", "s3://remote/ds/", pattern)
	if a.get("put") != 1 {
		t.Fatalf("%d PUTs reached a target, want the index's 1 (counts %v)", a.get("put"), a.counts)
	}
	if _, err := m.Client.HeadObject(t.Context(), &awss3.HeadObjectInput{Bucket: aws.String("remote"), Key: aws.String("ds/" + index.FileName)}); err != nil {
		t.Fatalf("the index is not in the backend bucket: %v", err)
	}
	coldAfterIndex := a.get("cold GET")
	if coldAfterIndex != shards {
		t.Errorf("indexing made %d cold GETs, want one per shard (%d)", coldAfterIndex, shards)
	}

	// The epoch, in this process, through a zero s3.Source configured from the
	// environment as the command's is; every fourth shard is answered 429 once.
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		t.Setenv(k, v)
	}
	for _, k := range []string{"AWS_ENDPOINT_URL_S3", "AWS_SESSION_TOKEN", "AWS_PROFILE", "SHARDLOAD_S3_PATH_STYLE"} {
		t.Setenv(k, "")
		os.Unsetenv(k)
	}
	t.Setenv("AWS_CONFIG_FILE", os.DevNull)
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", os.DevNull)
	throttled := 0
	a.mu.Lock()
	for i, p := range paths {
		if i%4 == 0 {
			a.throttle["ds/"+p[strings.LastIndexByte(p, '/')+1:]] = true
			throttled++
		}
	}
	a.mu.Unlock()
	reg := &source.Registry{}
	s3src.Register(reg, source.FetchOptions{})
	var logMu sync.Mutex
	var logs []string
	retries0, _ := source.Retries()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	cfg := sl.Config{URLs: []string{pattern}, Fields: fields(t, "bin", "cls:int"), Seed: 5, BatchSize: 8,
		NoIndexStore: true, Sources: reg, OpenShards: 4, ShuffleBuffer: 32, ShuffleBytes: 4 << 20, Workers: 2, Memory: 64 << 20, NoLock: true, NoAutotune: true,
		Logf: func(format string, args ...any) {
			logMu.Lock()
			logs = append(logs, fmt.Sprintf(format, args...))
			logMu.Unlock()
		}}
	l, err := sl.Open(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]int{}
	for b, err := range l.All(ctx) {
		if err != nil {
			l.Close()
			t.Fatalf("epoch: %v (through the stand-in: %v)", err, a.counts)
		}
		col, found := b.Column("bin")
		if !found {
			t.Fatal("no column bin")
		}
		for row, key := range b.Keys() {
			if got := col.Row(b.Data(), row); !bytes.Equal(got, want[key]) {
				t.Errorf("sample %s: %d bytes unlike the shard's %d", key, len(got), len(want[key]))
			}
			seen[key]++
		}
		b.Release()
	}
	l.Close()
	retries1, _ := source.Retries()

	for key := range want {
		if seen[key] != 1 {
			t.Errorf("sample %s delivered %d times, want once", key, seen[key])
		}
	}
	if len(seen) != len(want) {
		t.Errorf("%d distinct samples delivered, want %d", len(seen), len(want))
	}
	for _, line := range logs {
		if strings.Contains(line, "changed") || strings.Contains(line, "no index") {
			t.Errorf("the loader did not trust the index read through the stand-in: %s", line)
		}
	}
	t.Logf("through the stand-in: %v; %d retries in the epoch", a.counts, retries1-retries0)
	switch {
	case a.get("not under /s3") != 0:
		t.Errorf("%d requests left out the /s3 prefix", a.get("not under /s3"))
	case a.get("unsigned at target") != 0:
		t.Errorf("%d requests reached a target without the gateway's redirect", a.get("unsigned at target"))
	case a.get("cold GET") != shards:
		t.Errorf("%d cold GETs in all, want one per shard (%d): the epoch should read the cluster's copies", a.get("cold GET"), shards)
	case a.get("429") != throttled || retries1-retries0 < int64(throttled):
		t.Errorf("%d answered 429 (want %d), %d retries: each should be retried", a.get("429"), throttled, retries1-retries0)
	case a.get("ranged GET") == 0 || a.get("list") == 0:
		t.Errorf("no ranged reads or no listing through the stand-in: the test shows nothing (%v)", a.counts)
	}
}
