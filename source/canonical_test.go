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

// CanonicalAll and a Canonicalizer give what Canonical gives, with the working
// directory they read first, until a new one is made.
func TestCanonicalizer(t *testing.T) {
	root, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	a, b := filepath.Join(root, "a"), filepath.Join(root, "b")
	for _, d := range []string{a, b} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	t.Chdir(a)
	urls := []string{"x.tar", "./sub/../y.tar", "/abs/z.tar", "s3://B/k", "HTTPS://H:443/p", "file://" + b + "/w.tar"}
	all := CanonicalAll(urls)
	var c Canonicalizer
	for i, u := range urls {
		if want := Canonical(u); all[i] != want || c.Canonical(u) != want {
			t.Errorf("%q: CanonicalAll %q, Canonicalizer %q, Canonical %q", u, all[i], c.Canonical(u), want)
		}
	}
	if want := "file://" + filepath.Join(a, "x.tar"); all[0] != want {
		t.Errorf("x.tar in a: %q, want %q", all[0], want)
	}
	t.Chdir(b)
	if got, want := c.Canonical("x.tar"), "file://"+filepath.Join(a, "x.tar"); got != want {
		t.Errorf("a Canonicalizer made in a, after a change to b: %q, want %q", got, want)
	}
	if got, want := CanonicalAll([]string{"x.tar"})[0], "file://"+filepath.Join(b, "x.tar"); got != want {
		t.Errorf("CanonicalAll in b: %q, want %q", got, want)
	}
}
