package testenv

import (
	"errors"
	"fmt"
	"os"
	"testing"
)

// launch finds a server's binary, starts it with start (again, up to three times in
// all, when another process took its port first), and stops it when the test ends; a
// test that failed gets the tail of the server's log. A missing binary fails the test
// in CI and skips it loudly elsewhere.
func launch[S any](t testing.TB, name, bin, binEnv string, start func(testing.TB, string) (S, error), stop func(S), logPath func(S) string) S {
	t.Helper()
	if _, err := os.Stat(bin); err != nil {
		msg := fmt.Sprintf("testenv: %s binary not found (%v): run scripts/tools.sh to build it, or set %s", name, err, binEnv)
		if inCI() {
			t.Fatal(msg)
		}
		t.Skip("SKIPPED, NOT TESTED: " + msg)
	}
	var lastErr error
	for range 3 {
		s, err := start(t, bin)
		if err == nil {
			t.Cleanup(func() {
				stop(s)
				if t.Failed() {
					t.Logf("testenv: %s log tail (%s):\n%s", name, logPath(s), tail(logPath(s), 40))
				}
			})
			return s
		}
		lastErr = err
		if !errors.Is(err, errPortTaken) {
			break
		}
	}
	t.Fatalf("testenv: %v", lastErr)
	var zero S
	return zero
}
