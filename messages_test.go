package shardload_test

import (
	"context"
	"errors"
	"regexp"
	"strings"
	"testing"

	"github.com/shardload/shardload"
	"github.com/shardload/shardload/decode"
	"github.com/shardload/shardload/shard"
)

// goSetting finds a Go setting a message names (Config.CountFirst) and what follows it.
var goSetting = regexp.MustCompile(`Config\.[A-Za-z.]+( in Go)?`)

// The refusals a trainer of serve reads too (its ServerError's message is the
// loader's) say what to change in the trainer's terms: the Python keyword where a
// trainer sets the setting, the server's flag where only the server does, and the Go
// setting marked as Go's. Each case's message must name its fix.
func TestMessagesNameTrainerSettings(t *testing.T) {
	ctx := context.Background()
	paths, _ := dataset(t, 3, nil, shard.None)
	quiet := func(string, ...any) {}
	wrong := []decode.Field{mustField(t, "cls"), mustField(t, "missing=nothere")}
	img := []decode.Field{mustField(t, "img=bin:image:uint8:3x224x224")}
	for _, tc := range []struct {
		name   string
		cfg    shardload.Config
		target error
		want   []string
	}{
		{"estimated counts, several ranks", shardload.Config{URLs: paths, World: 2, BatchSize: 4, NoIndexStore: true, Logf: quiet},
			shardload.ErrEstimated, []string{"count_first=True", "allow_estimate=True", "--count-first", "--allow-estimate"}},
		{"error budget", shardload.Config{URLs: paths, Fields: wrong, BatchSize: 4, OnError: shardload.Skip, CountFirst: true, NoIndexStore: true, Logf: quiet},
			shardload.ErrErrorBudget, []string{"--error-budget", "of shardload serve"}},
		{"memory budget", shardload.Config{URLs: paths, Fields: img, BatchSize: 256, Memory: 64 << 20, ShuffleBytes: 4 << 20, CountFirst: true, NoIndexStore: true, Logf: quiet},
			shardload.ErrMemory, []string{"--memory of shardload serve"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := openAndRun(ctx, tc.cfg)
			if !errors.Is(err, tc.target) {
				t.Fatalf("got %v, want %v", err, tc.target)
			}
			msg := err.Error()
			for _, w := range tc.want {
				if !strings.Contains(msg, w) {
					t.Errorf("the message does not name %q: %s", w, msg)
				}
			}
			for _, m := range goSetting.FindAllStringSubmatch(msg, -1) {
				if m[1] == "" {
					t.Errorf("the message names the Go setting %s as if every reader used Go: %s", m[0], msg)
				}
			}
		})
	}
}

// openAndRun opens a loader of cfg and reads its epoch: the error of either.
func openAndRun(ctx context.Context, cfg shardload.Config) error {
	l, err := shardload.Open(ctx, cfg)
	if err != nil {
		return err
	}
	defer l.Close()
	return runToError(ctx, l)
}
