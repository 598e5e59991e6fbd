package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"regexp"
	"strings"
	"testing"

	"github.com/shardload/shardload/logs"
)

// TestLogFormats: text lines start with a timestamp and the level and keep the
// message as written; JSON lines are objects with time, level and msg; warnings are
// at level WARN.
func TestLogFormats(t *testing.T) {
	var b bytes.Buffer
	l, err := newLogger("text", &b)
	if err != nil {
		t.Fatal(err)
	}
	logf := logs.Printf(l)
	logf("serve: session %d: sample %q skipped", 3, "a/b")
	logf("shardload: warning: %s\n", "slow")
	lines := strings.Split(strings.TrimSuffix(b.String(), "\n"), "\n")
	ts := `^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z `
	if len(lines) != 2 || !regexp.MustCompile(ts+`INFO serve: session 3: sample "a/b" skipped$`).MatchString(lines[0]) ||
		!regexp.MustCompile(ts+`WARN shardload: warning: slow$`).MatchString(lines[1]) {
		t.Errorf("text:\n%s", b.String())
	}

	b.Reset()
	if l, err = newLogger("json", &b); err != nil {
		t.Fatal(err)
	}
	logs.Printf(l)("shardload: warning: %d shards", 2)
	var rec map[string]any
	if err := json.Unmarshal(b.Bytes(), &rec); err != nil || rec["level"] != "WARN" || rec["msg"] != "shardload: warning: 2 shards" || rec["time"] == nil {
		t.Errorf("json: %s (%v)", b.String(), err)
	}

	if _, err := newLogger("xml", &b); !errors.Is(err, errUsage) {
		t.Errorf("--log-format xml: %v", err)
	}
}
