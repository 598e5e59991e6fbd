package testutil

import (
	"bytes"
	"io"
	"net/http"
	"testing"
)

func TestFakeGCS(t *testing.T) {
	s := FakeGCS(t)
	s.CreateBucket(t, "bkt")
	want := []byte("hello, shards")
	s.Put(t, "bkt", "dir/obj.tar", want)

	r, err := s.Client.Bucket("bkt").Object("dir/obj.tar").NewReader(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(r)
	r.Close()
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("read = %q, %v; want %q", got, err, want)
	}
	if env := s.Env(); len(env) != 1 || env[0] != "STORAGE_EMULATOR_HOST="+s.Host {
		t.Errorf("Env() = %q", env)
	}

	s.Stop()
	s.Stop() // idempotent
	if resp, err := http.Get(s.Endpoint + "/storage/v1/b"); err == nil {
		resp.Body.Close()
		t.Fatalf("server still answers after Stop: %s", resp.Status)
	}
}
