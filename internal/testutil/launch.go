package testutil

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"testing"
	"time"
)

// launch finds a server's binary, starts it with start (again, up to three times in
// all, when another process took its port first), and stops it when the test ends; a
// test that failed gets the tail of the server's log. A missing binary fails the test
// in CI and skips it loudly elsewhere.
func launch[S any](t testing.TB, name, bin, binEnv string, start func(testing.TB, string) (S, error), stop func(S), logPath func(S) string) S {
	t.Helper()
	if _, err := os.Stat(bin); err != nil {
		msg := fmt.Sprintf("testutil: %s binary not found (%v): run scripts/tools.sh to build it, or set %s", name, err, binEnv)
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
					t.Logf("testutil: %s log tail (%s):\n%s", name, logPath(s), tail(logPath(s), 40))
				}
			})
			return s
		}
		lastErr = err
		if !errors.Is(err, errPortTaken) {
			break
		}
	}
	t.Fatalf("testutil: %v", lastErr)
	var zero S
	return zero
}

// waitReady polls url (a server's liveness endpoint: MinIO's /minio/health/live
// answers 200 once its object layer is up, fake-gcs-server's bucket list once it
// serves) until it answers 200, the process exits (closing exited), or the timeout
// passes. A 200 from a process that has exited came from someone else's server on the
// port.
func waitReady(url string, exited <-chan struct{}, cmd *exec.Cmd, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	hc := &http.Client{Timeout: time.Second}
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if resp, err := hc.Do(req); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				select {
				case <-exited:
					return fmt.Errorf("exited before it was ready: %v", cmd.ProcessState)
				default:
					return nil
				}
			}
		}
		select {
		case <-exited:
			return fmt.Errorf("exited before it was ready: %v", cmd.ProcessState)
		case <-ctx.Done():
			return fmt.Errorf("not ready after %v", timeout)
		case <-tick.C:
		}
	}
}
