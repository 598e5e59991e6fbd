package sourcetest

import (
	"bytes"
	"context"
	"errors"
	"testing"

	"github.com/shardload/shardload/source"
)

// Write creates url through c, writes chunks and closes the writer; it returns the
// first error.
func Write(ctx context.Context, c source.Creator, url string, chunks ...[]byte) error {
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

// Writable is a Source that can write objects (source.Creator), and where: URL returns
// the URL of an object name in a place it may write. Size is the size of the first
// object written (default 3 MiB and 5 bytes): above a backend's upload chunk where it
// uploads in chunks.
type Writable struct {
	Src interface {
		source.Source
		source.Creator
	}
	URL  func(name string) string
	Size int
	// Registry, when set, is a registry that reads and writes the same place (the
	// backend behind a Fetcher, as its Register puts it): a write through it must
	// reach Src, Registry.Create unwrapping what the registry holds.
	Registry *source.Registry
}

// RunCreator checks the source.Creator contract on w: an object written in pieces
// reads back whole with a version; an overwrite replaces it; a write whose context is
// canceled before Close fails with context.Canceled and leaves the previous object
// as it was, or no object, whether it wrote nothing, a little or more than Size; an
// empty object can be written.
func RunCreator(t *testing.T, w Writable) {
	if w.Size == 0 {
		w.Size = 3<<20 + 5
	}
	url := w.URL("train/shardload.index")
	data := Data(w.Size)
	readBack := func(t *testing.T, url string, want []byte) {
		t.Helper()
		info, err := w.Src.Stat(t.Context(), url)
		if err != nil || info.Size != int64(len(want)) || info.Version == "" {
			t.Fatalf("Stat = %+v, %v; want %d bytes and a version", info, err, len(want))
		}
		rc, err := w.Src.Open(t.Context(), url)
		if err != nil {
			t.Fatal(err)
		}
		if got, err := ReadAll(t, rc); err != nil || !bytes.Equal(got, want) {
			t.Errorf("read back %d bytes, %v; want the %d written", len(got), err, len(want))
		}
	}
	if err := Write(t.Context(), w.Src, url, data[:1000], data[1000:]); err != nil {
		t.Fatal(err)
	}
	readBack(t, url, data)

	t.Run("overwrite", func(t *testing.T) {
		data = Data(1234)
		if err := Write(t.Context(), w.Src, url, data); err != nil {
			t.Fatal(err)
		}
		readBack(t, url, data)
	})

	// cancel writes chunk to url and cancels the write before Close.
	cancel := func(t *testing.T, url string, chunk []byte) {
		t.Helper()
		ctx, cancel := context.WithCancel(t.Context())
		wc, err := w.Src.Create(ctx, url)
		if err != nil {
			t.Fatal(err)
		}
		if chunk != nil {
			if _, err := wc.Write(chunk); err != nil {
				t.Fatal(err)
			}
		}
		cancel()
		if err := wc.Close(); !errors.Is(err, context.Canceled) {
			t.Errorf("Close after cancel = %v; want context.Canceled", err)
		}
	}
	t.Run("canceled keeps the previous object", func(t *testing.T) {
		cancel(t, url, []byte("half an index"))
		readBack(t, url, data)
	})
	for name, chunk := range map[string][]byte{"nothing written": nil, "small": []byte("x"), "large": Data(w.Size)} {
		t.Run("canceled writes nothing/"+name, func(t *testing.T) {
			fresh := w.URL("never-" + name)
			cancel(t, fresh, chunk)
			if _, err := w.Src.Stat(t.Context(), fresh); !errors.Is(err, source.ErrNotFound) {
				t.Errorf("Stat = %v; want no object", err)
			}
		})
	}

	t.Run("empty", func(t *testing.T) {
		if err := Write(t.Context(), w.Src, w.URL("empty")); err != nil {
			t.Fatal(err)
		}
		if info, err := w.Src.Stat(t.Context(), w.URL("empty")); err != nil || info.Size != 0 {
			t.Errorf("Stat = %+v, %v", info, err)
		}
	})

	if w.Registry != nil {
		t.Run("through a registry", func(t *testing.T) {
			url, data := w.URL("registry/x"), []byte("via the registry")
			if err := Write(t.Context(), w.Registry, url, data); err != nil {
				t.Fatal(err)
			}
			readBack(t, url, data)
		})
	}
}
