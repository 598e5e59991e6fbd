package serve

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/shardload/shardload"
)

// TestCheck: Check passes a dataset whose first shard and index are there, and names
// what is missing otherwise; a server of --allow prefixes alone has nothing remote to
// check.
func TestCheck(t *testing.T) {
	pattern := dataset(t)
	ctx := context.Background()
	if err := Check(ctx, Options{URLs: []string{pattern}}, nil, time.Minute); err != nil {
		t.Errorf("a dataset that is there: %v", err)
	}
	missing := filepath.Join(t.TempDir(), "none-{000..003}.tar")
	err := Check(ctx, Options{URLs: []string{missing}}, nil, time.Minute)
	if err == nil || !strings.Contains(err.Error(), "none-000.tar") || !strings.Contains(err.Error(), "not found") {
		t.Errorf("a dataset that is not there: %v", err)
	}
	noIndex := filepath.Join(t.TempDir(), "index.json")
	err = Check(ctx, Options{URLs: []string{pattern}, Pipeline: shardload.Config{Index: noIndex}}, nil, time.Minute)
	if err == nil || !strings.Contains(err.Error(), noIndex) || !strings.Contains(err.Error(), "--index") {
		t.Errorf("an index that is not there: %v", err)
	}
	if err := Check(ctx, Options{Allow: []string{"file:///nowhere/"}}, nil, time.Minute); err != nil {
		t.Errorf("--allow of local files alone: %v", err)
	}
}
