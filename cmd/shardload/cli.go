package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"strings"

	"github.com/spf13/pflag"

	"github.com/shardload/shardload/shard"
	"github.com/shardload/shardload/source"
)

// command is one subcommand: its flags are defined on fs, then run is called with the
// remaining arguments.
type command struct {
	name    string
	args    string // argument synopsis for the usage line
	short   string // one line for the command list
	summary string
	setup   func(fs *pflag.FlagSet) func(ctx context.Context, args []string, stdout, stderr io.Writer) error
}

var commands = []command{lsCommand, catCommand, benchCommand, genCommand}

// errUsage marks errors in how the command was called (exit status 2).
var errUsage = errors.New("usage")

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "help" || args[0] == "-h" || args[0] == "--help" {
		if len(args) > 1 {
			return run(ctx, []string{args[1], "--help"}, stdout, stderr)
		}
		usage(stdout)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	for _, c := range commands {
		if c.name != args[0] {
			continue
		}
		fs := pflag.NewFlagSet("shardload "+c.name, pflag.ContinueOnError)
		fs.SortFlags = false
		fs.SetOutput(stderr)
		runFn := c.setup(fs)
		fs.Usage = func() {
			fmt.Fprintf(stderr, "Usage: shardload %s [flags] %s\n\n%s\n\nFlags (each also set by SHARDLOAD_<FLAG> in the environment, e.g. SHARDLOAD_MAX_MEMBER_SIZE):\n%s",
				c.name, c.args, c.summary, fs.FlagUsages())
		}
		if err := fs.Parse(args[1:]); errors.Is(err, pflag.ErrHelp) {
			return 0
		} else if err != nil {
			fmt.Fprintf(stderr, "shardload %s: %s (see \"shardload %s --help\")\n", c.name, err, c.name)
			return 2
		}
		err := bindEnv(fs)
		if err == nil {
			err = runFn(ctx, fs.Args(), stdout, stderr)
		}
		if err == nil {
			return 0
		}
		fmt.Fprintf(stderr, "shardload %s: %s\n", c.name, oneLine(err))
		if errors.Is(err, errUsage) {
			return 2
		}
		return 1
	}
	fmt.Fprintf(stderr, "shardload: unknown command %q (run \"shardload help\")\n", args[0])
	return 2
}

func usage(w io.Writer) {
	fmt.Fprintf(w, "shardload streams WebDataset tar shards from S3 and local disk.\n\nUsage: shardload COMMAND [flags] [args]\n\nCommands:\n")
	for _, c := range commands {
		fmt.Fprintf(w, "  %-6s %s\n", c.name, c.short)
	}
	fmt.Fprintf(w, "\nURLs: s3://bucket/key (AWS credential chain; AWS_ENDPOINT_URL for MinIO), file:///abs/path\nor a plain path; brace patterns such as\n'train-{000000..000099}.tar' expand as in WebDataset. Run \"shardload COMMAND --help\".\n")
}

// oneLine keeps an error to one line so a user sees it whole.
func oneLine(err error) string {
	return strings.Join(strings.Fields(err.Error()), " ")
}

// bindEnv sets each flag not given on the command line from SHARDLOAD_<NAME>, where
// NAME is the flag's name upper-cased with dashes as underscores.
func bindEnv(fs *pflag.FlagSet) error {
	var err error
	fs.VisitAll(func(f *pflag.Flag) {
		if err != nil || f.Changed {
			return
		}
		name := "SHARDLOAD_" + strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_"))
		if v, ok := os.LookupEnv(name); ok {
			if e := fs.Set(f.Name, v); e != nil {
				err = fmt.Errorf("%s=%q: %v", name, v, e)
			}
		}
	})
	return err
}

// readFlags are the flags of every command that reads shards.
type readFlags struct {
	maxMember byteSize
}

func (rf *readFlags) register(fs *pflag.FlagSet) {
	rf.maxMember = shard.DefaultMaxMemberSize
	fs.Var(&rf.maxMember, "max-member-size", "largest tar member held in memory; a larger one fails its sample (e.g. 64MiB, 1GiB)")
}

// eachShard expands the URL patterns and calls fn with a Reader of each shard in turn.
func eachShard(ctx context.Context, patterns []string, rf *readFlags, sizesOnly bool, fn func(url string, r *shard.Reader) error) error {
	if len(patterns) == 0 {
		return fmt.Errorf("%w: no shard URLs given", errUsage)
	}
	urls, err := shard.ExpandAll(patterns)
	if err != nil {
		return err
	}
	for _, url := range urls {
		if err := ctx.Err(); err != nil {
			return err
		}
		body, err := source.Open(ctx, url)
		if err != nil {
			return err
		}
		r := shard.NewReader(body, shard.Options{URL: url, MaxMemberSize: int64(rf.maxMember), SizesOnly: sizesOnly})
		err = fn(url, r)
		r.Close()
		body.Close()
		if err != nil {
			return err
		}
	}
	return nil
}

// byteSize is a flag value in bytes that accepts suffixes: 512, 64KiB, 8MB, 1GiB, 2G.
type byteSize int64

func (b *byteSize) String() string { return formatBytes(int64(*b)) }

func (b *byteSize) Type() string { return "size" }

func (b *byteSize) Set(s string) error {
	v, err := parseBytes(s)
	if err != nil {
		return err
	}
	*b = byteSize(v)
	return nil
}

var byteUnits = map[string]int64{
	"": 1, "b": 1,
	"k": 1 << 10, "kb": 1e3, "kib": 1 << 10,
	"m": 1 << 20, "mb": 1e6, "mib": 1 << 20,
	"g": 1 << 30, "gb": 1e9, "gib": 1 << 30,
	"t": 1 << 40, "tb": 1e12, "tib": 1 << 40,
}

func parseBytes(s string) (int64, error) {
	t := strings.TrimSpace(s)
	i := strings.IndexFunc(t, func(r rune) bool { return (r < '0' || r > '9') && r != '.' })
	num, unit := t, ""
	if i >= 0 {
		num, unit = t[:i], strings.ToLower(strings.TrimSpace(t[i:]))
	}
	mult, ok := byteUnits[unit]
	f, err := strconv.ParseFloat(num, 64)
	if !ok || err != nil || f < 0 || f*float64(mult) > 1<<62 {
		return 0, fmt.Errorf("invalid size %q (use e.g. 512, 64KiB, 8MB, 1GiB)", s)
	}
	return int64(f * float64(mult)), nil
}

func formatBytes(n int64) string {
	units := []string{"B", "KiB", "MiB", "GiB", "TiB"}
	f, i := float64(n), 0
	for f >= 1024 && i < len(units)-1 && n%1024 == 0 {
		f /= 1024
		n /= 1024
		i++
	}
	return strconv.FormatFloat(f, 'f', -1, 64) + units[i]
}

func sortedExts(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for e := range m {
		out = append(out, e)
	}
	sort.Strings(out)
	return out
}
