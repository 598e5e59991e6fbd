package source

import (
	"bytes"
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
)

// leftovers returns the names in dir other than want: temporary files a write left.
func leftovers(t *testing.T, dir string, want ...string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		keep := false
		for _, w := range want {
			keep = keep || e.Name() == w
		}
		if !keep {
			out = append(out, e.Name())
		}
	}
	return out
}

func writeAll(t *testing.T, c Creator, ctx context.Context, url string, chunks ...[]byte) error {
	t.Helper()
	w, err := c.Create(ctx, url)
	if err != nil {
		return err
	}
	for _, p := range chunks {
		if _, err := w.Write(p); err != nil {
			w.Close()
			return err
		}
	}
	return w.Close()
}

func TestFileCreate(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "shardload.index")
	f := &File{}
	for _, url := range []string{path, "file://" + path} {
		data := []byte("written as " + url)
		if err := writeAll(t, f, t.Context(), url, data[:5], data[5:]); err != nil {
			t.Fatalf("write %s: %v", url, err)
		}
		got, err := os.ReadFile(path)
		if err != nil || !bytes.Equal(got, data) {
			t.Errorf("after writing %s: %q, %v; want %q", url, got, err, data)
		}
		fi, err := os.Stat(path)
		if err != nil || fi.Mode().Perm() != 0o644 {
			t.Errorf("mode %v, %v; want 0644", fi.Mode(), err)
		}
		if left := leftovers(t, dir, "shardload.index"); len(left) > 0 {
			t.Errorf("left behind: %q", left)
		}
	}
	// A relative plain path, from the working directory.
	t.Chdir(dir)
	if err := writeAll(t, f, t.Context(), "rel.index", []byte("rel")); err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(filepath.Join(dir, "rel.index")); err != nil || string(got) != "rel" {
		t.Errorf("relative path: %q, %v", got, err)
	}
	// An empty object.
	if err := writeAll(t, f, t.Context(), "empty"); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(filepath.Join(dir, "empty")); err != nil || fi.Size() != 0 {
		t.Errorf("empty object: %v, %v", fi, err)
	}
}

// A write that is abandoned or fails leaves the previous file as it was, and no
// temporary file.
func TestFileCreateAtomic(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "x.index")
	old := []byte("the previous index")
	if err := os.WriteFile(path, old, 0o644); err != nil {
		t.Fatal(err)
	}
	check := func(t *testing.T) {
		t.Helper()
		if got, err := os.ReadFile(path); err != nil || !bytes.Equal(got, old) {
			t.Errorf("file now %q, %v; want the previous one kept", got, err)
		}
		if left := leftovers(t, dir, "x.index"); len(left) > 0 {
			t.Errorf("left behind: %q", left)
		}
	}
	f := &File{}

	t.Run("canceled before close", func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		w, err := f.Create(ctx, path)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.Write([]byte("half an ind")); err != nil {
			t.Fatal(err)
		}
		cancel()
		if err := w.Close(); !errors.Is(err, context.Canceled) {
			t.Errorf("Close after cancel = %v; want context.Canceled", err)
		}
		if err := w.Close(); !errors.Is(err, context.Canceled) {
			t.Errorf("second Close = %v; want the first's error", err)
		}
		check(t)
	})

	t.Run("canceled before write", func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		w, err := f.Create(ctx, path)
		if err != nil {
			t.Fatal(err)
		}
		cancel()
		if _, err := w.Write([]byte("x")); !errors.Is(err, context.Canceled) {
			t.Errorf("Write after cancel = %v; want context.Canceled", err)
		}
		var se *Error
		if err := w.Close(); !errors.Is(err, context.Canceled) || !errors.As(err, &se) || se.URL != path {
			t.Errorf("Close = %v; want an *Error wrapping context.Canceled", err)
		}
		check(t)
	})

	t.Run("canceled, no previous object", func(t *testing.T) {
		fresh := filepath.Join(dir, "fresh.index")
		ctx, cancel := context.WithCancel(t.Context())
		w, err := f.Create(ctx, fresh)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.Write([]byte("half")); err != nil {
			t.Fatal(err)
		}
		cancel()
		if err := w.Close(); !errors.Is(err, context.Canceled) {
			t.Errorf("Close after cancel = %v; want context.Canceled", err)
		}
		if _, err := os.Stat(fresh); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("Stat after an abandoned write = %v; want no file", err)
		}
		check(t)
	})

	t.Run("canceled before create", func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		if _, err := f.Create(ctx, path); !errors.Is(err, context.Canceled) {
			t.Errorf("Create = %v; want context.Canceled", err)
		}
		check(t)
	})
}

func TestFileCreateErrors(t *testing.T) {
	dir := t.TempDir()
	f := &File{}
	tests := []struct {
		name, url string
		want      error
	}{
		{"missing directory", filepath.Join(dir, "no", "such", "dir", "x"), ErrNotFound},
		{"a directory", dir, errIsDir},
		{"trailing slash", dir + "/", errIsDir},
		{"relative file URL", "file://rel/x", nil},
		{"not a file URL", "s3://b/k", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w, err := f.Create(t.Context(), tt.url)
			var se *Error
			if err == nil || !errors.As(err, &se) || se.Op != "create" || (tt.want != nil && !errors.Is(err, tt.want)) {
				if w != nil {
					w.Close()
				}
				t.Errorf("Create(%q) = %v; want a create *Error wrapping %v", tt.url, err, tt.want)
			}
		})
	}
	if os.Geteuid() != 0 {
		ro := t.TempDir()
		if err := os.Chmod(ro, 0o555); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.Chmod(ro, 0o755) })
		if _, err := f.Create(t.Context(), filepath.Join(ro, "x")); !errors.Is(err, ErrPermission) || !errors.Is(err, fs.ErrPermission) {
			t.Errorf("Create in a read-only directory = %v; want ErrPermission", err)
		}
	}
}

// A plain Source, as a library user registers: it reads but cannot write.
type readOnly struct{ Source }

func TestRegistryCreate(t *testing.T) {
	dir := t.TempDir()
	var r Registry
	// Behind a Fetcher, as the cloud backends are registered: Create unwraps it.
	r.Register("file", NewFetcher(&File{}, FetchOptions{}))
	r.Register("ro", readOnly{&File{}})
	r.Register("ro2", NewFetcher(readOnly{&File{}}, FetchOptions{}))
	path := filepath.Join(dir, "a")
	if err := writeAll(t, &r, t.Context(), path, []byte("abc")); err != nil {
		t.Fatal(err)
	}
	rc, err := r.Open(t.Context(), path)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := readAll(t, rc); err != nil || string(got) != "abc" {
		t.Errorf("read back %q, %v", got, err)
	}
	for _, url := range []string{"ro:///x", "ro2:///x"} {
		_, err := r.Create(t.Context(), url)
		var se *Error
		if !errors.Is(err, ErrNotCreator) || !errors.As(err, &se) || se.Op != "create" || se.URL != url {
			t.Errorf("Create(%q) = %v; want a create *Error wrapping ErrNotCreator", url, err)
		}
	}
	_, err = r.Create(t.Context(), "nope://x/y")
	var se *Error
	if !errors.Is(err, ErrUnknownScheme) || !errors.As(err, &se) || se.Op != "create" {
		t.Errorf("Create of an unknown scheme = %v; want a create *Error wrapping ErrUnknownScheme", err)
	}
	if CreatorOf(readOnly{&File{}}) != nil || CreatorOf(NewFetcher(&File{}, FetchOptions{})) == nil || CreatorOf(&r) == nil {
		t.Error("CreatorOf: want nil for a read-only source only")
	}
	// A registry registered in another is a Creator too.
	var outer Registry
	outer.Register("file", &r)
	if err := writeAll(t, &outer, t.Context(), path, []byte("def")); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(path); string(got) != "def" {
		t.Errorf("through two registries: %q", got)
	}
}
