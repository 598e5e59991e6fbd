package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/schollz/progressbar/v3"
	"github.com/spf13/pflag"
	"golang.org/x/term"

	"github.com/shardload/shardload/cache"
	"github.com/shardload/shardload/shard"
	"github.com/shardload/shardload/source"
)

var warmCommand = command{
	name:  "warm",
	short: "fetch shards into the cache before training starts, with a progress bar",
	args:  "--cache-dir DIR URL...",
	summary: `Fetch the shards into the disk cache at --cache-dir, so that later commands and the
loader read them from local disk. Shards already cached at the version the source
holds are skipped, so a second run (after an interruption, or when some shards
changed) fetches only what is missing or stale. Shards that do not all fit in
--cache-disk are refused: the last would evict the first. Local files are not cached.
Progress is a bar when stdout is a terminal, one line per shard otherwise.`,
	setup: func(fs *pflag.FlagSet) func(context.Context, []string, io.Writer, io.Writer) error {
		var rf readFlags
		rf.register(fs)
		concurrency := fs.IntP("concurrency", "j", cache.DefaultWarmConcurrency, "shards fetched at once")
		dryRun := fs.Bool("dry-run", false, "say what would be fetched and whether it fits, and fetch nothing (exit 1 if it does not fit or a shard cannot be read)")
		progress := fs.String("progress", "auto", "auto (a bar on a terminal, else lines), bar, lines or none")
		return func(ctx context.Context, args []string, stdout, stderr io.Writer) error {
			return warm(ctx, args, &rf, *concurrency, *dryRun, *progress, stdout, stderr)
		}
	},
}

func warm(ctx context.Context, patterns []string, rf *readFlags, concurrency int, dryRun bool, progress string, stdout, stderr io.Writer) error {
	switch {
	case len(patterns) == 0:
		return fmt.Errorf("%w: no shard URLs given", errUsage)
	case rf.cacheDir == "":
		return fmt.Errorf("%w: warm needs --cache-dir (or SHARDLOAD_CACHE_DIR)", errUsage)
	case concurrency < 1:
		return fmt.Errorf("%w: --concurrency must be at least 1", errUsage)
	}
	switch progress {
	case "auto":
		progress = "lines"
		out := stdout
		if u, ok := out.(interface{ Unwrap() io.Writer }); ok {
			out = u.Unwrap()
		}
		if f, ok := out.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
			progress = "bar"
		}
	case "bar", "lines", "none":
	default:
		return fmt.Errorf("%w: --progress %q: want auto, bar, lines or none", errUsage, progress)
	}
	all, err := shard.ExpandAll(patterns)
	if err != nil {
		return err
	}
	remote, err := rf.remote()
	if err != nil {
		return err
	}
	if all, err = remote.Expand(ctx, all); err != nil {
		return err
	}
	var urls []string
	local := 0
	for _, u := range all {
		if source.Scheme(u) == "file" {
			local++
			continue
		}
		urls = append(urls, u)
	}
	opts, err := rf.cacheOptions()
	if err != nil {
		return err
	}
	c, err := cache.New(opts, remote)
	if err != nil {
		return err
	}
	defer c.Close()

	p, err := c.Plan(ctx, urls, concurrency)
	if err != nil {
		return err
	}
	for _, e := range p.Entries {
		if e.State == cache.Unknown {
			rf.logf()("shardload warm: %s", oneLine(e.Err))
		}
	}
	if local > 0 {
		fmt.Fprintf(stdout, "warm: %d local files left out (they are not cached)\n", local)
	}
	fits := "fits"
	if !p.Fits {
		fits = "does NOT fit"
	}
	fmt.Fprintf(stdout, "warm: %d shards, %s: %d cached, %d to fetch (%s); %s in --cache-disk %s (%s needed)\n",
		len(p.Entries), megabytes(p.Bytes), p.Cached, p.Fetch, megabytes(p.FetchBytes), fits, formatBytes(p.Budget), megabytes(p.Need))
	var problem error
	switch {
	case !p.Fits:
		problem = fmt.Errorf("the shards need %s, more than --cache-disk %s: the last would evict the first", megabytes(p.Need), formatBytes(p.Budget))
	case p.Errors > 0:
		problem = fmt.Errorf("%d of %d shards could not be read (listed above)", p.Errors, len(p.Entries))
	}
	if dryRun {
		for _, e := range p.Entries {
			if e.State == cache.Missing || e.State == cache.Stale {
				fmt.Fprintf(stdout, "would fetch %s\t%s\t%s\n", e.URL, megabytes(e.Size), e.State)
			}
		}
		return problem
	}
	if !p.Fits {
		return problem
	}

	start := time.Now()
	var done, failed int
	var got int64
	var bar *progressbar.ProgressBar
	if progress == "bar" && p.Fetch > 0 {
		bar = progressbar.NewOptions64(p.FetchBytes,
			progressbar.OptionSetWriter(stdout),
			progressbar.OptionSetDescription(fmt.Sprintf("0/%d shards", p.Fetch)),
			progressbar.OptionShowBytes(true),
			progressbar.OptionSetPredictTime(true),
			progressbar.OptionSetElapsedTime(true),
			progressbar.OptionSetWidth(30),
			progressbar.OptionThrottle(100*time.Millisecond),
			progressbar.OptionShowElapsedTimeOnFinish(),
			progressbar.OptionOnCompletion(func() { fmt.Fprintln(stdout) }),
		)
	}
	err = c.Warm(ctx, p, cache.WarmOptions{Concurrency: concurrency, Progress: func(ev cache.WarmEvent) {
		got += ev.Bytes
		if bar != nil && ev.Bytes > 0 {
			bar.Add64(ev.Bytes)
		}
		if !ev.Done {
			return
		}
		done++
		if ev.Err != nil {
			failed++
		}
		switch {
		case bar != nil:
			bar.Describe(fmt.Sprintf("%d/%d shards", done, p.Fetch))
			if ev.Err != nil {
				bar.Clear()
				rf.logf()("shardload warm: %s", oneLine(ev.Err))
			}
		case progress == "lines":
			secs := time.Since(start).Seconds()
			rate := float64(got) / secs
			eta := "?"
			if rate > 0 {
				eta = (time.Duration(float64(p.FetchBytes-got)/rate) * time.Second).Round(time.Second).String()
			}
			status := "fetched"
			if ev.Err != nil {
				status = "FAILED"
			}
			fmt.Fprintf(stdout, "warm: %d/%d shards, %s of %s, %.1f MB/s, ETA %s: %s %s\n",
				done, p.Fetch, megabytes(got), megabytes(p.FetchBytes), rate/1e6, eta, status, ev.URL)
			if ev.Err != nil {
				rf.logf()("shardload warm: %s", oneLine(ev.Err))
			}
		}
	}})
	if bar != nil {
		bar.Finish()
	}
	secs := time.Since(start).Seconds()
	fmt.Fprintf(stdout, "warm: fetched %d shards, %s in %.1fs (%.1f MB/s); %d were cached already\n",
		done-failed, megabytes(got), secs, float64(got)/1e6/max(secs, 1e-9), p.Cached)
	if err != nil {
		if errors.Is(err, context.Canceled) {
			return err
		}
		return fmt.Errorf("%d of %d shards failed; first: %s", failed, p.Fetch, firstJoined(err))
	}
	return problem
}

// firstJoined returns the first of the errors joined in err.
func firstJoined(err error) error {
	if j, ok := err.(interface{ Unwrap() []error }); ok && len(j.Unwrap()) > 0 {
		return j.Unwrap()[0]
	}
	return err
}

// megabytes formats a byte count in MB.
func megabytes(n int64) string {
	switch {
	case n >= 1e9:
		return fmt.Sprintf("%.2f GB", float64(n)/1e9)
	case n >= 1e6:
		return fmt.Sprintf("%.1f MB", float64(n)/1e6)
	}
	return fmt.Sprintf("%d bytes", n)
}
