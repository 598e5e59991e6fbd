package main

import (
	"archive/tar"
	"encoding/binary"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// gen --preset docs writes a dataset that packs in one more command after the index:
// bench --pack reads every document's tokens, an eos after each, in rows.
func TestGenDocsPacks(t *testing.T) {
	dir := t.TempDir()
	code, stdout, stderr := runCLI(t, "gen", "--preset", "docs", "--shards", "2", "--samples", "30", "--max-tokens", "200", dir)
	if code != 0 {
		t.Fatalf("gen: exit %d: %s", code, stderr)
	}
	pattern := strings.TrimSpace(stdout)
	if want := filepath.Join(dir, "train-{000000..000001}.tar"); pattern != want {
		t.Fatalf("gen printed %q, want %q", pattern, want)
	}
	// The documents' lengths, from their .npy headers.
	var tokens int64
	lengths := map[int64]bool{}
	for _, name := range []string{"train-000000.tar", "train-000001.tar"} {
		f, err := os.Open(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		tr := tar.NewReader(f)
		for {
			h, err := tr.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			b, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			if !strings.HasSuffix(h.Name, ".tokens.npy") || len(b) < 10 || !strings.Contains(string(b[:128]), "'descr': '<u2'") {
				t.Fatalf("%s: member %s, %q", name, h.Name, b[:min(len(b), 64)])
			}
			n := (int64(len(b)) - 10 - int64(binary.LittleEndian.Uint16(b[8:10]))) / 2
			if n < 1 || n > 200 {
				t.Errorf("%s: %d tokens, want 1 to 200", h.Name, n)
			}
			lengths[n] = true
			tokens += n + 1 // and its eos
		}
		f.Close()
	}
	if len(lengths) < 10 {
		t.Errorf("60 documents of %d distinct lengths", len(lengths))
	}
	if code, _, stderr := runCLI(t, "index", "--no-index-store", "--output", dir+"/", pattern); code != 0 {
		t.Fatalf("index: exit %d: %s", code, stderr)
	}
	code, out, stderr := runCLI(t, "bench", "--pack", "tokens.npy:64:eos=1:pad=0", "--batch-size", "2", "--json", pattern)
	if code != 0 {
		t.Fatalf("bench --pack: exit %d: %s", code, stderr)
	}
	var rep packReport
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	rows := (tokens + 63) / 64
	if rep.EpochTokens != tokens || rep.Rows != (rows+1)/2*2 || rep.PadRows != rep.Rows-rows {
		t.Errorf("bench --pack: %+v; want %d tokens in %d rows", rep, tokens, rows)
	}

	// Bounds that make no documents are refused.
	for _, args := range [][]string{{"--min-tokens", "0"}, {"--min-tokens", "9", "--max-tokens", "8"}} {
		if code, _, stderr := runCLI(t, append(append([]string{"gen", "--preset", "docs"}, args...), t.TempDir())...); code != 2 || !strings.Contains(stderr, "--min-tokens") {
			t.Errorf("gen %q: exit %d: %s", args, code, stderr)
		}
	}
}
