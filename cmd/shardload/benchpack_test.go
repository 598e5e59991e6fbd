package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/shardload/shardload/megatron"
)

// bench --pack over a Megatron dataset yields its tokens, eos included, in rows.
func TestBenchPackMegatron(t *testing.T) {
	dir := t.TempDir()
	bin, _ := os.Create(filepath.Join(dir, "c.bin"))
	idx, _ := os.Create(filepath.Join(dir, "c.idx"))
	w, err := megatron.NewWriter(bin, idx, megatron.Int32)
	if err != nil {
		t.Fatal(err)
	}
	var tokens int64
	for i := range 500 {
		doc := make([]int64, 1+i%97)
		for j := range doc {
			doc[j] = int64(i*31 + j)
		}
		tokens += int64(len(doc)) + 1
		if err := w.AddDocument(doc); err != nil {
			t.Fatal(err)
		}
	}
	w.Close()
	bin.Close()
	idx.Close()
	code, out, errOut := runCLI(t, "bench", "--pack", "tokens:128:eos=0", "--batch-size", "4", "--json", idx.Name())
	if code, out, _ := runCLI(t, "bench", "--pack", "tokens:128:eos=0", "--json", idx.Name()); code != 0 || !strings.Contains(out, `"rows":`) || strings.Contains(out, `"rows":0,`) {
		t.Errorf("without --batch-size: exit %d, %s", code, out)
	}
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var rep packReport
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	rows := (tokens + 127) / 128
	if rep.EpochTokens != tokens || rep.Rows != (rows+3)/4*4 || rep.PadRows != rep.Rows-rows || rep.StateBytes == 0 || rep.TokensPerSecond <= 0 {
		t.Errorf("report %+v; want %d tokens in %d rows", rep, tokens, rows)
	}
	if code, _, errOut := runCLI(t, "bench", "--pack", "tokens:0", idx.Name()); code == 0 {
		t.Errorf("--pack tokens:0 accepted: %s", errOut)
	}
}
