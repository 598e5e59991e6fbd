package integration

import (
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/shardload/shardload/internal/testutil"
)

// TestFetchCredentialsNeverPrinted runs the binary with sentinel credentials in every
// place a backend takes them from (AWS variables, a GCS service account file, the
// user information and signature of an http URL), makes requests fail and succeed,
// asks for help, and checks that no sentinel appears in anything it printed.
func TestFetchCredentialsNeverPrinted(t *testing.T) {
	const sentinel = "SENTINELcred7f3a"
	minio := testutil.MinIO(t)
	minio.CreateBucket(t, "shards")
	data, err := os.ReadFile("../testdata/tarproc__sample.tar")
	if err != nil {
		t.Fatal(err)
	}
	minio.Put(t, "shards", "ok.tar", data)
	web := httptest.NewServer(http.FileServer(http.Dir("../testdata")))
	defer web.Close()

	dir := t.TempDir()
	sa := filepath.Join(dir, "sa.json")
	os.WriteFile(sa, []byte(`{"type":"service_account","project_id":"p","private_key_id":"`+sentinel+`id",
"private_key":"-----BEGIN PRIVATE KEY-----\n`+sentinel+`key\n-----END PRIVATE KEY-----\n",
"client_email":"x@p.iam.gserviceaccount.com","client_id":"1","token_uri":"http://127.0.0.1:9/token"}`), 0o600)

	awsEnv := append(minio.Env(), "AWS_ACCESS_KEY_ID="+sentinel+"id", "AWS_SECRET_ACCESS_KEY="+sentinel+"secret",
		"AWS_SESSION_TOKEN="+sentinel+"token")
	gcsEnv := []string{"GOOGLE_APPLICATION_CREDENTIALS=" + sa, "STORAGE_EMULATOR_HOST="}
	secretURL := strings.Replace(web.URL, "http://", "http://user:"+sentinel+"pw@", 1)
	runs := []struct {
		env     []string
		args    []string
		wantErr bool
	}{
		{awsEnv, []string{"ls", "s3://shards/ok.tar"}, true},
		{awsEnv, []string{"cat", "s3://shards/ok.tar"}, true},
		{awsEnv, []string{"ls", "s3://shards/"}, true},
		{gcsEnv, []string{"ls", "--retry-budget=1s", "gs://shards/ok.tar"}, true}, // the token endpoint refuses
		{nil, []string{"cat", secretURL + "/tarproc__sample.tar?X-Amz-Signature=" + sentinel + "sig"}, false},
		{nil, []string{"ls", secretURL + "/missing.tar?X-Amz-Signature=" + sentinel + "sig&X-Amz-Credential=" + sentinel}, true},
		{nil, []string{"ls", "--retry-budget=1s", "http://user:" + sentinel + "@127.0.0.1:9/refused.tar"}, true},
		{awsEnv, []string{"help"}, false},
		{awsEnv, []string{"ls", "--help"}, false},
		{awsEnv, []string{"cat", "--help"}, false},
		{awsEnv, []string{"bench", "--help"}, false},
	}
	for _, r := range runs {
		res := shardload(t, "", r.env, r.args...)
		if (res.code != 0) != r.wantErr {
			t.Errorf("shardload %s: exit %d (%s); want failure %v", r.args[0], res.code, res.stderr, r.wantErr)
		}
		if r.wantErr && strings.TrimSpace(res.stderr) == "" {
			t.Errorf("shardload %s failed with no message", r.args[0])
		}
		for name, out := range map[string]string{"stdout": string(res.stdout), "stderr": res.stderr} {
			if strings.Contains(out, sentinel) {
				t.Errorf("shardload %s printed a credential on %s:\n%s", r.args[0], name, out)
			}
		}
		t.Logf("shardload %s: exit %d: %s", r.args[0], res.code, strings.TrimSpace(res.stderr))
	}
}
