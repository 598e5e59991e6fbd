//go:build !linux

package numa

import (
	"errors"
	"fmt"
	"runtime"
)

// ErrNotPermitted is wrapped by the errors of Bind and the affinity functions when
// the system refused. Outside Linux every one of them returns it.
var ErrNotPermitted = errors.New("numa: not permitted")

func unsupported(what string) error {
	return fmt.Errorf("%w: %s on %s: %w", ErrNotPermitted, what, runtime.GOOS, errors.ErrUnsupported)
}

// SetThreadAffinity is Linux's; elsewhere it returns an error.
func SetThreadAffinity(cpus []int) error { return unsupported("CPU affinity") }

// ThreadAffinity is Linux's; elsewhere it returns an error.
func ThreadAffinity() ([]int, error) { return nil, unsupported("CPU affinity") }

// LockThread is Linux's; elsewhere it returns an error.
func LockThread(cpus []int) (func(), error) { return nil, unsupported("CPU affinity") }

// SetProcessAffinity is Linux's; elsewhere it returns an error.
func SetProcessAffinity(cpus []int) error { return unsupported("CPU affinity") }

// Bind is Linux's; elsewhere it returns an error.
func Bind(mem []byte, node int) error { return unsupported("memory binding") }
