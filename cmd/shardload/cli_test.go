package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

func TestParseBytes(t *testing.T) {
	tests := []struct {
		in   string
		want int64
	}{
		{"512", 512}, {"64KiB", 64 << 10}, {"64k", 64 << 10}, {"8MB", 8e6}, {"1GiB", 1 << 30},
		{"1.5MiB", 3 << 19}, {"2 G", 2 << 30}, {"0", 0},
	}
	for _, tc := range tests {
		got, err := parseBytes(tc.in)
		if err != nil || got != tc.want {
			t.Errorf("parseBytes(%q) = %d, %v; want %d", tc.in, got, err, tc.want)
		}
	}
	for _, bad := range []string{"", "x", "-1", "12XB", "1e30GiB"} {
		if _, err := parseBytes(bad); err == nil {
			t.Errorf("parseBytes(%q) succeeded", bad)
		}
	}
	if s := formatBytes(256 << 20); s != "256MiB" {
		t.Errorf("formatBytes = %q", s)
	}
}

func runCLI(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	code := run(context.Background(), args, &stdout, &stderr)
	return code, stdout.String(), stderr.String()
}

func TestEnvironmentSetsFlags(t *testing.T) {
	t.Setenv("SHARDLOAD_MAX_MEMBER_SIZE", "100")
	code, _, stderr := runCLI(t, "ls", "../../testdata/aistore__small-mnist-3.tar")
	if code != 1 || !strings.Contains(stderr, "member larger than the cap") || !strings.Contains(stderr, "cap 100") {
		t.Errorf("exit %d: %s", code, stderr)
	}
	// The command line wins over the environment.
	if code, _, stderr := runCLI(t, "ls", "--max-member-size", "1MiB", "../../testdata/aistore__small-mnist-3.tar"); code != 0 {
		t.Errorf("exit %d: %s", code, stderr)
	}
	t.Setenv("SHARDLOAD_MAX_MEMBER_SIZE", "lots")
	if code, _, stderr := runCLI(t, "ls", "../../testdata/aistore__small-mnist-3.tar"); code != 1 || !strings.Contains(stderr, "SHARDLOAD_MAX_MEMBER_SIZE") {
		t.Errorf("bad environment value: exit %d: %s", code, stderr)
	}
}

func TestUsageErrors(t *testing.T) {
	for _, args := range [][]string{{}, {"nope"}, {"ls"}, {"ls", "--no-such-flag", "x"}, {"gen"}, {"gen", "--compression", "lz4", "d"}} {
		code, _, stderr := runCLI(t, args...)
		if code != 2 {
			t.Errorf("%q: exit %d, want 2 (stderr %q)", args, code, stderr)
		}
	}
	code, _, stderr := runCLI(t, "cat", "--help")
	if code != 0 || !strings.Contains(stderr, "--max-member-size") || !strings.Contains(stderr, "default 256MiB") {
		t.Errorf("cat --help: exit %d: %s", code, stderr)
	}
}
