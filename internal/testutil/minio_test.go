package testutil

import (
	"bytes"
	"io"
	"net/http"
	"os/exec"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/service/s3"
)

func TestMinIO(t *testing.T) {
	s := MinIO(t)
	s.CreateBucket(t, "bkt")
	want := []byte("hello, shards")
	s.Put(t, "bkt", "dir/obj.tar", want)

	out, err := s.Client.GetObject(t.Context(), &s3.GetObjectInput{Bucket: ptr("bkt"), Key: ptr("dir/obj.tar")})
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(out.Body)
	out.Body.Close()
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("GetObject = %q, %v; want %q", got, err, want)
	}

	env := strings.Join(s.Env(), "\n")
	for _, v := range []string{"AWS_ENDPOINT_URL=" + s.Endpoint, "AWS_ACCESS_KEY_ID=" + s.AccessKey,
		"AWS_SECRET_ACCESS_KEY=" + s.SecretKey, "AWS_REGION=us-east-1"} {
		if !strings.Contains(env, v+"\n") {
			t.Errorf("Env() lacks %s", v)
		}
	}

	s.Stop()
	s.Stop() // idempotent
	if resp, err := http.Get(s.Endpoint + "/minio/health/live"); err == nil {
		resp.Body.Close()
		t.Fatalf("server still answers after Stop: %s", resp.Status)
	}
}

// TestToolsScriptAgrees checks that scripts/tools.sh puts each server where testutil
// looks for it.
func TestToolsScriptAgrees(t *testing.T) {
	if _, err := exec.LookPath("bash"); err != nil {
		t.Skip("no bash")
	}
	for name, version := range map[string]string{"minio": MinIOVersion, "fake-gcs-server": FakeGCSVersion} {
		out, err := exec.Command("bash", "../../scripts/tools.sh", "path", name).Output()
		if err != nil {
			t.Fatalf("scripts/tools.sh path %s: %v", name, err)
		}
		if got, want := strings.TrimSpace(string(out)), ToolPath(name, version); got != want {
			t.Errorf("scripts/tools.sh path %s = %q, testutil uses %q", name, got, want)
		}
	}
}

func ptr(s string) *string { return &s }
