package testutil

import (
	"testing"
	"time"
)

// WaitFor polls cond every millisecond until it holds; the deadline (20 s) only
// stops a test whose condition never comes, naming what it waited for.
func WaitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}
