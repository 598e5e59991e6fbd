package main

import (
	"io"
	"testing"

	"github.com/spf13/pflag"
)

// TestRanksPerNodeFromTorchrun: bench's --ranks-per-node defaults to torchrun's
// LOCAL_WORLD_SIZE; the flag wins; a bad value is a usage error; serve has no such
// flag (each trainer's hello says it) and ignores the variable.
func TestRanksPerNodeFromTorchrun(t *testing.T) {
	cfgOf := func(perRank bool, args ...string) (int, bool, error) {
		var lf loaderFlags
		fs := pflag.NewFlagSet("bench", pflag.ContinueOnError)
		lf.register(fs, perRank)
		if err := fs.Parse(append(args, "x.tar")); err != nil {
			t.Fatal(err)
		}
		cfg, err := lf.config(fs.Args(), io.Discard)
		return cfg.RanksPerNode, cfg.NoNodeAffinity, err
	}
	t.Setenv("LOCAL_WORLD_SIZE", "4")
	if n, _, err := cfgOf(true); err != nil || n != 4 {
		t.Fatalf("LOCAL_WORLD_SIZE=4: ranks per node %d, %v", n, err)
	}
	if n, off, err := cfgOf(true, "--ranks-per-node", "2", "--node-affinity=false"); err != nil || n != 2 || !off {
		t.Fatalf("--ranks-per-node 2 --node-affinity=false: %d, %v, %v", n, off, err)
	}
	if n, _, err := cfgOf(false); err != nil || n != 0 {
		t.Fatalf("serve's flags: ranks per node %d, %v", n, err)
	}
	t.Setenv("LOCAL_WORLD_SIZE", "four")
	if _, _, err := cfgOf(true); err == nil {
		t.Fatal("LOCAL_WORLD_SIZE=four: no error")
	}
}
