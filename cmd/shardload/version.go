package main

import (
	"context"
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
	"strings"

	"github.com/spf13/pflag"
)

var versionCommand = command{
	name:    "version",
	short:   "the version of this binary (module, commit, Go)",
	summary: `Print the version of this binary, from its build information: the module version, the VCS commit and its time (and "modified" for a tree with changes), and the Go version and platform. "shardload --version" prints the same.`,
	setup: func(fs *pflag.FlagSet) func(context.Context, []string, io.Writer, io.Writer) error {
		return func(_ context.Context, args []string, stdout, _ io.Writer) error {
			if len(args) > 0 {
				return fmt.Errorf("%w: version takes no arguments", errUsage)
			}
			fmt.Fprintln(stdout, versionLine())
			return nil
		}
	},
}

// version and revision, when a build sets them (go build -ldflags "-X
// main.version=V -X main.revision=R", as the Dockerfile does: a build without the
// repository's .git has no VCS information), win over the build information's.
var version, revision string

// versionLine is "shardload VERSION (commit C, TIME[, modified]) goX OS/ARCH".
func versionLine() string {
	version, details := version, []string{}
	if version == "" {
		version = "(devel)"
	}
	if revision != "" {
		details = append(details, "commit "+revision[:min(12, len(revision))])
	}
	if bi, ok := debug.ReadBuildInfo(); ok && revision == "" {
		if v := bi.Main.Version; v != "" && version == "(devel)" {
			version = v
		}
		var rev, at string
		modified := false
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.time":
				at = s.Value
			case "vcs.modified":
				modified = s.Value == "true"
			}
		}
		if rev != "" {
			details = append(details, "commit "+rev[:min(12, len(rev))])
		}
		if at != "" {
			details = append(details, at)
		}
		if modified {
			details = append(details, "modified")
		}
	}
	line := "shardload " + version
	if len(details) > 0 {
		line += " (" + strings.Join(details, ", ") + ")"
	}
	return line + " " + runtime.Version() + " " + runtime.GOOS + "/" + runtime.GOARCH
}
