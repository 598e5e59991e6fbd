package main

import (
	"archive/tar"
	"bufio"
	"context"
	"fmt"
	"io"
	"time"

	"github.com/spf13/pflag"

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
		stats := fs.Bool("stats", false, "print shards, samples, bytes and MB/s to stderr at the end")
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
	tw := tar.NewWriter(bw)
	var (
		shards, samples  int
		stored, tarBytes int64
		lastKey, lastURL string
	)
	// Members are streamed from the shard to the output as they come: cat holds no
	// sample in memory, whatever its members' sizes.
	var (
		curURL     string
		firstOfURL bool
		buf        = make([]byte, 256<<10)
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
	err := eachShard(ctx, args, rf, shard.Options{Stream: stream}, func(url string, r *shard.Reader) error {
		curURL, firstOfURL = url, true
		for {
			s, err := r.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				return err
			}
			samples++
			lastKey, lastURL = s.Key, url
		}
		shards++
		stored += r.StoredBytes()
		return nil
	})
	if err != nil {
		// Flush the complete samples, padded, but leave out the end marker.
		tw.Flush()
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
	}
	return nil
}
