// Package testutil is the tests' support: it starts the real servers tests run
// against, as native processes on 127.0.0.1: MinIO for everything that speaks S3, and
// fake-gcs-server for GCS. The binaries are built by scripts/tools.sh at pinned
// versions; a test that needs a missing binary fails when CI is set, and is skipped
// loudly otherwise.
package testutil

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"
)

// MinIOVersion is the MinIO module version scripts/tools.sh builds; the two must agree.
const MinIOVersion = "v0.0.0-20260212201848-7aac2a2c5b7c"

// MinIOBinEnv names the environment variable that, when set, is the MinIO binary to
// run instead of the one in the tools cache.
const MinIOBinEnv = "SHARDLOAD_MINIO_BIN"

// Region is the region the test servers and their clients use.
const Region = "us-east-1"

// startTimeout bounds how long MinIO may take to become ready.
const startTimeout = 60 * time.Second

// ToolPath returns where scripts/tools.sh puts a tool built at version:
// ${XDG_CACHE_HOME:-$HOME/.cache}/shardload/tools/<name>-<version>/<name>.
func ToolPath(name, version string) string {
	cache := os.Getenv("XDG_CACHE_HOME")
	if cache == "" {
		cache = filepath.Join(os.Getenv("HOME"), ".cache")
	}
	return filepath.Join(cache, "shardload", "tools", name+"-"+version, name)
}

// toolBin returns the binary named by the environment variable env if it is set,
// else the pinned version of the tool in the tools cache. The file may not exist.
func toolBin(env, name, version string) string {
	if p := os.Getenv(env); p != "" {
		return p
	}
	return ToolPath(name, version)
}

// MinIOBin returns the MinIO binary to run: $SHARDLOAD_MINIO_BIN if set, else the
// pinned version in the tools cache. The file may not exist.
func MinIOBin() string { return toolBin(MinIOBinEnv, "minio", MinIOVersion) }

// MinIOServer is a MinIO server process started for one test.
type MinIOServer struct {
	// Endpoint is the server's S3 endpoint, http://127.0.0.1:port.
	Endpoint string
	// AccessKey and SecretKey are the server's root credentials.
	AccessKey, SecretKey string
	// Client is an S3 client for the server, with path-style addressing.
	Client *s3.Client

	cmd      *exec.Cmd
	exited   chan struct{} // closed when the process has been waited for
	logPath  string
	stopOnce sync.Once
}

// MinIO starts a MinIO server with its data in a fresh temporary directory, waits
// until it is ready, and stops it when the test ends. When the test has failed, the
// tail of the server's log is printed.
func MinIO(t testing.TB) *MinIOServer {
	t.Helper()
	return launch(t, "MinIO", MinIOBin(), MinIOBinEnv, startMinIO, (*MinIOServer).Stop, func(s *MinIOServer) string { return s.logPath })
}

var errPortTaken = errors.New("port already in use")

// startMinIO starts one server. On failure the process is gone and the error holds
// the log's tail.
func startMinIO(t testing.TB, bin string) (*MinIOServer, error) {
	addrs, err := freeAddrs(2)
	if err != nil {
		return nil, err
	}
	addr, console := addrs[0], addrs[1]
	dir := t.TempDir()
	logPath := filepath.Join(dir, "minio.log")
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	defer logf.Close() // the child holds its own descriptor
	s := &MinIOServer{
		Endpoint:  "http://" + addr,
		AccessKey: "test-" + randHex(6),
		SecretKey: randHex(16),
		exited:    make(chan struct{}),
		logPath:   logPath,
	}
	cmd := exec.Command(bin, "server",
		"--address", addr, "--console-address", console, filepath.Join(dir, "data"))
	cmd.Env = append(os.Environ(),
		"MINIO_ROOT_USER="+s.AccessKey,
		"MINIO_ROOT_PASSWORD="+s.SecretKey,
		"MINIO_BROWSER=off",
		"MINIO_UPDATE=off",
		"MINIO_CI_CD=1",
	)
	cmd.Stdout, cmd.Stderr = logf, logf
	setPdeathsig(cmd)
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", bin, err)
	}
	s.cmd = cmd
	go func() { cmd.Wait(); close(s.exited) }()

	start := time.Now()
	if err := waitReady(s.Endpoint+"/minio/health/live", s.exited, s.cmd, startTimeout); err != nil {
		s.Stop()
		log := tail(logPath, 40)
		if strings.Contains(log, "already in use") { // "Specified port is already in use"
			err = fmt.Errorf("%w: %w", errPortTaken, err)
		}
		return nil, fmt.Errorf("MinIO at %s: %w\nlog tail (%s):\n%s", addr, err, logPath, log)
	}
	s.Client = s.newClient()
	// Our credentials prove the server that answered is ours, not another process
	// that took the port first.
	if _, err := s.Client.ListBuckets(context.Background(), &s3.ListBucketsInput{}); err != nil {
		s.Stop()
		return nil, fmt.Errorf("%w: the server at %s refused our credentials: %w\nlog tail (%s):\n%s",
			errPortTaken, addr, err, logPath, tail(logPath, 40))
	}
	t.Logf("testutil: MinIO ready at %s in %v", s.Endpoint, time.Since(start).Round(time.Millisecond))
	return s, nil
}

func (s *MinIOServer) newClient() *s3.Client {
	return s3.New(s3.Options{
		Region:                     Region,
		BaseEndpoint:               aws.String(s.Endpoint),
		UsePathStyle:               true,
		Credentials:                credentials.NewStaticCredentialsProvider(s.AccessKey, s.SecretKey, ""),
		RequestChecksumCalculation: aws.RequestChecksumCalculationWhenRequired,
		ResponseChecksumValidation: aws.ResponseChecksumValidationWhenRequired,
	})
}

// Env returns environment variables, in os/exec's KEY=value form, that point the
// standard AWS configuration of a subprocess at the server. They also blank the
// variables that would otherwise override or spoil them (a session token, an
// S3-specific endpoint) and disable the EC2 metadata lookup.
func (s *MinIOServer) Env() []string {
	var env []string
	for _, kv := range s.vars() {
		env = append(env, kv[0]+"="+kv[1])
	}
	return env
}

// SetEnv sets the variables of Env in this process for the rest of the test, with
// t.Setenv. Clients that load the AWS configuration lazily, such as a zero
// s3.Source, must be created after SetEnv.
func (s *MinIOServer) SetEnv(t testing.TB) {
	t.Helper()
	for _, kv := range s.vars() {
		t.Setenv(kv[0], kv[1])
	}
}

func (s *MinIOServer) vars() [][2]string {
	return [][2]string{
		{"AWS_ENDPOINT_URL", s.Endpoint},
		{"AWS_ENDPOINT_URL_S3", s.Endpoint},
		{"AWS_ACCESS_KEY_ID", s.AccessKey},
		{"AWS_SECRET_ACCESS_KEY", s.SecretKey},
		{"AWS_SESSION_TOKEN", ""},
		{"AWS_REGION", Region},
		{"AWS_EC2_METADATA_DISABLED", "true"},
	}
}

// CreateBucket creates a bucket, failing the test on error.
func (s *MinIOServer) CreateBucket(t testing.TB, name string) {
	t.Helper()
	if _, err := s.Client.CreateBucket(t.Context(), &s3.CreateBucketInput{Bucket: &name}); err != nil {
		t.Fatalf("testutil: create bucket %q: %v", name, err)
	}
}

// Put stores data as bucket/key, failing the test on error.
func (s *MinIOServer) Put(t testing.TB, bucket, key string, data []byte) {
	t.Helper()
	_, err := s.Client.PutObject(t.Context(), &s3.PutObjectInput{
		Bucket: &bucket, Key: &key, Body: bytes.NewReader(data),
	})
	if err != nil {
		t.Fatalf("testutil: put s3://%s/%s: %v", bucket, key, err)
	}
}

// Stop kills the server and waits for it to exit. It is idempotent; MinIO calls it
// when the test ends.
func (s *MinIOServer) Stop() {
	s.stopOnce.Do(func() {
		s.cmd.Process.Kill()
		<-s.exited
	})
}

// inCI reports whether CI is set to something other than false or 0.
func inCI() bool {
	switch strings.ToLower(os.Getenv("CI")) {
	case "", "false", "0":
		return false
	}
	return true
}

// freeAddrs returns n distinct loopback addresses with ports that were free a moment
// ago.
func freeAddrs(n int) ([]string, error) {
	var addrs []string
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("finding a free port: %w", err)
		}
		defer l.Close()
		addrs = append(addrs, l.Addr().String())
	}
	return addrs, nil
}

func randHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// tail returns the last n lines of the file at path.
func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(%v)", err)
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	return strings.Join(lines[max(len(lines)-n, 0):], "\n")
}
