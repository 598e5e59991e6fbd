// Package logs adapts the loader's loggers: Printf-style calls onto a *slog.Logger,
// and lines said once per logger.
package logs

import (
	"context"
	"fmt"
	"log/slog"
	"reflect"
	"strings"
	"sync"
)

// Printf adapts l to Printf-style calls: each line a record, at level Warn when it
// says it is a warning, else Info.
func Printf(l *slog.Logger) func(format string, args ...any) {
	return func(format string, args ...any) {
		msg := strings.TrimSuffix(fmt.Sprintf(format, args...), "\n")
		level := slog.LevelInfo
		if strings.Contains(msg, "warning:") {
			level = slog.LevelWarn
		}
		l.Log(context.Background(), level, msg)
	}
}

// Key returns the identity of the logger that logger (when not nil), else logf (when
// not nil), else slog.Default() is: a Logger by its pointer, a Printf-style function
// by its code (closures of one function count as one logger).
func Key(logger *slog.Logger, logf func(string, ...any)) any {
	switch {
	case logger != nil:
		return logger
	case logf != nil:
		return reflect.ValueOf(logf).Pointer()
	}
	return slog.Default()
}

// said holds the lines said once per logger: at most maxSaid, after which it starts
// afresh (a line may then be said again).
var said = struct {
	sync.Mutex
	m map[onceKey]bool
}{m: map[onceKey]bool{}}

const maxSaid = 1 << 12

type onceKey struct {
	what   string
	logger any
}

// Once calls f unless a line of the kind what went to the logger of key (Key) already
// in this process: a warning that every epoch or session would repeat is said once
// per logger, whatever logger came first.
func Once(key any, what string, f func()) {
	k := onceKey{what, key}
	said.Lock()
	done := said.m[k]
	if !done {
		if len(said.m) >= maxSaid {
			clear(said.m)
		}
		said.m[k] = true
	}
	said.Unlock()
	if !done {
		f()
	}
}
