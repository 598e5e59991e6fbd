package integration

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/shardload/shardload/internal/shardgen"
	"github.com/shardload/shardload/internal/testutil"
)

// Sentinel secrets in URLs (user information, presigned-URL signatures, credentials
// and tokens), in the environment (AWS keys) and in the configuration reach no output,
// log line or file that shardload writes: every command, and serve with a trainer.
func TestSecretsNeverShown(t *testing.T) {
	py := python(t)
	secrets := []string{"SENTINELPW", "SENTINELSIG", "SENTINELCRED", "SENTINELTOKEN", "SENTINELAWS", "SENTINELSESSION"}

	// An HTTP origin that serves shards whatever the credentials in the URL.
	dir := t.TempDir()
	spec := shardgen.Spec{Shards: 2, SamplesPerShard: 20, Fields: shardgen.Presets["default"]}
	if _, err := shardgen.Generate(dir, spec); err != nil {
		t.Fatal(err)
	}
	web := httptest.NewServer(http.StripPrefix("/shards/", http.FileServer(http.Dir(dir))))
	defer web.Close()
	host := strings.TrimPrefix(web.URL, "http://")
	secretURL := func(name string) string {
		return "http://user:SENTINELPW@" + host + "/shards/" + name +
			"?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=SENTINELCRED&X-Amz-Signature=SENTINELSIG&X-Amz-Security-Token=SENTINELTOKEN"
	}
	good := []string{secretURL(spec.Name(0)), secretURL(spec.Name(1))}
	missing := secretURL("missing-000000.tar")

	// S3 with a wrong secret key and a session token from the environment.
	m := testutil.MinIO(t)
	m.CreateBucket(t, "shards")
	data, _ := os.ReadFile(filepath.Join(dir, spec.Name(0)))
	m.Put(t, "shards", "a.tar", data)
	var env []string
	for _, kv := range m.Env() {
		if strings.HasPrefix(kv, "AWS_SECRET_ACCESS_KEY=") {
			kv = "AWS_SECRET_ACCESS_KEY=SENTINELAWS"
		}
		env = append(env, kv)
	}
	env = append(env, "AWS_SESSION_TOKEN=SENTINELSESSION")

	cacheDir := t.TempDir()
	var outputs []result
	run := func(wantOK bool, env []string, args ...string) {
		t.Helper()
		r := shardload(t, "", env, args...)
		if wantOK != (r.code == 0) {
			t.Errorf("shardload %s: exit %d: %s", args[0], r.code, r.stderr)
		}
		outputs = append(outputs, r)
	}
	run(true, nil, append([]string{"ls"}, good...)...)
	run(true, nil, append([]string{"ls", "--summary", "--json"}, good...)...)
	run(true, nil, append([]string{"cat", "--stats"}, good...)...)
	run(true, nil, append([]string{"warm", "--cache-dir", cacheDir}, good...)...)
	run(true, nil, append([]string{"bench", "--cache-dir", cacheDir, "--batch-size", "8"}, good...)...)
	run(false, nil, "ls", missing)
	run(false, nil, "cat", good[0], missing)
	run(false, nil, "warm", "--cache-dir", cacheDir, missing)
	run(false, nil, "bench", good[0], missing)
	run(false, nil, "ls", "http://user:SENTINELPW@"+host+"/shards/x-{1..0}.tar?sig=SENTINELSIG") // a bad pattern
	run(false, env, "ls", "s3://shards/a.tar")                                                   // a refused signature

	// serve, with a trainer naming the secret URLs (and one that fails).
	srv := startServer(t, "", "--allow", "http://"+host+"/shards/", "--cache-dir", t.TempDir())
	tr := startTrainer(t, py, srv.socket, -1, "--url", good[0], "--url", good[1], "--field", "cls:int")
	lines, errLine := tr.run(t)
	if errLine != nil || len(lines) == 0 {
		t.Fatalf("trainer: %d batches, %+v", len(lines), errLine)
	}
	tr = startTrainer(t, py, srv.socket, -1, "--url", missing, "--field", "cls:int")
	if _, errLine := tr.run(t); errLine == nil {
		t.Error("trainer on a missing shard: no error")
	} else if strings.Contains(errLine.Message, "SENTINEL") {
		t.Errorf("the trainer was told a secret: %s", errLine.Message)
	}
	srv.cmd.Process.Signal(os.Interrupt)
	srv.wait(t)

	for i, r := range outputs {
		for _, s := range secrets {
			if bytes.Contains(r.stdout, []byte(s)) || strings.Contains(r.stderr, s) {
				t.Errorf("run %d shows %s:\nstdout: %.500s\nstderr: %.1000s", i, s, r.stdout, r.stderr)
			}
		}
	}
	if !strings.Contains(string(outputs[0].stdout), "REDACTED") && !strings.Contains(outputs[5].stderr, "REDACTED") {
		t.Errorf("no redacted URL in the outputs: %q", outputs[5].stderr)
	}
	for _, s := range secrets {
		if strings.Contains(srv.stderr.String(), s) || strings.Contains(tr.errb.String(), s) {
			t.Errorf("serve's log or the trainer's stderr shows %s:\n%s", s, srv.stderr)
		}
	}
	err := filepath.Walk(cacheDir, func(path string, fi os.FileInfo, err error) error {
		if err != nil || fi.IsDir() {
			return err
		}
		b, err := os.ReadFile(path)
		for _, s := range secrets {
			if bytes.Contains(b, []byte(s)) {
				t.Errorf("cache file %s holds %s", path, s)
			}
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}
