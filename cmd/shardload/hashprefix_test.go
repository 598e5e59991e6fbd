package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/shardload/shardload"
	"github.com/shardload/shardload/decode"
	"github.com/shardload/shardload/index"
	"github.com/shardload/shardload/internal/shardgen"
	"github.com/shardload/shardload/shard"
)

// genHashed writes a dataset of shards x samples under prefixes hashed key prefixes
// with gen, checks where the shards went, and returns the directory, the pattern gen
// printed and the shards in each prefix.
func genHashed(t *testing.T, shards, samples, prefixes int) (string, string, map[string]int) {
	t.Helper()
	dir := t.TempDir()
	code, stdout, stderr := runCLI(t, "gen", "--shards", strconv.Itoa(shards), "--samples", strconv.Itoa(samples),
		"--min-size", "64", "--max-size", "512", "--prefixes", strconv.Itoa(prefixes), dir)
	if code != 0 {
		t.Fatalf("gen: exit %d: %s", code, stderr)
	}
	pattern := strings.TrimSuffix(stdout, "\n")
	if want := filepath.Join(dir, fmt.Sprintf("{hash:%d}/train-{000000..%06d}.tar", prefixes, shards-1)); pattern != want {
		t.Fatalf("gen printed %q, want %q", pattern, want)
	}
	perPrefix := map[string]int{}
	spec := shardgen.Spec{Shards: shards}
	for i := range shards {
		name := spec.Name(i)
		p := shard.HashPrefix(name, prefixes)
		if _, err := os.Stat(filepath.Join(dir, p, name)); err != nil {
			t.Errorf("shard %d: %v", i, err)
		}
		perPrefix[p]++
	}
	if top, _ := filepath.Glob(filepath.Join(dir, "*.tar")); len(top) > 0 {
		t.Errorf("shards outside the prefixes' directories: %v", top)
	}
	if len(perPrefix) < 2 {
		t.Fatalf("%d shards in %d prefix of %d", shards, len(perPrefix), prefixes)
	}
	return dir, pattern, perPrefix
}

// gen --prefixes writes the shards under hashed key prefixes; index reads them back
// through the {hash:P} pattern gen printed and writes the index in the prefixes'
// parent; the loaders of a job of two ranks, given that pattern alone, find the index
// there and read every sample of the epoch exactly once.
func TestGenHashedPrefixesReadOnce(t *testing.T) {
	const shards, samples, prefixes = 12, 15, 4
	dir, pattern, _ := genHashed(t, shards, samples, prefixes)

	code, _, stderr := runCLI(t, "index", "--no-index-store", "--output", dir+"/", pattern)
	if code != 0 {
		t.Fatalf("index: exit %d: %s", code, stderr)
	}
	// The prefixes' directories are siblings: a loader looks for the index in their
	// parent, where it was written, without being told.
	idx := filepath.Join(dir, index.FileName)
	if strings.Contains(stderr, "give it --index") {
		t.Errorf("index said to give loaders --index, though they find it in the prefixes' parent: %s", stderr)
	}
	f, err := os.Open(idx)
	if err != nil {
		t.Fatal(err)
	}
	infos, err := index.Read(f, idx)
	f.Close()
	if err != nil || len(infos) != shards {
		t.Fatalf("index: %d entries, %v", len(infos), err)
	}
	for i, in := range infos {
		name := fmt.Sprintf("train-%06d.tar", i)
		if want := "/" + shard.HashPrefix(name, prefixes) + "/" + name; !strings.HasSuffix(in.URL, want) || in.Samples != samples {
			t.Errorf("entry %d: %s of %d samples, want ...%s of %d", i, in.URL, in.Samples, want, samples)
		}
	}

	cls, err := decode.ParseField("cls")
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	seen := map[string]int{}
	const world = 2
	for rank := range world {
		// No Index: with two ranks and no index found, Open would fail (ErrEstimated).
		l, err := shardload.Open(ctx, shardload.Config{URLs: []string{pattern}, NoIndexStore: true,
			World: world, Rank: rank, Seed: 3, Fields: []decode.Field{cls}, BatchSize: 4})
		if err != nil {
			t.Fatal(err)
		}
		for b, err := range l.All(ctx) {
			if err != nil {
				t.Fatal(err)
			}
			for _, k := range b.Keys() {
				seen[k]++
			}
			b.Release()
		}
		if st := l.Stats(); l.Plan().Estimated || st.Padded != 0 || st.Trimmed != 0 {
			t.Errorf("rank %d: estimated %v, %d padded, %d trimmed: want an exact epoch from the index", rank, l.Plan().Estimated, st.Padded, st.Trimmed)
		}
		l.Close()
	}
	for i := range shards {
		for j := range samples {
			if k := shardgen.Key(i, j); seen[k] != 1 {
				t.Errorf("sample %s read %d times", k, seen[k])
			}
		}
	}
	if len(seen) != shards*samples {
		t.Errorf("%d distinct samples read, want %d", len(seen), shards*samples)
	}

	// plan over the index finds the prefixes in the URLs.
	rep := planJSON(t, "--index", idx, "--nodes", "1", "--ranks-per-node", "2", "--batch-size", "4")
	counts := map[string]int{}
	for _, in := range infos {
		counts[filepath.Base(filepath.Dir(in.URL))]++
	}
	busiest := 0
	for _, n := range counts {
		busiest = max(busiest, n)
	}
	if rep.Prefixes != len(counts) || rep.PrefixBusiestShare != float64(busiest)/shards {
		t.Errorf("plan: %d prefixes, the busiest %.3f of the shards; the URLs: %d, %.3f", rep.Prefixes, rep.PrefixBusiestShare, len(counts), float64(busiest)/shards)
	}
	if !within(rep.PeakGetRatePerPrefix, rep.PeakGetRateOnePrefix*float64(busiest)/shards, 1e-9) {
		t.Errorf("plan: %.1f GET/s per prefix at the start, %.1f under one prefix", rep.PeakGetRatePerPrefix, rep.PeakGetRateOnePrefix)
	}
	// An index's prefixes are its URLs': --prefixes describes a synthetic dataset.
	if code, _, stderr := runCLI(t, "plan", "--index", idx, "--prefixes", "16"); code != 2 || !strings.Contains(stderr, "--prefixes") {
		t.Errorf("plan --index --prefixes: exit %d: %s", code, stderr)
	}
}

func TestGenPrefixesUsage(t *testing.T) {
	for _, p := range []string{"0", "-1", strconv.Itoa(shard.MaxHashPrefixes + 1)} {
		if code, _, stderr := runCLI(t, "gen", "--prefixes", p, t.TempDir()); code != 2 || !strings.Contains(stderr, "--prefixes") {
			t.Errorf("gen --prefixes %s: exit %d: %s", p, code, stderr)
		}
	}
	// One prefix is the flat layout of before.
	dir := t.TempDir()
	code, stdout, stderr := runCLI(t, "gen", "--shards", "2", "--samples", "1", "--prefixes", "1", dir)
	if code != 0 || stdout != filepath.Join(dir, "train-{000000..000001}.tar")+"\n" {
		t.Errorf("gen --prefixes 1: exit %d: %q %s", code, stdout, stderr)
	}
}

// plan's synthetic dataset over P prefixes is named as gen --prefixes names it, and
// plan reports the epoch-start and mean GET rates per prefix before (one prefix) and
// after (the busiest of P): the same requests, the busiest prefix's share of them.
func TestPlanPrefixesBeforeAfter(t *testing.T) {
	const shards, prefixes = 100000, 16
	job := []string{"--shards", strconv.Itoa(shards), "--samples-per-shard", "10", "--sample-bytes", "10KB",
		"--nodes", "200", "--ranks-per-node", "8", "--batch-size", "32", "--sample-nodes", "2"}
	before := planJSON(t, append(job, "--prefixes", "1")...)
	after := planJSON(t, append(job, "--prefixes", strconv.Itoa(prefixes))...)

	counts := map[string]int{}
	for i := range shards {
		counts[shard.HashPrefix(fmt.Sprintf("train-%07d.tar", i), prefixes)]++
	}
	busiest := 0
	for _, n := range counts {
		busiest = max(busiest, n)
	}
	share := float64(busiest) / shards
	if before.Prefixes != 1 || before.PrefixBusiestShare != 1 || after.Prefixes != prefixes || after.PrefixBusiestShare != share {
		t.Fatalf("prefixes %d and %d, busiest shares %v and %v; want 1 and %d, 1 and %v", before.Prefixes, after.Prefixes,
			before.PrefixBusiestShare, after.PrefixBusiestShare, prefixes, share)
	}
	if share < 1.0/prefixes || share > 1.1/prefixes {
		t.Errorf("the busiest of %d prefixes holds %.4f of the shards", prefixes, share)
	}
	// One prefix: the job's whole rate; the same figure is the "before" of P.
	if before.PeakGetRatePerPrefix != before.PeakGetRateOnePrefix || before.MeanGetRatePerPrefix != before.MeanGetRateOnePrefix {
		t.Errorf("one prefix: %.0f/%.0f per prefix, %.0f/%.0f in all", before.PeakGetRatePerPrefix, before.MeanGetRatePerPrefix, before.PeakGetRateOnePrefix, before.MeanGetRateOnePrefix)
	}
	if !within(after.PeakGetRateOnePrefix, before.PeakGetRatePerPrefix, 0.05) || !within(after.MeanGetRateOnePrefix, before.MeanGetRatePerPrefix, 0.05) {
		t.Errorf("before: %.0f/s at the start, %.0f/s mean; P's before: %.0f/s, %.0f/s", before.PeakGetRatePerPrefix, before.MeanGetRatePerPrefix, after.PeakGetRateOnePrefix, after.MeanGetRateOnePrefix)
	}
	if !within(after.PeakGetRatePerPrefix, after.PeakGetRateOnePrefix*share, 1e-9) || !within(after.MeanGetRatePerPrefix, after.MeanGetRateOnePrefix*share, 1e-9) ||
		!within(after.PeakGetRatePerPrefixSpread, before.PeakGetRatePerPrefixSpread*share, 0.05) {
		t.Errorf("after: %.0f/s at the start, %.0f/s mean, %.0f/s spread", after.PeakGetRatePerPrefix, after.MeanGetRatePerPrefix, after.PeakGetRatePerPrefixSpread)
	}
	// 200 nodes x 8 ranks x 8 open shards at once: over one prefix's 5,500 GET/s,
	// under it over 16.
	if !before.OverPrefixLimit || after.PeakGetRatePerPrefix > 5500 {
		t.Errorf("before %.0f/s (over: %v), after %.0f/s", before.PeakGetRatePerPrefix, before.OverPrefixLimit, after.PeakGetRatePerPrefix)
	}
	if want := int((max(before.PeakGetRatePerPrefix, before.MeanGetRatePerPrefix) + 5499) / 5500); before.PrefixesNeeded != want || want < 2 {
		t.Errorf("prefixes needed %d, want %d", before.PrefixesNeeded, want)
	}
	// The report prints both, and the advice names the prefixes it takes.
	code, stdout, _ := runCLI(t, append([]string{"plan"}, append(job, "--prefixes", strconv.Itoa(prefixes))...)...)
	if code != 0 || !strings.Contains(stdout, "prefixes, before and after: under one prefix") || !strings.Contains(stdout, fmt.Sprintf("over %d prefixes", prefixes)) {
		t.Errorf("plan: exit %d: %s", code, stdout)
	}
	code, stdout, _ = runCLI(t, append([]string{"plan"}, job...)...)
	if code != 0 || !strings.Contains(stdout, fmt.Sprintf("OVER the store's limit per prefix: expect 503 SlowDown (%d hashed prefixes or more", before.PrefixesNeeded)) {
		t.Errorf("plan over one prefix: exit %d: %s", code, stdout)
	}
	if code, _, stderr := runCLI(t, append([]string{"plan"}, append(job, "--prefixes", strconv.Itoa(shard.MaxHashPrefixes+1))...)...); code != 2 {
		t.Errorf("plan --prefixes over the most: exit %d: %s", code, stderr)
	}
}
