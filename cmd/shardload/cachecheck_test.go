package main

import (
	"testing"
	"time"

	"github.com/spf13/pflag"

	"github.com/shardload/shardload/cache"
)

// --cache-validate-within (or SHARDLOAD_CACHE_VALIDATE_WITHIN) sets how long a
// check of a cached shard's version serves the node's opens; 0 asks on every open.
func TestCacheValidateWithinFlag(t *testing.T) {
	for _, tc := range []struct {
		args []string
		env  string
		want time.Duration
	}{
		{nil, "", cache.DefaultValidateWithin},
		{[]string{"--cache-validate-within", "30s"}, "", 30 * time.Second},
		{[]string{"--cache-validate-within=0"}, "", -1},
		{[]string{"--cache-validate-within=-1s"}, "", -1},
		{nil, "2s", 2 * time.Second},
		{[]string{"--cache-validate-within", "1s"}, "2s", time.Second},
	} {
		if tc.env != "" {
			t.Setenv("SHARDLOAD_CACHE_VALIDATE_WITHIN", tc.env)
		}
		var rf readFlags
		fs := pflag.NewFlagSet("cat", pflag.ContinueOnError)
		rf.register(fs)
		if err := fs.Parse(append([]string{"--cache-dir", t.TempDir()}, tc.args...)); err != nil {
			t.Fatal(err)
		}
		if err := bindEnv(fs); err != nil {
			t.Fatal(err)
		}
		opts, err := rf.cacheOptions()
		if err != nil {
			t.Fatal(err)
		}
		if opts.ValidateWithin != tc.want {
			t.Errorf("%q, env %q: ValidateWithin %v, want %v", tc.args, tc.env, opts.ValidateWithin, tc.want)
		}
	}
}
