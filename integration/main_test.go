// Package integration tests the shardload command end to end: the real binary against
// real shards on local disk and in a real MinIO server. These tests never skip in CI:
// a missing server is a failure there.
package integration

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// bin is the shardload binary built for this test run.
var bin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "shardload-integration-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	bin = filepath.Join(dir, "shardload")
	build := exec.Command("go", "build", "-o", bin, "../cmd/shardload")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building shardload:", err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// result is what one run of the binary did.
type result struct {
	stdout []byte
	stderr string
	code   int
}

// shardload runs the binary with args in dir (the test's working directory when "")
// and extra environment variables, with no AWS configuration from the caller's
// environment.
func shardload(t *testing.T, dir string, env []string, args ...string) result {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "AWS_") && !strings.HasPrefix(kv, "SHARDLOAD_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, "AWS_EC2_METADATA_DISABLED=true", "AWS_CONFIG_FILE=/dev/null", "AWS_SHARED_CREDENTIALS_FILE=/dev/null")
	// A node's index store of its own, unless the test names one: runs do not see
	// each other's entries, nor the user's.
	cmd.Env = append(cmd.Env, "SHARDLOAD_INDEX_DIR="+t.TempDir())
	cmd.Env = append(cmd.Env, env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("running shardload %v: %v", args, err)
	}
	return result{stdout: stdout.Bytes(), stderr: stderr.String(), code: code}
}

// ok runs the binary and fails the test unless it exits 0.
func ok(t *testing.T, env []string, args ...string) []byte {
	t.Helper()
	r := shardload(t, "", env, args...)
	if r.code != 0 {
		t.Fatalf("shardload %s: exit %d: %s", strings.Join(args, " "), r.code, r.stderr)
	}
	return r.stdout
}
