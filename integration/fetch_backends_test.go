package integration

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/shardload/shardload/internal/testutil"
)

// fetchShards are real shards served by every backend in these tests.
var fetchShards = []string{"tarproc__sample.tar", "aistore__small-mnist-3.tar"}

// TestFetchBackendsLsCat checks that ls and cat give the same results for the same
// shards on local disk, S3 (MinIO), GCS (fake-gcs-server) and HTTP, and that a
// trailing slash or a glob lists a bucket's shards.
func TestFetchBackendsLsCat(t *testing.T) {
	minio := testutil.MinIO(t)
	minio.CreateBucket(t, "shards")
	gcs := testutil.FakeGCS(t)
	gcs.CreateBucket(t, "shards")
	for _, name := range fetchShards {
		data, err := os.ReadFile(filepath.Join("../testdata", name))
		if err != nil {
			t.Fatal(err)
		}
		minio.Put(t, "shards", "train/"+name, data)
		gcs.Put(t, "shards", "train/"+name, data)
	}
	web := httptest.NewServer(http.FileServer(http.Dir("../testdata")))
	defer web.Close()
	env := append(minio.Env(), gcs.Env()...)

	bases := map[string]string{
		"file": "../testdata/",
		"s3":   "s3://shards/train/",
		"gs":   "gs://shards/train/",
		"http": web.URL + "/",
	}
	var wantSummary []string
	var wantCat []byte
	for _, scheme := range []string{"file", "s3", "gs", "http"} {
		var urls []string
		for _, name := range fetchShards {
			urls = append(urls, bases[scheme]+name)
		}
		t.Run(scheme, func(t *testing.T) {
			summary := summaries(t, ok(t, env, append([]string{"ls", "--summary", "--json"}, urls...)...))
			cat := ok(t, env, append([]string{"cat"}, urls...)...)
			if len(cat) < 10_000 || len(summary) != len(fetchShards) {
				t.Fatalf("cat wrote %d bytes, ls summarised %d shards", len(cat), len(summary))
			}
			if wantCat == nil {
				wantSummary, wantCat = summary, cat
				return
			}
			if strings.Join(summary, "\n") != strings.Join(wantSummary, "\n") {
				t.Errorf("ls --summary = %q; local disk gave %q", summary, wantSummary)
			}
			if !bytes.Equal(cat, wantCat) {
				t.Errorf("cat wrote %d bytes unlike the %d from local disk", len(cat), len(wantCat))
			}
		})
	}
	for _, scheme := range []string{"s3", "gs"} {
		t.Run(scheme+" listing", func(t *testing.T) {
			for _, pattern := range []string{bases[scheme], bases[scheme] + "*.tar", bases[scheme] + "tarproc__*"} {
				got := summaries(t, ok(t, env, "ls", "--summary", "--json", pattern))
				want := wantSummary
				if strings.Contains(pattern, "tarproc") {
					want = wantSummary[:1]
				}
				if strings.Join(got, "\n") != strings.Join(sortedBy(want), "\n") {
					t.Errorf("ls %s = %q; want %q", pattern, got, sortedBy(want))
				}
			}
			r := shardload(t, "", env, "ls", bases[scheme]+"nothing-*.tar")
			if r.code != 1 || !strings.Contains(r.stderr, "no objects match") {
				t.Errorf("ls of a pattern matching nothing: exit %d, %q", r.code, r.stderr)
			}
		})
	}
}

// summaries returns ls --summary --json lines without their URLs, as
// "samples extensions" strings in output order.
func summaries(t *testing.T, out []byte) []string {
	t.Helper()
	var s []string
	dec := json.NewDecoder(bytes.NewReader(out))
	for dec.More() {
		var v struct {
			URL        string   `json:"url"`
			Samples    int      `json:"samples"`
			Extensions []string `json:"extensions"`
		}
		if err := dec.Decode(&v); err != nil {
			t.Fatalf("ls output %q: %v", out, err)
		}
		s = append(s, filepath.Base(v.URL)+" "+strings.Join(v.Extensions, ",")+" "+strconv.Itoa(v.Samples))
	}
	return s
}

// sortedBy returns the summaries in the order of their shard names, the order a
// listing yields.
func sortedBy(s []string) []string {
	out := slices.Clone(s)
	slices.Sort(out)
	return out
}
