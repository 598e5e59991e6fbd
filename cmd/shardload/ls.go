package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/pflag"

	"github.com/shardload/shardload/index"
	"github.com/shardload/shardload/shard"
)

var lsCommand = command{
	name:  "ls",
	short: "samples of shards: key, fields, sizes (--json, --summary)",
	args:  "URL...",
	summary: `List the samples of shards as a WebDataset reader groups them: per sample its key and
its fields (extension and size in bytes). Member data is skipped, not read into memory.
With --summary, one line per shard: sample count and the sorted set of extensions.`,
	setup: func(fs *pflag.FlagSet) func(context.Context, []string, io.Writer, io.Writer) error {
		var rf readFlags
		rf.register(fs)
		summary := fs.Bool("summary", false, "one line per shard: sample count and sorted extensions")
		asJSON := fs.Bool("json", false, `one JSON object per line: per sample {"url","key","fields":{ext:bytes}}, with --summary per shard {"url","samples","extensions"}`)
		return func(ctx context.Context, args []string, stdout, _ io.Writer) error {
			w := bufio.NewWriter(stdout)
			err := ls(ctx, args, &rf, *summary, *asJSON, w)
			if ferr := w.Flush(); err == nil {
				err = ferr
			}
			return err
		}
	},
}

type lsSample struct {
	URL    string           `json:"url"`
	Key    string           `json:"key"`
	Fields map[string]int64 `json:"fields"`
}

type lsShard struct {
	URL        string   `json:"url"`
	Samples    int      `json:"samples"`
	Extensions []string `json:"extensions"`
}

func ls(ctx context.Context, args []string, rf *readFlags, summary, asJSON bool, w *bufio.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	var totalSamples, shards int
	err := eachShard(ctx, args, rf, shard.Options{SizesOnly: true}, func(url string, r *shard.Reader, rec *index.Recorder) error {
		n, exts := 0, map[string]bool{}
		if !summary && !asJSON {
			fmt.Fprintf(w, "%s:\n", url)
		}
		for {
			s, err := r.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				return err
			}
			rec.Add(s, nil)
			n++
			switch {
			case summary:
				for _, f := range s.Fields {
					exts[f.Ext] = true
				}
			case asJSON:
				fields := make(map[string]int64, len(s.Fields))
				for _, f := range s.Fields {
					fields[f.Ext] = f.Size
				}
				if err := enc.Encode(lsSample{URL: url, Key: s.Key, Fields: fields}); err != nil {
					return err
				}
			default:
				var b strings.Builder
				b.WriteString("  ")
				b.WriteString(s.Key)
				for _, f := range s.Fields {
					fmt.Fprintf(&b, "\t%s=%d", f.Ext, f.Size)
				}
				b.WriteByte('\n')
				w.WriteString(b.String())
			}
		}
		totalSamples += n
		shards++
		if !summary {
			return nil
		}
		if asJSON {
			return enc.Encode(lsShard{URL: url, Samples: n, Extensions: sortedExts(exts)})
		}
		_, err := fmt.Fprintf(w, "%s\t%d samples\t%s\n", url, n, strings.Join(sortedExts(exts), " "))
		return err
	})
	if err == nil && summary && !asJSON && shards > 1 {
		fmt.Fprintf(w, "total\t%d samples\t%d shards\n", totalSamples, shards)
	}
	return err
}
