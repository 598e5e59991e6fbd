package source_test

import (
	"os"
	"testing"

	"github.com/shardload/shardload/source"
	"github.com/shardload/shardload/source/sourcetest"
)

// TestConformance runs the conformance suite against File, alone and behind a
// Fetcher in both modes.
func TestConformance(t *testing.T) {
	dir := t.TempDir()
	sourcetest.WriteDir(t, dir)
	sourcetest.Run(t, sourcetest.Backend{Src: &source.File{}, Base: "file://" + dir + "/", Lists: true})
}

// TestConformanceCustom runs the conformance suite against the custom source of
// ExampleRegister: a Source with neither ranged reads nor versions still passes,
// alone and behind a Fetcher.
func TestConformanceCustom(t *testing.T) {
	m := memSource{}
	sourcetest.Put(func(name string, data []byte) { m["mem://shards/"+name] = string(data) })
	sourcetest.Run(t, sourcetest.Backend{Src: m, Base: "mem://shards/", NoVersion: true})
}

// TestFileCreator runs the Creator checks against File.
func TestFileCreator(t *testing.T) {
	dir := t.TempDir()
	if err := os.Mkdir(dir+"/train", 0o755); err != nil {
		t.Fatal(err)
	}
	sourcetest.RunCreator(t, sourcetest.Writable{Src: &source.File{}, URL: func(name string) string { return "file://" + dir + "/" + name }})
}
