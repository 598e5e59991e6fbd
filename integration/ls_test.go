package integration

import (
	"bufio"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/shardload/shardload/internal/testutil"
)

// provenance is one row of testdata/README.md: a real shard and what WebDataset's
// grouping sees in it.
type provenance struct {
	file    string
	bytes   int64
	samples int
	exts    []string
}

// readProvenance parses the table of testdata/README.md, so the expectations are the
// ones written beside the files, not a copy of them.
func readProvenance(t *testing.T) []provenance {
	t.Helper()
	f, err := os.Open("../testdata/README.md")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var rows []provenance
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		cells := strings.Split(sc.Text(), "|")
		if len(cells) < 10 || !strings.Contains(cells[1], ".t") {
			continue
		}
		for i := range cells {
			cells[i] = strings.TrimSpace(cells[i])
		}
		size, err1 := strconv.ParseInt(cells[4], 10, 64)
		samples, err2 := strconv.Atoi(cells[7])
		if err1 != nil || err2 != nil {
			t.Fatalf("bad provenance row %q", sc.Text())
		}
		exts := strings.Fields(cells[8])
		slices.Sort(exts)
		rows = append(rows, provenance{file: cells[1], bytes: size, samples: samples, exts: exts})
	}
	if len(rows) < 6 {
		t.Fatalf("found %d provenance rows in testdata/README.md", len(rows))
	}
	return rows
}

type shardSummary struct {
	URL        string   `json:"url"`
	Samples    int      `json:"samples"`
	Extensions []string `json:"extensions"`
}

func parseSummaries(t *testing.T, out []byte) []shardSummary {
	t.Helper()
	var sums []shardSummary
	dec := json.NewDecoder(strings.NewReader(string(out)))
	for dec.More() {
		var s shardSummary
		if err := dec.Decode(&s); err != nil {
			t.Fatalf("ls --json output %q: %v", out, err)
		}
		sums = append(sums, s)
	}
	return sums
}

func checkSummaries(t *testing.T, rows []provenance, urls []string, sums []shardSummary) {
	t.Helper()
	if len(sums) != len(rows) {
		t.Fatalf("%d summaries for %d shards", len(sums), len(rows))
	}
	for i, row := range rows {
		s := sums[i]
		if s.URL != urls[i] || s.Samples != row.samples || !slices.Equal(s.Extensions, row.exts) {
			t.Errorf("%s: got %d samples %v, want %d samples %v", urls[i], s.Samples, s.Extensions, row.samples, row.exts)
		}
	}
}

func TestLsSummaryTestdataFile(t *testing.T) {
	rows := readProvenance(t)
	var urls []string
	for _, row := range rows {
		p, _ := filepath.Abs(filepath.Join("..", "testdata", row.file))
		if fi, err := os.Stat(p); err != nil || fi.Size() != row.bytes {
			t.Fatalf("%s: %v, size differs from provenance %d", p, err, row.bytes)
		}
		// Alternate plain paths and file:// URLs.
		if len(urls)%2 == 1 {
			p = "file://" + p
		}
		urls = append(urls, p)
	}
	checkSummaries(t, rows, urls, parseSummaries(t, ok(t, nil, append([]string{"ls", "--summary", "--json"}, urls...)...)))

	// The human form carries the same facts, one line per shard and a total.
	lines := strings.Split(strings.TrimSpace(string(ok(t, nil, append([]string{"ls", "--summary"}, urls...)...))), "\n")
	if len(lines) != len(rows)+1 {
		t.Fatalf("ls --summary printed %d lines: %q", len(lines), lines)
	}
	total := 0
	for i, row := range rows {
		want := urls[i] + "\t" + strconv.Itoa(row.samples) + " samples\t" + strings.Join(row.exts, " ")
		if lines[i] != want {
			t.Errorf("line %q, want %q", lines[i], want)
		}
		total += row.samples
	}
	if want := "total\t" + strconv.Itoa(total) + " samples\t" + strconv.Itoa(len(rows)) + " shards"; lines[len(rows)] != want {
		t.Errorf("last line %q, want %q", lines[len(rows)], want)
	}
}

func TestLsSummaryTestdataS3(t *testing.T) {
	rows := readProvenance(t)
	m := testutil.MinIO(t)
	m.CreateBucket(t, "real-shards")
	var urls []string
	for _, row := range rows {
		data, err := os.ReadFile(filepath.Join("..", "testdata", row.file))
		if err != nil {
			t.Fatal(err)
		}
		m.Put(t, "real-shards", "wds/"+row.file, data)
		urls = append(urls, "s3://real-shards/wds/"+row.file)
	}
	checkSummaries(t, rows, urls, parseSummaries(t, ok(t, m.Env(), append([]string{"ls", "--summary", "--json"}, urls...)...)))
}

// TestLsSamples checks the per-sample listing against the shard's members.
func TestLsSamples(t *testing.T) {
	out := ok(t, nil, "ls", "--json", "../testdata/pytorch-data__wds.tar")
	var n int
	dec := json.NewDecoder(strings.NewReader(string(out)))
	for dec.More() {
		var s struct {
			URL    string           `json:"url"`
			Key    string           `json:"key"`
			Fields map[string]int64 `json:"fields"`
		}
		if err := dec.Decode(&s); err != nil {
			t.Fatal(err)
		}
		if s.URL != "../testdata/pytorch-data__wds.tar" || s.Key != "data/"+strconv.Itoa(n) || len(s.Fields) != 2 || s.Fields["txt"] == 0 || s.Fields["bin"] == 0 {
			t.Errorf("sample %d: %+v", n, s)
		}
		n++
	}
	if n != 10 {
		t.Errorf("%d samples listed, want 10", n)
	}
	human := strings.Split(strings.TrimSpace(string(ok(t, nil, "ls", "../testdata/aistore__small-mnist-3.tar"))), "\n")
	if len(human) != 4 || human[0] != "../testdata/aistore__small-mnist-3.tar:" || !strings.HasPrefix(human[1], "  mnist-3/10000\tcls=1\timg=") {
		t.Errorf("human listing %q", human)
	}
}
