package source

import (
	"os"
	"path/filepath"
	"testing"
)

// Every spelling of one local file, and of one remote object, has one canonical
// form; different objects keep different ones.
func TestCanonical(t *testing.T) {
	root := t.TempDir()
	real, err := filepath.EvalSymlinks(root)
	if err != nil {
		t.Fatal(err)
	}
	data := filepath.Join(real, "data")
	if err := os.MkdirAll(filepath.Join(data, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(data, filepath.Join(real, "link")); err != nil {
		t.Fatal(err)
	}
	t.Chdir(real)
	want := "file://" + filepath.Join(data, "x.tar")
	for _, u := range []string{
		"data/x.tar", "./data/x.tar", "data//x.tar", "data/sub/../x.tar", " data/x.tar ",
		filepath.Join(data, "x.tar"), "file://" + filepath.Join(data, "x.tar"), "FILE://" + filepath.Join(data, "x.tar"),
		"link/x.tar", "file://" + filepath.Join(real, "link", "x.tar"),
	} {
		if got := Canonical(u); got != want {
			t.Errorf("Canonical(%q) = %q, want %q", u, got, want)
		}
	}
	t.Chdir(data)
	if got := Canonical("x.tar"); got != want {
		t.Errorf("Canonical(x.tar) in its directory = %q, want %q", got, want)
	}
	if got := Canonical("y.tar"); got == want {
		t.Errorf("another file has the same canonical form %q", got)
	}
	for _, tt := range [][2]string{
		{"S3://bucket/train/x.tar", "s3://bucket/train/x.tar"},
		{"s3://bucket/train/x.tar", "s3://bucket/train/x.tar"},
		{"gs://b/x.tar", "gs://b/x.tar"},
		{"HTTPS://Data.Example:443/a/x.tar?sig=1", "https://data.example/a/x.tar?sig=1"},
		{"http://data.example:8080/a/X.tar", "http://data.example:8080/a/X.tar"},
		{"http://data.example:80/a", "http://data.example/a"},
	} {
		if got := Canonical(tt[0]); got != tt[1] {
			t.Errorf("Canonical(%q) = %q, want %q", tt[0], got, tt[1])
		}
	}
	if Canonical("s3://bucket/a/x.tar") == Canonical("s3://bucket/a//x.tar") {
		t.Error("S3 keys a/x.tar and a//x.tar are different objects")
	}
}
