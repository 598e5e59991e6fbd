package testutil

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"cloud.google.com/go/storage"
	"google.golang.org/api/option"
)

// FakeGCSVersion is the fake-gcs-server module version scripts/tools.sh builds; the
// two must agree.
const FakeGCSVersion = "v1.56.1"

// FakeGCSBinEnv names the environment variable that, when set, is the
// fake-gcs-server binary to run instead of the one in the tools cache.
const FakeGCSBinEnv = "SHARDLOAD_FAKE_GCS_BIN"

// FakeGCSBin returns the fake-gcs-server binary to run: $SHARDLOAD_FAKE_GCS_BIN if
// set, else the pinned version in the tools cache. The file may not exist.
func FakeGCSBin() string { return toolBin(FakeGCSBinEnv, "fake-gcs-server", FakeGCSVersion) }

// FakeGCSServer is a fake-gcs-server process started for one test: a GCS emulator
// speaking plain HTTP on loopback, with its objects in a temporary directory.
type FakeGCSServer struct {
	// Endpoint is the server's base URL, http://127.0.0.1:port.
	Endpoint string
	// Host is the server's host:port, the value STORAGE_EMULATOR_HOST takes.
	Host string
	// Client is a GCS client for the server, with no credentials.
	Client *storage.Client

	cmd      *exec.Cmd
	exited   chan struct{}
	logPath  string
	stopOnce sync.Once
}

// FakeGCS starts a fake-gcs-server, waits until it is ready, and stops it when the
// test ends. When the test has failed, the tail of the server's log is printed.
func FakeGCS(t testing.TB) *FakeGCSServer {
	t.Helper()
	return launch(t, "fake-gcs-server", FakeGCSBin(), FakeGCSBinEnv, startFakeGCS, (*FakeGCSServer).Stop, func(s *FakeGCSServer) string { return s.logPath })
}

func startFakeGCS(t testing.TB, bin string) (*FakeGCSServer, error) {
	addrs, err := freeAddrs(1)
	if err != nil {
		return nil, err
	}
	addr := addrs[0]
	_, port, _ := strings.Cut(addr, ":")
	dir := t.TempDir()
	logPath := filepath.Join(dir, "fake-gcs-server.log")
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	s := &FakeGCSServer{Endpoint: "http://" + addr, Host: addr, exited: make(chan struct{}), logPath: logPath}
	cmd := exec.Command(bin, "-scheme", "http", "-host", "127.0.0.1", "-port", port,
		"-public-host", addr, "-external-url", s.Endpoint,
		"-backend", "filesystem", "-filesystem-root", filepath.Join(dir, "data"), "-log-level", "warn")
	cmd.Stdout, cmd.Stderr = logf, logf
	setPdeathsig(cmd)
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", bin, err)
	}
	s.cmd = cmd
	go func() { cmd.Wait(); close(s.exited) }()
	start := time.Now()
	if err := waitReady(s.Endpoint+"/storage/v1/b", s.exited, s.cmd, startTimeout); err != nil {
		s.Stop()
		log := tail(logPath, 40)
		if strings.Contains(log, "address already in use") {
			err = fmt.Errorf("%w: %w", errPortTaken, err)
		}
		return nil, fmt.Errorf("fake-gcs-server at %s: %w\nlog tail (%s):\n%s", addr, err, logPath, log)
	}
	s.Client, err = storage.NewClient(context.Background(), option.WithEndpoint(s.Endpoint+"/storage/v1/"),
		option.WithoutAuthentication())
	if err != nil {
		s.Stop()
		return nil, fmt.Errorf("GCS client for %s: %w", addr, err)
	}
	t.Logf("testutil: fake-gcs-server ready at %s in %v", s.Endpoint, time.Since(start).Round(time.Millisecond))
	return s, nil
}

// Env returns environment variables, in os/exec's KEY=value form, that point a GCS
// client of a subprocess at the server: STORAGE_EMULATOR_HOST.
func (s *FakeGCSServer) Env() []string {
	return []string{"STORAGE_EMULATOR_HOST=" + s.Host}
}

// SetEnv sets the variables of Env in this process for the rest of the test. Clients
// created lazily, such as a zero gcs.Source, must be created after SetEnv.
func (s *FakeGCSServer) SetEnv(t testing.TB) {
	t.Helper()
	t.Setenv("STORAGE_EMULATOR_HOST", s.Host)
}

// CreateBucket creates a bucket, failing the test on error.
func (s *FakeGCSServer) CreateBucket(t testing.TB, name string) {
	t.Helper()
	if err := s.Client.Bucket(name).Create(t.Context(), "test-project", nil); err != nil {
		t.Fatalf("testutil: create bucket %q: %v", name, err)
	}
}

// Put stores data as bucket/name, failing the test on error.
func (s *FakeGCSServer) Put(t testing.TB, bucket, name string, data []byte) {
	t.Helper()
	w := s.Client.Bucket(bucket).Object(name).NewWriter(t.Context())
	_, err := w.Write(data)
	if cerr := w.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatalf("testutil: put gs://%s/%s: %v", bucket, name, err)
	}
}

// Stop kills the server and waits for it to exit. It is idempotent; FakeGCS calls it
// when the test ends.
func (s *FakeGCSServer) Stop() {
	s.stopOnce.Do(func() {
		if s.Client != nil {
			s.Client.Close()
		}
		s.cmd.Process.Kill()
		<-s.exited
	})
}
