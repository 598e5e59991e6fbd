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

// Settings that make no sense are refused with exit status 2 and a line naming the
// flag, before any work; they used to be accepted or silently changed.
func TestBadSettingsRefused(t *testing.T) {
	shard := "../../testdata/aistore__small-mnist-3.tar"
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"bench", "--workers", "0", shard}, "--workers 0"},
		{[]string{"bench", "--world", "0", shard}, "--world 0"},
		{[]string{"bench", "--epochs", "-1", shard}, "--epochs -1"},
		{[]string{"bench", "--batches", "-5", shard}, "--batches -5"},
		{[]string{"bench", "--step-time", "-1s", shard}, "--step-time -1s"},
		{[]string{"bench", "--queue-bytes", "0", shard}, "--queue-bytes 0"},
		{[]string{"bench", "--batch-size", "0", shard}, "--batch-size 0"},
		{[]string{"bench", "--rank", "2", "--world", "2", shard}, "--rank 2"},
		{[]string{"bench", "--error-budget", "1.5", shard}, "--error-budget 1.5"},
		{[]string{"bench", "--error-budget-shards", "-1", shard}, "must not be negative"},
		{[]string{"bench", "--gpu", "-1", shard}, "--gpu -1"},
		{[]string{"serve", "--open-shards", "0", "--socket", t.TempDir() + "/s", shard}, "--open-shards 0"},
	} {
		code, _, stderr := runCLI(t, tt.args...)
		if code != 2 || !strings.Contains(stderr, tt.want) {
			t.Errorf("%q: exit %d, stderr %q; want exit 2 naming %q", tt.args, code, stderr, tt.want)
		}
	}
	// serve places each session itself: it has no --gpu and no --device.
	for _, flag := range []string{"--gpu", "--device"} {
		if code, _, stderr := runCLI(t, "serve", flag, "0", shard); code != 2 || !strings.Contains(stderr, "unknown flag: "+flag) {
			t.Errorf("serve %s: exit %d: %s", flag, code, stderr)
		}
	}
}
