package shardload_test

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestLayoutTable: the README's layout table names every Go package and every
// top-level directory of the tree, and nothing that is not there.
func TestLayoutTable(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, table, ok := strings.Cut(string(readme), "\n## Layout\n")
	if !ok {
		t.Fatal("README.md has no Layout section")
	}
	if i := strings.Index(table, "\n## "); i >= 0 {
		table = table[:i]
	}
	named := map[string]bool{}
	code := regexp.MustCompile("`([^`]+)`")
	for _, line := range strings.Split(table, "\n") {
		cells := strings.Split(line, "|")
		if len(cells) < 3 || !strings.HasPrefix(line, "| `") {
			continue
		}
		for _, m := range code.FindAllStringSubmatch(cells[1], -1) {
			named[strings.TrimSuffix(m[1], "/")] = true
		}
	}
	for name := range named {
		if name == "shardload" {
			continue // the root
		}
		if _, err := os.Stat(name); err != nil {
			t.Errorf("the layout table names %s, which is not in the tree", name)
		}
	}
	// Every directory with Go code (testdata and hidden directories aside).
	filepath.WalkDir(".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && p != "." && (d.Name() == "testdata" || strings.HasPrefix(d.Name(), ".") || d.Name() == "__pycache__") {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(p, ".go") && filepath.Dir(p) != "." && !named[filepath.Dir(p)] {
			t.Errorf("the layout table does not name %s (Go package)", filepath.Dir(p))
			named[filepath.Dir(p)] = true // once
		}
		return nil
	})
	// Every top-level directory the repository tracks.
	entries, err := os.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.IsDir() && !named[e.Name()] && !under(named, e.Name()) && !strings.HasPrefix(e.Name(), ".") && !ignored(e.Name()) {
			t.Errorf("the layout table does not name the directory %s", e.Name())
		}
	}
}

// under reports whether a path under dir is named.
func under(named map[string]bool, dir string) bool {
	for name := range named {
		if strings.HasPrefix(name, dir+"/") {
			return true
		}
	}
	return false
}

// ignored are the build outputs .gitignore names at the top level.
func ignored(name string) bool {
	return name == "bin" || name == "gcs-data"
}
