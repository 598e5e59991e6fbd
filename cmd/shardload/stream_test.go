package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/pflag"
)

func TestParseStream(t *testing.T) {
	for _, tt := range []struct {
		in     string
		urls   int
		weight float64
		repeat float64
		choose int64
		err    bool
	}{
		{in: "s3://b/a-{0..9}.tar weight=0.7", urls: 1, weight: 0.7},
		{in: "a.tar b.tar repeat=2.5", urls: 2, repeat: 2.5},
		{in: "  a.tar   choose=100 ", urls: 1, choose: 100},
		{in: "a.tar", urls: 1},
		{in: "weight=1", err: true},
		{in: "a.tar weight=x", err: true},
		{in: "a.tar choose=1.5", err: true},
	} {
		st, err := parseStream(tt.in)
		if (err != nil) != tt.err {
			t.Fatalf("%q: %v", tt.in, err)
		}
		if err == nil && (len(st.URLs) != tt.urls || st.Weight != tt.weight || st.Repeat != tt.repeat || st.Choose != tt.choose) {
			t.Fatalf("%q: %+v", tt.in, st)
		}
	}
}

// The streams file and the flags: one or the other, and settings of a mix only.
func TestMixFlags(t *testing.T) {
	file := filepath.Join(t.TempDir(), "mix.json")
	os.WriteFile(file, []byte(`[{"urls": ["a.tar"], "weight": 0.7}, {"urls": ["b-{0..3}.tar"], "choose": 10}]`), 0o644)
	bad := filepath.Join(t.TempDir(), "bad.json")
	os.WriteFile(bad, []byte(`[{"url": "a.tar"}]`), 0o644)
	for _, tt := range []struct {
		args    []string
		streams int
		err     string
	}{
		{args: []string{"--streams", file, "--epoch-samples", "50", "--batching", "stratified"}, streams: 2},
		{args: []string{"--stream", "a.tar weight=1", "--stream", "b.tar weight=2"}, streams: 2},
		{args: []string{"--streams", bad}, err: "unknown field"},
		{args: []string{"--streams", file, "--stream", "a.tar"}, err: "both"},
		{args: []string{"--stream", "a.tar", "c.tar"}, err: "not both"},
		{args: []string{"--epoch-samples", "5", "c.tar"}, err: "settings of a mix"},
		{args: []string{"--stream", "a.tar", "--batching", "zigzag"}, err: "--batching"},
	} {
		var lf loaderFlags
		fs := pflag.NewFlagSet("bench", pflag.ContinueOnError)
		lf.register(fs, true)
		if err := fs.Parse(tt.args); err != nil {
			t.Fatal(err)
		}
		cfg, err := lf.config(fs.Args(), os.Stderr)
		if tt.err != "" {
			if err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Fatalf("%v: %v, want an error with %q", tt.args, err, tt.err)
			}
			continue
		}
		if err != nil || len(cfg.Streams) != tt.streams {
			t.Fatalf("%v: %d streams, %v", tt.args, len(cfg.Streams), err)
		}
	}
}

func FuzzParseStream(f *testing.F) {
	f.Add("s3://b/a-{0..9}.tar weight=0.7")
	f.Add("a b repeat=2 choose=3")
	f.Fuzz(func(t *testing.T, s string) {
		st, err := parseStream(s)
		if err == nil && len(st.URLs) == 0 {
			t.Fatalf("%q: no URLs and no error", s)
		}
		for _, u := range st.URLs {
			if u == "" || strings.ContainsAny(u, " \t\n") {
				t.Fatalf("%q: URL %q", s, u)
			}
		}
	})
}
