package main

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"fmt"
	"github.com/shardload/shardload/cache"
	"io"
	"time"

	"github.com/spf13/pflag"

	"github.com/shardload/shardload/index"
	"github.com/shardload/shardload/shard"
)

var catCommand = command{
	name:  "cat",
	short: "all samples as one tar stream on stdout (for WebDataset pipe: URLs)",
	args:  "URL... > out.tar",
	summary: `Write all samples of the shards, in order, as one uncompressed tar on stdout: what a
WebDataset reader would see, readable through a "pipe:shardload cat URL" URL. Compressed
shards are decompressed; directories, links and metadata members are left out. On an
error the stream ends without its end-of-archive marker, so a reader sees it as cut
short, and the command exits non-zero.`,
	setup: func(fs *pflag.FlagSet) func(context.Context, []string, io.Writer, io.Writer) error {
		var rf readFlags
		rf.register(fs)
		stats := fs.Bool("stats", false, "print shards, samples, bytes and MB/s to stderr at the end (and, with --cache-dir, what the cache did)")
		return func(ctx context.Context, args []string, stdout, stderr io.Writer) error {
			return cat(ctx, args, &rf, *stats, stdout, stderr)
		}
	},
}

// epoch is the modification time of every member cat writes: the output depends only
// on the samples.
var epoch = time.Unix(0, 0)

func cat(ctx context.Context, args []string, rf *readFlags, stats bool, stdout, stderr io.Writer) error {
	start := time.Now()
	bw := bufio.NewWriterSize(stdout, 1<<20)
	// Members go from the shard to the output as they come (shard.Options.Stream).
	// A sample's are held back until the sample is complete, up to wholeSample
	// bytes, so that a failure leaves only complete samples in the output; a larger
	// sample is passed on as it streams, and cat holds no more than wholeSample
	// whatever the samples' sizes.
	out := &sampleWriter{w: bw}
	tw := tar.NewWriter(out)
	var (
		shards, samples  int
		stored, tarBytes int64
		lastKey, lastURL string
		curURL           string
		firstOfURL       bool
		buf              = make([]byte, 256<<10)
	)
	stream := func(key string, f shard.Field, data io.Reader) error {
		if firstOfURL && samples > 0 && key == lastKey {
			// In one stream the two samples would merge into one.
			return fmt.Errorf("sample key %q ends %s and starts %s: in one tar stream they would merge into one sample", key, lastURL, curURL)
		}
		firstOfURL = false
		hdr := &tar.Header{Name: f.Name, Mode: 0o644, Size: f.Size, ModTime: epoch, Typeflag: tar.TypeReg}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		n, err := io.CopyBuffer(tw, data, buf)
		tarBytes += n
		return err
	}
	err := eachShard(ctx, args, rf, shard.Options{Stream: stream}, func(url string, r *shard.Reader, rec *index.Recorder) error {
		curURL, firstOfURL = url, true
		for {
			s, err := r.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				return err
			}
			// The sample is complete: its last member's padding, then all of it.
			if err := tw.Flush(); err != nil {
				return err
			}
			if err := out.sampleDone(); err != nil {
				return err
			}
			rec.Add(s, nil)
			samples++
			lastKey, lastURL = s.Key, url
		}
		shards++
		stored += r.StoredBytes()
		return nil
	})
	if err != nil {
		// Write out the complete samples, but neither the part of the one that
		// failed (unless it was too large to hold) nor the end marker.
		out.discard()
		bw.Flush()
		return err
	}
	if err := tw.Close(); err != nil {
		return err
	}
	if err := bw.Flush(); err != nil {
		return err
	}
	if stats {
		secs := time.Since(start).Seconds()
		fmt.Fprintf(stderr, "cat: %d shards, %d samples, %.1f MB stored, %.1f MB of members in %.2fs: %.0f samples/s, %.1f MB/s\n",
			shards, samples, float64(stored)/1e6, float64(tarBytes)/1e6, secs, float64(samples)/secs, float64(tarBytes)/1e6/secs)
		if rf.cache != nil {
			fmt.Fprintln(stderr, "cat: "+cacheSummary(rf.cache.Stats()))
		}
	}
	return nil
}

// wholeSample is the most bytes of one sample cat holds back until the sample is
// complete.
const wholeSample = 64 << 20

// sampleWriter holds back the tar bytes of the sample being written until
// sampleDone, or until they pass wholeSample: then it writes them out and lets the
// rest of that sample through as it comes.
type sampleWriter struct {
	w       io.Writer
	held    bytes.Buffer
	through bool // the current sample is too large to hold
	dropped bool // after discard, everything is dropped
}

func (s *sampleWriter) Write(p []byte) (int, error) {
	switch {
	case s.dropped:
		return len(p), nil
	case s.through:
		return s.w.Write(p)
	case s.held.Len()+len(p) > wholeSample:
		s.through = true
		if _, err := s.w.Write(s.held.Bytes()); err != nil {
			return 0, err
		}
		s.held.Reset()
		return s.w.Write(p)
	}
	return s.held.Write(p)
}

// sampleDone writes out the sample held back.
func (s *sampleWriter) sampleDone() error {
	_, err := s.w.Write(s.held.Bytes())
	s.held.Reset()
	s.through = false
	return err
}

// discard drops the sample held back and everything written after.
func (s *sampleWriter) discard() {
	s.held.Reset()
	s.dropped = true
}

// cacheSummary is one line of what the node's shard cache did for this process.
func cacheSummary(st cache.Stats) string {
	return fmt.Sprintf("cache: %d opens from disk, %d from memory, %d fetched, %d joined a fetch, %d read past the cache; %d blocks checked; %d version checks shared; %d stale, %d corrupt, %d write errors",
		st.DiskHits, st.MemoryHits, st.Fetches, st.Joined, st.Bypassed, st.BlocksChecked, st.ValidationsShared, st.Stale, st.Corrupt, st.WriteErrors)
}
