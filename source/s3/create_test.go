package s3

import (
	"bytes"
	"context"
	"errors"
	"testing"

	"github.com/shardload/shardload/internal/testenv"
	"github.com/shardload/shardload/source"
	"github.com/shardload/shardload/source/sourcetest"
)

// put writes chunks to url through c and closes the writer.
func put(t *testing.T, c source.Creator, ctx context.Context, url string, chunks ...[]byte) error {
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

// TestS3CreateMinIO writes objects to a real MinIO server and reads them back.
func TestS3CreateMinIO(t *testing.T) {
	srv := testenv.MinIO(t)
	isolateAWS(t)
	srv.SetEnv(t)
	srv.CreateBucket(t, "out")
	s := &Source{}
	data := sourcetest.Data(3<<20 + 5)
	url := "s3://out/train/shardload.index"

	readBack := func(t *testing.T, want []byte) {
		t.Helper()
		info, err := s.Stat(t.Context(), url)
		if err != nil || info.Size != int64(len(want)) || info.Version == "" {
			t.Fatalf("Stat = %+v, %v; want %d bytes and a version", info, err, len(want))
		}
		rc, err := s.Open(t.Context(), url)
		if err != nil {
			t.Fatal(err)
		}
		if got, err := sourcetest.ReadAll(t, rc); err != nil || !bytes.Equal(got, want) {
			t.Errorf("read back %d bytes, %v; want the %d written", len(got), err, len(want))
		}
	}

	if err := put(t, s, t.Context(), url, data[:1000], data[1000:]); err != nil {
		t.Fatal(err)
	}
	readBack(t, data)

	t.Run("overwrite", func(t *testing.T) {
		data = sourcetest.Data(1234)
		if err := put(t, s, t.Context(), url, data); err != nil {
			t.Fatal(err)
		}
		readBack(t, data)
	})

	t.Run("canceled keeps the previous object", func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		w, err := s.Create(ctx, url)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.Write([]byte("half an index")); err != nil {
			t.Fatal(err)
		}
		cancel()
		if err := w.Close(); !errors.Is(err, context.Canceled) {
			t.Errorf("Close after cancel = %v; want context.Canceled", err)
		}
		readBack(t, data)
	})

	t.Run("canceled writes nothing", func(t *testing.T) {
		fresh := "s3://out/never.index"
		ctx, cancel := context.WithCancel(t.Context())
		w, err := s.Create(ctx, fresh)
		if err != nil {
			t.Fatal(err)
		}
		w.Write([]byte("x"))
		cancel()
		if err := w.Close(); err == nil {
			t.Error("Close after cancel succeeded")
		}
		if _, err := s.Stat(t.Context(), fresh); !errors.Is(err, source.ErrNotFound) {
			t.Errorf("Stat = %v; want no object", err)
		}
	})

	t.Run("empty", func(t *testing.T) {
		if err := put(t, s, t.Context(), "s3://out/empty"); err != nil {
			t.Fatal(err)
		}
		if info, err := s.Stat(t.Context(), "s3://out/empty"); err != nil || info.Size != 0 {
			t.Errorf("Stat = %+v, %v", info, err)
		}
	})

	t.Run("through a registry", func(t *testing.T) {
		// Behind a Fetcher, as Register puts it: Registry.Create unwraps it.
		var r source.Registry
		Register(&r, source.FetchOptions{})
		data = []byte("via the registry")
		if err := put(t, &r, t.Context(), url, data); err != nil {
			t.Fatal(err)
		}
		readBack(t, data)
	})

	t.Run("no bucket", func(t *testing.T) {
		err := put(t, s, t.Context(), "s3://no-such-bucket/x", []byte("x"))
		var se *source.Error
		if !errors.Is(err, source.ErrNotFound) || !errors.As(err, &se) || se.Op != "write" {
			t.Errorf("write to a missing bucket = %v; want a write *source.Error wrapping ErrNotFound", err)
		}
	})

	t.Run("bad URL", func(t *testing.T) {
		for _, u := range []string{"s3://out", "s3://out/", "gs://out/x"} {
			if _, err := s.Create(t.Context(), u); err == nil {
				t.Errorf("Create(%q) succeeded", u)
			}
		}
	})
}
