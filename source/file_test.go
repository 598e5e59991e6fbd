package source

import (
	"bytes"
	"context"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// writeFile writes data to name in a fresh temporary directory and returns its path.
func writeFile(t *testing.T, name string, data []byte) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func readAll(t *testing.T, rc io.ReadCloser) ([]byte, error) {
	t.Helper()
	b, err := io.ReadAll(rc)
	if cerr := rc.Close(); cerr != nil {
		t.Errorf("Close: %v", cerr)
	}
	return b, err
}

func TestFileStatOpen(t *testing.T) {
	data := []byte("0123456789abcdef")
	path := writeFile(t, "shard-000.tar", data)
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	// A relative plain path, from the working directory.
	t.Chdir(filepath.Dir(path))

	for _, url := range []string{path, "file://" + path, "shard-000.tar", "./shard-000.tar"} {
		t.Run(url, func(t *testing.T) {
			info, err := (&File{}).Stat(t.Context(), url)
			if err != nil {
				t.Fatalf("Stat: %v", err)
			}
			want := Info{URL: url, Size: int64(len(data)), Version: info.Version, ModTime: fi.ModTime()}
			if info != want || info.Version == "" {
				t.Errorf("Stat = %+v, want %+v with a Version", info, want)
			}
			rc, err := (&File{}).Open(t.Context(), url)
			if err != nil {
				t.Fatalf("Open: %v", err)
			}
			if got, err := readAll(t, rc); err != nil || !bytes.Equal(got, data) {
				t.Errorf("Open read %q, %v; want %q", got, err, data)
			}
		})
	}
}

func TestFileVersionChanges(t *testing.T) {
	path := writeFile(t, "a.tar", []byte("one"))
	before, err := (&File{}).Stat(t.Context(), path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte("three"), 0o644); err != nil {
		t.Fatal(err)
	}
	after, err := (&File{}).Stat(t.Context(), path)
	if err != nil {
		t.Fatal(err)
	}
	if before.Version == after.Version {
		t.Errorf("Version %q did not change when the file did", before.Version)
	}
}

func TestFileOpenRange(t *testing.T) {
	data := []byte("0123456789")
	path := writeFile(t, "r.tar", data)
	tests := []struct {
		name        string
		off, length int64
		want        string
	}{
		{"start", 0, 3, "012"},
		{"middle", 4, 3, "456"},
		{"end", 7, 3, "789"},
		{"to end", 6, -1, "6789"},
		{"whole", 0, -1, "0123456789"},
		{"zero length", 5, 0, ""},
		{"cut at end", 8, 100, "89"},
		{"at end", 10, 5, ""},
		{"past end", 20, 5, ""},
		{"past end to end", 20, -1, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rc, err := (&File{}).OpenRange(t.Context(), path, tt.off, tt.length)
			if err != nil {
				t.Fatalf("OpenRange(%d, %d): %v", tt.off, tt.length, err)
			}
			got, err := readAll(t, rc)
			if err != nil || string(got) != tt.want {
				t.Errorf("OpenRange(%d, %d) read %q, %v; want %q", tt.off, tt.length, got, err, tt.want)
			}
		})
	}
	if _, err := (&File{}).OpenRange(t.Context(), path, -1, 2); err == nil {
		t.Error("OpenRange with a negative offset: no error")
	}
}

func TestFileErrors(t *testing.T) {
	dir := t.TempDir()
	missing := filepath.Join(dir, "missing.tar")
	tests := []struct {
		name string
		url  string
		is   []error // errors.Is must hold for each
	}{
		{"missing path", missing, []error{ErrNotFound, fs.ErrNotExist}},
		{"missing file URL", "file://" + missing, []error{ErrNotFound, fs.ErrNotExist}},
		{"directory", dir, []error{errIsDir}},
		{"relative file URL", "file://relative/x.tar", nil},
		{"empty path", "", nil},
		{"other scheme", "s3://bucket/key", nil},
	}
	ops := map[string]func(ctx context.Context, url string) error{
		"stat": func(ctx context.Context, url string) error { _, err := (&File{}).Stat(ctx, url); return err },
		"open": func(ctx context.Context, url string) error { _, err := (&File{}).Open(ctx, url); return err },
	}
	for _, tt := range tests {
		for op, f := range ops {
			t.Run(tt.name+"/"+op, func(t *testing.T) {
				err := f(t.Context(), tt.url)
				var se *Error
				if !errors.As(err, &se) || se.Op != op || se.URL != tt.url {
					t.Fatalf("%s(%q) = %v; want an *Error with Op %q and the URL", op, tt.url, err, op)
				}
				for _, target := range tt.is {
					if !errors.Is(err, target) {
						t.Errorf("%s(%q) = %v; want errors.Is %v", op, tt.url, err, target)
					}
				}
			})
		}
	}
}

func TestFilePermission(t *testing.T) {
	if os.Geteuid() == 0 {
		t.Skip("root ignores file permissions")
	}
	path := writeFile(t, "secret.tar", []byte("x"))
	if err := os.Chmod(path, 0); err != nil {
		t.Fatal(err)
	}
	_, err := (&File{}).Open(t.Context(), path)
	if !errors.Is(err, ErrPermission) || !errors.Is(err, fs.ErrPermission) {
		t.Errorf("Open of an unreadable file = %v; want ErrPermission", err)
	}
}

func TestFileTruncatedWhileReading(t *testing.T) {
	data := bytes.Repeat([]byte("abcdefgh"), 1024)
	path := writeFile(t, "t.tar", data)
	for _, tt := range []struct {
		name string
		open func(ctx context.Context) (io.ReadCloser, error)
	}{
		{"open", func(ctx context.Context) (io.ReadCloser, error) { return (&File{}).Open(ctx, path) }},
		{"range", func(ctx context.Context) (io.ReadCloser, error) { return (&File{}).OpenRange(ctx, path, 100, 4000) }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if err := os.WriteFile(path, data, 0o644); err != nil {
				t.Fatal(err)
			}
			rc, err := tt.open(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			defer rc.Close()
			head := make([]byte, 50)
			if _, err := io.ReadFull(rc, head); err != nil {
				t.Fatal(err)
			}
			if err := os.Truncate(path, 1000); err != nil {
				t.Fatal(err)
			}
			_, err = io.ReadAll(rc)
			var se *Error
			if !errors.Is(err, ErrShortRead) || !errors.As(err, &se) || se.Op != "read" || se.URL != path {
				t.Fatalf("reading a truncated file: %v; want a read *Error wrapping ErrShortRead", err)
			}
		})
	}
}

func TestFileGrownWhileReading(t *testing.T) {
	path := writeFile(t, "g.tar", []byte("0123456789"))
	rc, err := (&File{}).Open(t.Context(), path)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString("appended"); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if got, err := readAll(t, rc); err != nil || string(got) != "0123456789" {
		t.Errorf("read %q, %v; want the size seen at open", got, err)
	}
}

func TestFileCanceled(t *testing.T) {
	path := writeFile(t, "c.tar", []byte("0123456789"))
	ctx, cancel := context.WithCancel(t.Context())
	rc, err := (&File{}).Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	cancel()
	if _, err := rc.Read(make([]byte, 4)); !errors.Is(err, context.Canceled) {
		t.Errorf("Read after cancel = %v; want context.Canceled", err)
	}
	if _, err := (&File{}).Open(ctx, path); !errors.Is(err, context.Canceled) {
		t.Errorf("Open with a canceled context = %v; want context.Canceled", err)
	}
}

func TestRegistry(t *testing.T) {
	path := writeFile(t, "reg.tar", []byte("payload"))
	var r Registry
	r.Register("file", &File{})

	rc, err := r.Open(t.Context(), "FILE://"+path)
	if err != nil {
		t.Fatalf("Open via registry: %v", err)
	}
	if got, err := readAll(t, rc); err != nil || string(got) != "payload" {
		t.Errorf("read %q, %v", got, err)
	}
	if info, err := r.Stat(t.Context(), path); err != nil || info.Size != 7 {
		t.Errorf("Stat via registry = %+v, %v", info, err)
	}

	for _, url := range []string{"gopher://host/x.tar", "s3://b/k"} {
		_, err := r.Open(t.Context(), url)
		var se *Error
		if !errors.Is(err, ErrUnknownScheme) || !errors.As(err, &se) || se.URL != url {
			t.Errorf("Open(%q) = %v; want an *Error wrapping ErrUnknownScheme", url, err)
		}
		if _, err := r.Stat(t.Context(), url); !errors.Is(err, ErrUnknownScheme) {
			t.Errorf("Stat(%q) = %v; want ErrUnknownScheme", url, err)
		}
	}
	if got := strings.Join(r.Schemes(), ","); got != "file" {
		t.Errorf("Schemes() = %q", got)
	}
}
