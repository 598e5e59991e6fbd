package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/spf13/pflag"
	"golang.org/x/term"

	"github.com/shardload/shardload/index"
	"github.com/shardload/shardload/shard"
	"github.com/shardload/shardload/source"
)

var indexCommand = command{
	name:  "index",
	short: "write the dataset index (sample counts, offsets, member sizes) a loader plans from",
	args:  "URL...",
	summary: `Write the dataset index of the shards: per shard its URL, object version and size,
sample count, for uncompressed shards each sample's byte offset, and each sample's
members and their sizes (for 1-D .npy members, their element type and count). A
release before member sizes (index format version 2) refuses such an index: give it
one written with --no-sizes. A loader given the
same URLs finds an index named ` + index.FileName + ` beside the shards (or one given with
--index) and plans its epochs without reading any shard; shards written since are read
to count them, and a shard that changed is counted again.

Each shard is read once, headers only where the source can seek (and the headers of
.npy members), --workers at a time; those the node's index store holds at their
current version, with their member sizes, are not read again. With
--output, an index already beside the shards is not trusted: every entry comes from the
store or a fresh read. A listing ('DIR/', a glob) leaves out ` + index.FileName + ` itself.

The index goes to stdout, or to --output: a local path, an s3:// or gs:// URL, or a
directory or prefix ending in "/" for DIR/` + index.FileName + `; it is written whole or
not at all (an earlier index stays when this one fails). zstd-compressed, with the
offsets in blocks a loader reads only for the shards its rank plans to read, unless
--no-compress (plain JSON lines, read whole by every rank). Progress and a summary go
to stderr.`,
	setup: func(fs *pflag.FlagSet) func(context.Context, []string, io.Writer, io.Writer) error {
		var rf readFlags
		rf.register(fs)
		output := fs.StringP("output", "o", "", `where to write the index: a path, s3:// or gs:// URL; one ending in "/" means DIR/`+index.FileName+` (default: stdout)`)
		workers := fs.Int("workers", 16, "shards read (or stat'ed) at once")
		noCompress := fs.Bool("no-compress", false, "write plain JSON lines instead of zstd")
		noSizes := fs.Bool("no-sizes", false, "write no member sizes: an index of format version 1, which releases before version 2 read too")
		return func(ctx context.Context, args []string, stdout, stderr io.Writer) error {
			return writeIndex(ctx, args, &rf, indexOptions{output: *output, workers: *workers, compress: !*noCompress, noSizes: *noSizes}, stdout, stderr)
		}
	},
}

type indexOptions struct {
	output   string
	workers  int
	compress bool
	noSizes  bool // no members: format version 1
}

// outputURL returns where --output writes: "DIR/" and an existing local directory
// mean DIR/shardload.index.
func outputURL(output string) string {
	if strings.HasSuffix(output, "/") {
		return output + index.FileName
	}
	if source.Scheme(output) == "file" {
		p := output
		if _, rest, ok := strings.Cut(output, "://"); ok {
			p = rest
		}
		if fi, err := os.Stat(p); err == nil && fi.IsDir() {
			return output + "/" + index.FileName
		}
	}
	return output
}

// unwrapWriter returns the writer under the command line's redacting writer: the
// index is bytes (zstd), and its URLs are written without secrets by index.Write.
func unwrapWriter(w io.Writer) io.Writer {
	for {
		u, ok := w.(interface{ Unwrap() io.Writer })
		if !ok {
			return w
		}
		w = u.Unwrap()
	}
}

func isTerminal(w io.Writer) bool {
	f, ok := unwrapWriter(w).(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

func writeIndex(ctx context.Context, patterns []string, rf *readFlags, o indexOptions, stdout, stderr io.Writer) (err error) {
	start := time.Now()
	switch {
	case len(patterns) == 0:
		return fmt.Errorf("%w: no shard URLs given", errUsage)
	case o.workers < 1:
		return fmt.Errorf("%w: --workers %d: want at least 1", errUsage, o.workers)
	}
	prog := &progressLine{w: stderr, tty: isTerminal(stderr)}

	// The output is checked, and its writer created, before any shard is read: one
	// that cannot be written fails first. The writer comes after the listing, which
	// would otherwise find its temporary file.
	var (
		out    io.Writer
		dest   = "stdout"
		remote *source.Registry
	)
	if o.output == "" || o.output == "-" {
		out = unwrapWriter(stdout)
		if o.compress && isTerminal(stdout) {
			return fmt.Errorf("%w: not writing a zstd index to a terminal: give --output, or --no-compress", errUsage)
		}
	} else {
		dest = outputURL(o.output)
		if remote, err = rf.remote(); err != nil { // writes never go through the cache
			return err
		}
		src, lerr := remote.Lookup(dest)
		if lerr != nil {
			return fmt.Errorf("%w: --output %s: %v", errUsage, dest, errors.Unwrap(lerr))
		}
		if source.CreatorOf(src) == nil {
			return fmt.Errorf("%w: --output %s: %s:// URLs cannot be written; give a local path, or an s3:// or gs:// URL", errUsage, dest, source.Scheme(dest))
		}
	}

	urls, err := shard.ExpandAll(patterns)
	if err != nil {
		return err
	}
	defer rf.closeCache()
	reg := rf.sources()
	if urls, err = reg.Expand(ctx, urls); err != nil {
		return err
	}
	urls = index.Omit(urls)
	if len(urls) == 0 {
		return fmt.Errorf("no shards: the URLs name only %s", index.FileName)
	}

	var w io.WriteCloser
	if remote != nil {
		wctx, cancel := context.WithCancel(ctx)
		defer cancel()
		if w, err = remote.Create(wctx, dest); err != nil {
			return err
		}
		defer func() {
			if err != nil { // abandon the write: the object stays as it was
				cancel()
				w.Close()
			}
		}()
		out = w
	}

	lk := index.Lookup{
		Sources:     reg,
		NoBeside:    dest != "stdout",
		WantMembers: !o.noSizes,
		Workers:     o.workers,
		Reader:      shard.Options{MaxMemberSize: int64(rf.maxMember)},
		Progress:    prog.update,
		Logf:        prog.logf,
	}
	if !rf.noIndex && rf.indexDir != "" {
		if lk.Store, err = index.OpenStore(rf.indexDir); err != nil {
			prog.logf("shardload: warning: %v (shards are read, and their entries not kept)", err)
			lk.Store = nil
		}
	}
	infos, err := lk.Resolve(ctx, urls)
	prog.end()
	if err != nil {
		return err
	}
	for i := range infos {
		// Local shards under one spelling (file:///abs/path), which every loader
		// finds whatever directory it runs in and however it names them.
		if source.Scheme(infos[i].URL) == "file" {
			infos[i].URL = source.Canonical(infos[i].URL)
		}
		if o.noSizes {
			infos[i].Members = nil
		}
	}
	cw := &countingWriter{w: out}
	write := func(w io.Writer, infos []shard.Info) error { return index.Write(w, infos, false) }
	if o.compress {
		// zstd, offsets addressable: a rank reads those of the shards it plans to read.
		write = index.WriteAddressable
	}
	if err := write(cw, infos); err != nil {
		return fmt.Errorf("writing the index to %s: %w", dest, err)
	}
	if w != nil {
		if err := w.Close(); err != nil {
			return err
		}
	}
	samples, offsets := 0, 0
	for _, info := range infos {
		samples += info.Samples
		if info.Offsets != nil {
			offsets++
		}
	}
	kind := "zstd"
	if !o.compress {
		kind = "plain"
	}
	fmt.Fprintf(stderr, "shardload index: %d shards (%d with sample offsets), %d samples: %d bytes of index (%s) written to %s in %s\n",
		len(infos), offsets, samples, cw.n, kind, dest, time.Since(start).Round(time.Millisecond))
	if index.Beside(urls) == "" {
		// Shards in unrelated directories (hashed key prefixes, {hash:P}, are sibling
		// directories: their index is found in the parent).
		where := dest
		if dest == "stdout" {
			where = "with the index's path or URL"
		}
		fmt.Fprintf(stderr, "shardload index: a loader finds no index beside these shards (they are neither in one directory nor in sibling directories, or they are http(s) URLs): give it --index %s\n", where)
	}
	return nil
}

type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// progressLine reports shards read: one line rewritten in place on a terminal, a line
// at every tenth of the way otherwise. Log lines are written between.
type progressLine struct {
	mu    sync.Mutex
	w     io.Writer
	tty   bool
	open  bool // a progress line without its newline is on the terminal
	last  time.Time
	tenth int
}

func (p *progressLine) update(done, total int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.tty {
		if done < total && time.Since(p.last) < 100*time.Millisecond {
			return
		}
		p.last = time.Now()
		fmt.Fprintf(p.w, "\rshardload index: indexed %d/%d shards", done, total)
		p.open = true
		return
	}
	if t := done * 10 / max(total, 1); t > p.tenth {
		p.tenth = t
		fmt.Fprintf(p.w, "shardload index: indexed %d/%d shards\n", done, total)
	}
}

func (p *progressLine) logf(format string, args ...any) {
	if strings.HasPrefix(format, "shardload: no index for these") {
		return // the lookup's advice to write an index, while one is being written
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.open {
		fmt.Fprintln(p.w)
		p.open = false
	}
	fmt.Fprintf(p.w, strings.TrimSuffix(format, "\n")+"\n", args...)
}

// end ends the progress line on a terminal.
func (p *progressLine) end() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.open {
		fmt.Fprintln(p.w)
		p.open = false
	}
}
