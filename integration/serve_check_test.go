package integration

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/shardload/shardload/internal/testutil"
)

// serveExit runs "shardload serve" with env and args, expecting it to exit: it
// returns the exit status, stdout and stderr. A server still running after guard is
// killed and fails the test: it started instead of refusing (a guard against a hang,
// not a measurement).
func serveExit(t *testing.T, env []string, guard time.Duration, args ...string) (int, string, string) {
	t.Helper()
	socket := filepath.Join(t.TempDir(), "run", "loader.sock")
	ctx, cancel := context.WithTimeout(context.Background(), guard)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, append([]string{"serve", "--socket", socket}, args...)...)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "AWS_") && !strings.HasPrefix(kv, "SHARDLOAD_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, "AWS_EC2_METADATA_DISABLED=true", "AWS_CONFIG_FILE=/dev/null", "AWS_SHARED_CREDENTIALS_FILE=/dev/null",
		"SHARDLOAD_INDEX_DIR="+t.TempDir())
	cmd.Env = append(cmd.Env, env...)
	var stderr bytes.Buffer
	stdout := &listenWatch{listening: cancel}
	// A killed server's output is not waited for beyond this (a process it started
	// may hold it open).
	cmd.WaitDelay = 5 * time.Second
	cmd.Stdout, cmd.Stderr = stdout, &stderr
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("serve %s did not exit (within %v, or before it said it listens): stdout %q, stderr %q", strings.Join(args, " "), guard, stdout.String(), stderr.String())
	}
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(socket); err == nil {
		t.Errorf("serve %s left its socket %s", strings.Join(args, " "), socket)
	}
	return code, stdout.String(), stderr.String()
}

// listenWatch keeps a server's output and calls listening once it says it listens.
type listenWatch struct {
	bytes.Buffer
	listening func()
}

func (w *listenWatch) Write(p []byte) (int, error) {
	n, err := w.Buffer.Write(p)
	if strings.Contains(w.String(), "listening on") {
		w.listening()
	}
	return n, err
}

// TestServeChecksItsStore: serve asks the store for its dataset's first shard before
// it listens, and a bucket that does not exist, a wrong secret key or an endpoint
// that does not answer ends it at once with one line naming the URL, the bucket, the
// endpoint and where the credentials came from; --check=false starts it anyway.
func TestServeChecksItsStore(t *testing.T) {
	minio := testutil.MinIO(t)
	minio.CreateBucket(t, "shards")
	data, err := os.ReadFile("../testdata/tarproc__sample.tar")
	if err != nil {
		t.Fatal(err)
	}
	minio.Put(t, "shards", "train-000000.tar", data)
	minio.Put(t, "shards", "train-000001.tar", data)
	const wrongSecret = "WRONGsecret5d1c"
	unreachable := []string{"AWS_ENDPOINT_URL=http://127.0.0.1:1", "AWS_ENDPOINT_URL_S3=http://127.0.0.1:1"}
	for _, tc := range []struct {
		name  string
		env   []string
		args  []string
		wants []string
	}{
		{"no such bucket", minio.Env(), []string{"s3://no-such-bucket/train-{000000..000001}.tar"},
			[]string{"s3://no-such-bucket/train-000000.tar", `bucket "no-such-bucket" not found`, minio.Endpoint,
				"credentials from the environment (AWS_ACCESS_KEY_ID", "check the bucket's name", "--check=false"}},
		{"no such object", minio.Env(), []string{"s3://shards/val-{000000..000001}.tar"},
			[]string{"s3://shards/val-000000.tar", `not found in bucket "shards"`, minio.Endpoint}},
		{"wrong secret key", append(minio.Env(), "AWS_SECRET_ACCESS_KEY="+wrongSecret), []string{"s3://shards/train-{000000..000001}.tar"},
			[]string{"s3://shards/train-000000.tar", `bucket "shards"`, "refused", minio.Endpoint,
				"credentials from the environment (AWS_ACCESS_KEY_ID", "secret key"}},
		{"unreachable endpoint", append(minio.Env(), unreachable...), []string{"--start-timeout", "3s", "s3://shards/train-{000000..000001}.tar"},
			[]string{"s3://shards/train-000000.tar", "http://127.0.0.1:1 (from AWS_ENDPOINT_URL_S3)", "no answer from the store within 3s", "--start-timeout"}},
		{"index missing", minio.Env(), []string{"--index", "s3://shards/no-index.json", "s3://shards/train-{000000..000001}.tar"},
			[]string{"s3://shards/no-index.json", "index (--index)", `not found in bucket "shards"`}},
		{"allow prefix of a missing bucket", minio.Env(), []string{"--allow", "s3://no-such-bucket/train/"},
			[]string{"s3://no-such-bucket/train/", `bucket "no-such-bucket" not found`, "--allow"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, stdout, stderr := serveExit(t, tc.env, time.Minute, tc.args...)
			if code == 0 || strings.Contains(stdout, "listening") {
				t.Fatalf("exit %d, stdout %q, stderr %q", code, stdout, stderr)
			}
			// One line says it all (log lines of the retries may come before it).
			var msgs []string
			for _, l := range strings.Split(strings.TrimSpace(stderr), "\n") {
				if strings.HasPrefix(l, "shardload serve: ") {
					msgs = append(msgs, l)
				}
			}
			if len(msgs) != 1 {
				t.Fatalf("%d error lines on stderr, want one: %s", len(msgs), stderr)
			}
			for _, w := range tc.wants {
				if !strings.Contains(msgs[0], w) {
					t.Errorf("the error does not say %q: %s", w, msgs[0])
				}
			}
			if strings.Contains(stderr, wrongSecret) || strings.Contains(stderr, minio.SecretKey) {
				t.Errorf("stderr shows a secret key: %s", stderr)
			}
			t.Logf("exit %d: %s", code, strings.TrimSpace(stderr))
		})
	}

	// The store answers: the server listens. A missing bucket with --check=false: it
	// listens too, and its trainers hear of the bucket.
	startServerEnv(t, minio.Env(), "", "s3://shards/train-{000000..000001}.tar")
	srv := startServerEnv(t, minio.Env(), "", "--check=false", "s3://no-such-bucket/train-{000000..000001}.tar")
	m := rawHello(t, srv.socket, map[string]any{"type": "hello", "version": 4, "rank": 0, "world": 1, "batch_size": 4})
	if m["type"] != "error" || !strings.Contains(m["message"].(string), "bucket not found") {
		t.Errorf("a trainer of the server started with --check=false: %v", m)
	}
}
