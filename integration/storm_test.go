package integration

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	awss3 "github.com/aws/aws-sdk-go-v2/service/s3"

	sl "github.com/shardload/shardload"
	"github.com/shardload/shardload/index"
	"github.com/shardload/shardload/internal/shardgen"
	"github.com/shardload/shardload/internal/testutil"
	"github.com/shardload/shardload/source"
	s3src "github.com/shardload/shardload/source/s3"
)

// The storm test's job and store.
const (
	stormWorld   = 64  // ranks, all started at once, in this process
	stormShards  = 64  // shards of stormSamples samples: 8 samples per rank
	stormSamples = 8   //
	stormRate    = 100 // requests per second the proxy lets through; above it, 503 SlowDown
	stormBurst   = 10  // requests it lets through at once
	// stormAttempts is the retry policy's tries per request (the default is 5):
	// enough that the run without the limit ends too, so that the two runs' counts
	// can be compared; a read that made progress counts afresh.
	stormAttempts = 8
	// stormWait bounds how long any rank waits, from the start to its last batch,
	// with spreading and the limit on.
	stormWait = 30 * time.Second
)

// TestStorm: 64 ranks start at once against MinIO behind a proxy that answers S3's
// 503 SlowDown above 100 requests per second. With the start spread and the
// process's adaptive request-rate limit, every rank gets exactly its samples, byte
// for byte; the retries stay at most one for every four requests served; no rank
// waits more than 30 s for its data. The same job with both turned off gets at
// least twice the 503s and twice the retries: the counts are compared, never the
// speeds.
func TestStorm(t *testing.T) {
	m := testutil.MinIO(t)
	m.CreateBucket(t, "storm")
	spec := shardgen.Spec{Shards: stormShards, SamplesPerShard: stormSamples, Seed: 33,
		Fields: []shardgen.Field{{Ext: "bin", Kind: shardgen.Random, MinBytes: 100, MaxBytes: 400}, {Ext: "cls", Kind: shardgen.Class}}}
	paths, _ := putShards(t, m, "storm", "ds", "", spec)
	want := membersOf(t, paths, "bin") // key -> the bin member's bytes
	if len(want) != stormShards*stormSamples {
		t.Fatalf("%d samples in the shards, want %d", len(want), stormShards*stormSamples)
	}
	pattern := "s3://storm/ds/" + spec.Pattern()
	// The index beside the shards (written straight to MinIO, not through the
	// proxy): the ranks plan from it without reading the shards first.
	m.Put(t, "storm", "ds/"+index.FileName, ok(t, m.Env(), "index", pattern))

	t0 := time.Now()
	on := stormRun(t, m, pattern, want, true)
	t.Logf("the run with the limit took %v", time.Since(t0).Round(time.Millisecond))
	t0 = time.Now()
	off := stormRun(t, m, pattern, want, false)
	t.Logf("the run without took %v", time.Since(t0).Round(time.Millisecond))
	t.Logf("spread and limit on:  %s", on)
	t.Logf("spread and limit off: %s", off)

	// With the limit every rank got exactly its samples, byte for byte; without it,
	// a rank may give up (its requests' attempts ran out), but one that ended got
	// the same samples as with it (the order does not depend on timing).
	for rank := range stormWorld {
		if on.errs[rank] != nil {
			t.Errorf("with the limit: rank %d: %v", rank, on.errs[rank])
		}
		if off.errs[rank] == nil && !slices.Equal(on.keys[rank], off.keys[rank]) {
			t.Errorf("rank %d: keys %v with the limit, %v without", rank, on.keys[rank], off.keys[rank])
		}
	}
	if len(on.seen) != len(want) {
		t.Errorf("with the limit: the ranks got %d distinct samples of %d", len(on.seen), len(want))
	}
	// Bounded retries with the limit on: at most one for every four requests the
	// store served (the retry policy's own bound is stormAttempts-1 per request).
	if on.retries*4 > on.passed {
		t.Errorf("with the limit: %d retries for %d requests served, more than one in four", on.retries, on.passed)
	}
	if on.throttled == 0 || on.decreases == 0 {
		t.Errorf("with the limit: the limiter saw %d throttles and made %d decreases: the proxy never throttled, the test shows nothing", on.throttled, on.decreases)
	}
	if on.slowest > stormWait {
		t.Errorf("with the limit: a rank waited %v for its data, more than %v", on.slowest, stormWait)
	}
	// Worse without: at least twice the 503s and twice the retries.
	if off.slowDowns < 2*on.slowDowns || off.retries < 2*on.retries {
		t.Errorf("without spreading and the limit: %d 503s and %d retries; with them %d and %d: not twice worse",
			off.slowDowns, off.retries, on.slowDowns, on.retries)
	}
}

// stormResult is what one run of the storm test counted.
type stormResult struct {
	keys                 [][]string // per rank, in order
	errs                 []error    // per rank, what ended it early
	seen                 map[string]int
	passed, slowDowns    int64 // requests the proxy let through, and answered 503
	retries              int64 // source.Retries in the run
	throttled, decreases int64 // the run's limiter's counts (with the limit)
	waits                int64
	slowest              time.Duration // the longest any rank took, start to last batch
	kinds                map[string]int
}

func (r stormResult) String() string {
	return fmt.Sprintf("%d requests served, %d answered 503 SlowDown (requests by kind %v), %d retries; limiter: %d throttles, %d decreases, %d waits; slowest rank %v",
		r.passed, r.slowDowns, r.kinds, r.retries, r.throttled, r.decreases, r.waits, r.slowest.Round(time.Millisecond))
}

// stormRun runs the 64 ranks against MinIO behind a fresh throttling proxy, with
// the start spread and a fresh process limiter when limited, with neither when not,
// checks that every rank got exactly its samples, and returns the counts.
func stormRun(t *testing.T, m *testutil.MinIOServer, pattern string, want map[string][]byte, limited bool) stormResult {
	t.Helper()
	target, err := url.Parse(m.Endpoint)
	if err != nil {
		t.Fatal(err)
	}
	px := &slowDownProxy{rp: httputil.NewSingleHostReverseProxy(target), rate: stormRate, burst: stormBurst}
	srv := httptest.NewServer(px)
	defer srv.Close()
	client := awss3.New(awss3.Options{
		Region: testutil.Region, BaseEndpoint: aws.String(srv.URL), UsePathStyle: true,
		Credentials:                credentials.NewStaticCredentialsProvider(m.AccessKey, m.SecretKey, ""),
		RequestChecksumCalculation: aws.RequestChecksumCalculationWhenRequired,
		ResponseChecksumValidation: aws.ResponseChecksumValidationWhenRequired,
		Retryer:                    aws.NopRetryer{}, // the Fetcher's policy is the one in charge, as in the real backend
	})
	lim := source.Unlimited
	if limited {
		lim = source.NewRateLimiter(source.RateOptions{})
	}
	reg := &source.Registry{}
	reg.Register("s3", source.NewFetcher(&s3src.Source{Client: client}, source.FetchOptions{
		RateLimiter: lim, NoStartSpread: !limited, Retry: source.RetryPolicy{Attempts: stormAttempts}}))

	res := stormResult{keys: make([][]string, stormWorld)}
	took := make([]time.Duration, stormWorld)
	errs := make([]error, stormWorld) // a read that failed
	bad := make([]error, stormWorld)  // wrong data: never allowed
	retries0, _ := source.Retries()
	start := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	seen := map[string]int{}
	for rank := range stormWorld {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
			defer cancel()
			if limited {
				ctx = source.WithRank(ctx, rank, stormWorld)
			}
			<-start
			t0 := time.Now()
			defer func() { took[rank] = time.Since(t0) }()
			cfg := sl.Config{URLs: []string{pattern}, Fields: fields(t, "bin", "cls:int"), Seed: 7, BatchSize: 4,
				Rank: rank, World: stormWorld, NoIndexStore: true, Sources: reg, OpenShards: 2, ShuffleBuffer: 8, ShuffleBytes: 1 << 20,
				Workers: 1, Memory: 24 << 20, NoLock: true, NoAutotune: true}
			l, err := sl.Open(ctx, cfg)
			if err != nil {
				errs[rank] = err
				return
			}
			defer l.Close()
			for b, err := range l.All(ctx) {
				if err != nil {
					errs[rank] = err
					return
				}
				col, found := b.Column("bin")
				if !found {
					bad[rank] = fmt.Errorf("no column bin")
					b.Release()
					return
				}
				for row, key := range b.Keys() {
					if got := col.Row(b.Data(), row); !bytes.Equal(got, want[key]) {
						bad[rank] = fmt.Errorf("sample %s: %d bytes differ from the shard's %d", key, len(got), len(want[key]))
					}
					res.keys[rank] = append(res.keys[rank], key)
					mu.Lock()
					seen[key]++
					mu.Unlock()
				}
				b.Release()
			}
		}()
	}
	close(start)
	wg.Wait()
	retries1, _ := source.Retries()
	res.retries = retries1 - retries0
	res.passed, res.slowDowns = px.passed.Load(), px.slowDowns.Load()
	if limited {
		s := lim.Stats()
		res.throttled, res.decreases, res.waits = s.Throttled, s.Decreases, s.Waits
	}
	res.kinds, res.errs, res.seen = px.kinds, errs, seen
	for rank, err := range errs {
		if bad[rank] != nil {
			t.Fatalf("limited %v: rank %d: %v", limited, rank, bad[rank])
		}
		if err != nil {
			t.Logf("limited %v: rank %d: %v", limited, rank, err)
			continue
		}
		if n := len(res.keys[rank]); n != stormShards*stormSamples/stormWorld {
			t.Errorf("limited %v: rank %d got %d samples, want %d", limited, rank, n, stormShards*stormSamples/stormWorld)
		}
		res.slowest = max(res.slowest, took[rank])
	}
	for k, n := range seen {
		if n != 1 {
			t.Errorf("limited %v: sample %s delivered %d times", limited, k, n)
		}
	}
	return res
}

// slowDownProxy passes requests to a store while they come at rate per second or
// less (a token bucket of burst), and answers the rest as S3 does when a prefix is
// asked too much: 503 with the SlowDown error document.
type slowDownProxy struct {
	rp          *httputil.ReverseProxy
	rate, burst float64

	mu                sync.Mutex
	tokens            float64
	last              time.Time
	kinds             map[string]int // requests by kind, for the log
	passed, slowDowns atomic.Int64
}

// kind names what a request to the store is, for the log.
func kind(r *http.Request) string {
	switch {
	case r.Method == http.MethodHead:
		return "HEAD"
	case r.URL.Query().Has("list-type") || r.URL.Query().Has("prefix"):
		return "LIST"
	case r.Header.Get("Range") != "":
		return "GET range"
	}
	return r.Method
}

func (p *slowDownProxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	now := time.Now()
	p.mu.Lock()
	if p.last.IsZero() {
		p.tokens = p.burst
	} else {
		p.tokens = min(p.burst, p.tokens+now.Sub(p.last).Seconds()*p.rate)
	}
	p.last = now
	allow := p.tokens >= 1
	if allow {
		p.tokens--
	}
	if p.kinds == nil {
		p.kinds = map[string]int{}
	}
	p.kinds[kind(r)]++
	p.mu.Unlock()
	if allow {
		p.passed.Add(1)
		p.rp.ServeHTTP(w, r)
		return
	}
	p.slowDowns.Add(1)
	w.Header().Set("Content-Type", "application/xml")
	w.WriteHeader(http.StatusServiceUnavailable)
	if r.Method != http.MethodHead {
		fmt.Fprintf(w, `<?xml version="1.0" encoding="UTF-8"?>`+"\n"+
			`<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message><Resource>%s</Resource><RequestId>%d</RequestId></Error>`,
			r.URL.Path, p.slowDowns.Load())
	}
}
