package integration

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/shardload/shardload/internal/shardgen"
)

// memfdMaps counts the slabs the server process has mapped.
func memfdMaps(t *testing.T, pid int) int {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", pid))
	if err != nil {
		t.Fatal(err)
	}
	return strings.Count(string(b), "/memfd:shardload-session")
}

// lockedKiB is the page-locked memory of a process (VmLck), in KiB.
func lockedKiB(t *testing.T, pid int) int {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "VmLck:" {
			n, _ := strconv.Atoi(f[1])
			return n
		}
	}
	t.Fatal("no VmLck in /proc/PID/status")
	return 0
}

func fdCount(t *testing.T, pid int) int {
	t.Helper()
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

func TestServeClientKilledLeaksNothing(t *testing.T) {
	py := python(t)
	images, _ := datasets(t)
	srv := startServer(t, "", "--slabs", "3", "--slab-size", "4MiB", images)
	baseFDs, baseLocked := fdCount(t, srv.pid()), lockedKiB(t, srv.pid())
	if n := memfdMaps(t, srv.pid()); n != 0 {
		t.Fatalf("%d slabs mapped before any trainer", n)
	}
	for round := range 2 {
		tr := startTrainer(t, py, srv.socket, -1, "--batch-size", "4", "--pause-after", "2", "--field", "jpg")
		if l := tr.line(t); l.Ready == nil || l.Ready.Slabs != 3 {
			t.Fatalf("first line %+v", l)
		}
		for l := tr.line(t); l.Paused == 0; l = tr.line(t) {
		}
		if n := memfdMaps(t, srv.pid()); n != 3 {
			t.Fatalf("round %d: %d slabs mapped during the session, want 3", round, n)
		}
		tr.cmd.Process.Signal(syscall.SIGKILL)
		tr.cmd.Wait()
		eventually(t, "slabs unmapped after the trainer was killed", func() bool { return memfdMaps(t, srv.pid()) == 0 })
		eventually(t, "descriptors back to the baseline", func() bool { return fdCount(t, srv.pid()) == baseFDs })
		eventually(t, "locked memory back to the baseline", func() bool { return lockedKiB(t, srv.pid()) == baseLocked })
	}
}

func TestServeOtherUserRefused(t *testing.T) {
	py := python(t)
	if os.Getuid() != 0 {
		msg := "running a client as nobody needs root"
		if ci := os.Getenv("CI"); ci != "" && ci != "false" && ci != "0" {
			t.Fatal(msg)
		}
		t.Skip("SKIPPED: " + msg)
	}
	const nobody = 65534
	images, _ := datasets(t)
	srv := startServer(t, "", images)
	// The socket's directory keeps other users out.
	tr := startTrainer(t, py, srv.socket, nobody)
	_, errLine := tr.run(t)
	if errLine == nil || !strings.Contains(errLine.Message, "no permission to connect") {
		t.Fatalf("nobody through a 0700 directory: %+v", errLine)
	}
	// With the directory opened up, the server's uid check refuses the peer.
	for p := filepath.Dir(srv.socket); strings.HasPrefix(p, os.TempDir()+"/"); p = filepath.Dir(p) {
		if err := os.Chmod(p, 0o711); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(srv.socket, 0o666); err != nil {
		t.Fatal(err)
	}
	tr = startTrainer(t, py, srv.socket, nobody)
	_, errLine = tr.run(t)
	if errLine == nil || errLine.Code != "denied" || !strings.Contains(errLine.Message, "uid 65534") {
		t.Fatalf("nobody with the socket reachable: %+v", errLine)
	}
	// And the server's own user is still served.
	tr = startTrainer(t, py, srv.socket, -1, "--field", "cls:int")
	if got, errLine := tr.run(t); errLine != nil || len(got) == 0 {
		t.Fatalf("own user after a refusal: %d batches, %+v", len(got), errLine)
	}
}

// requireRoot fails the test in CI, and skips it loudly elsewhere, when it cannot
// run processes as another user.
func requireRoot(t *testing.T) {
	t.Helper()
	if os.Getuid() != 0 {
		msg := "running processes as nobody needs root"
		if ci := os.Getenv("CI"); ci != "" && ci != "false" && ci != "0" {
			t.Fatal(msg)
		}
		t.Skip("SKIPPED: " + msg)
	}
}

// openUp makes dir and its ancestors under the temporary directory searchable by
// other users, so that a process of another user reaches files in them.
func openUp(t *testing.T, dir string) {
	t.Helper()
	for p := dir; strings.HasPrefix(p, os.TempDir()+"/"); p = filepath.Dir(p) {
		if err := os.Chmod(p, 0o711); err != nil {
			t.Fatal(err)
		}
	}
}

// The client talks only to a server of its own user or root, or of a uid it is told
// to trust: another user's process at the socket gets no hello. And --allow-uid lets
// that user's trainers in.
func TestServeTrust(t *testing.T) {
	py := python(t)
	requireRoot(t)
	const nobody = 65534
	openUp(t, filepath.Dir(bin))
	base := t.TempDir()
	openUp(t, base)
	nb := filepath.Join(base, "nb")
	if err := os.Mkdir(nb, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(nb, nobody, nobody); err != nil {
		t.Fatal(err)
	}
	spec := shardgen.Spec{Shards: 2, SamplesPerShard: 10, Fields: shardgen.Presets["default"]}
	if _, err := shardgen.Generate(filepath.Join(nb, "data"), spec); err != nil {
		t.Fatal(err)
	}
	os.Chmod(filepath.Join(nb, "data"), 0o755)
	pattern := filepath.Join(nb, "data", spec.Pattern())

	// A server of nobody's: a root trainer refuses it, unless told to trust it.
	srv := startServerAs(t, nobody, filepath.Join(nb, "run", "loader.sock"), "--allow-uid", "0", pattern)
	_, errLine := startTrainer(t, py, srv.socket, -1, "--field", "cls:int").run(t)
	if errLine == nil || errLine.Error != "UntrustedServer" || !strings.Contains(errLine.Message, "uid 65534") {
		t.Fatalf("root trainer, nobody's server: %+v", errLine)
	}
	t.Setenv("SHARDLOAD_TRUST_UIDS", strconv.Itoa(nobody))
	if got, errLine := startTrainer(t, py, srv.socket, -1, "--field", "cls:int").run(t); errLine != nil || len(got) != 1 {
		t.Fatalf("trusting uid %d: %d batches, %+v", nobody, len(got), errLine)
	}
	os.Unsetenv("SHARDLOAD_TRUST_UIDS")

	// A root server with --allow-uid serves nobody's trainers (who trust root).
	srv = startServer(t, filepath.Join(base, "root", "loader.sock"), "--allow-uid", strconv.Itoa(nobody), pattern)
	if got, errLine := startTrainer(t, py, srv.socket, nobody, "--field", "cls:int").run(t); errLine != nil || len(got) != 1 {
		t.Fatalf("nobody's trainer, --allow-uid %d: %d batches, %+v", nobody, len(got), errLine)
	}
}

func TestServeSIGTERM(t *testing.T) {
	py := python(t)
	images, _ := datasets(t)
	srv := startServer(t, "", images)
	tr := startTrainer(t, py, srv.socket, -1, "--batch-size", "4", "--pause-after", "1", "--field", "jpg")
	for l := tr.line(t); l.Paused == 0; l = tr.line(t) {
	}
	srv.cmd.Process.Signal(syscall.SIGTERM)
	if code := srv.wait(t); code != 0 {
		t.Fatalf("exit status %d after SIGTERM; stderr: %s", code, srv.stderr)
	}
	if _, err := os.Lstat(srv.socket); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("socket left behind: %v", err)
	}
	if _, err := os.Lstat(filepath.Dir(srv.socket)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("socket directory left behind: %v", err)
	}
	// The paused trainer goes on and hears why the batches stopped.
	io.WriteString(tr.stdin, "go\n")
	_, errLine := tr.run(t)
	if errLine == nil || errLine.Code != "shutdown" {
		t.Fatalf("trainer after the server's SIGTERM: %+v", errLine)
	}
}

func TestServeKilledServer(t *testing.T) {
	py := python(t)
	images, _ := datasets(t)
	socket := filepath.Join(t.TempDir(), "run", "loader.sock")
	srv := startServer(t, socket, images)
	// A second server on a live socket refuses to start.
	r := shardload(t, "", nil, "serve", "--socket", socket, images)
	if r.code != 1 || !strings.Contains(r.stderr, "another server is listening") {
		t.Fatalf("second server: exit %d: %s", r.code, r.stderr)
	}
	tr := startTrainer(t, py, srv.socket, -1, "--batch-size", "4", "--pause-after", "1", "--field", "jpg")
	for l := tr.line(t); l.Paused == 0; l = tr.line(t) {
	}
	srv.cmd.Process.Signal(syscall.SIGKILL)
	srv.wait(t)
	io.WriteString(tr.stdin, "go\n")
	_, errLine := tr.run(t)
	if errLine == nil || errLine.Error != "ServerGone" {
		t.Fatalf("trainer after the server was killed: %+v", errLine)
	}
	if _, err := os.Lstat(socket); err != nil {
		t.Fatalf("a killed server leaves its socket file: %v", err)
	}
	// The stale socket is recovered by the next server.
	srv = startServer(t, socket, images)
	tr = startTrainer(t, py, srv.socket, -1, "--field", "cls:int")
	if got, errLine := tr.run(t); errLine != nil || len(got) == 0 {
		t.Fatalf("after restart: %d batches, %+v", len(got), errLine)
	}
}

func TestServeRefusals(t *testing.T) {
	py := python(t)
	images, tokens := datasets(t)
	allowed := "file://" + filepath.Dir(tokens) + "/"
	srv := startServer(t, "", "--allow", allowed, images)
	hello := func(version int, urls ...string) map[string]any {
		return map[string]any{"type": "hello", "version": version, "rank": 0, "world": 1, "batch_size": 4, "urls": urls}
	}
	m := rawHello(t, srv.socket, hello(1))
	if m["type"] != "error" || m["code"] != "version" || !strings.Contains(m["message"].(string), "version 1") ||
		!strings.Contains(m["message"].(string), "speaks version 2") {
		t.Errorf("hello of version 1: %v", m)
	}
	m = rawHello(t, srv.socket, map[string]any{"type": "release", "slab": 0})
	if m["code"] != "bad_request" {
		t.Errorf("release before hello: %v", m)
	}
	for _, u := range []string{"file:///etc/passwd", "/etc/passwd", allowed + "../x.tar", strings.TrimSuffix(allowed, "/") + "-other/x.tar"} {
		m = rawHello(t, srv.socket, hello(2, u))
		if m["code"] != "denied" {
			t.Errorf("hello for %s: %v", u, m)
		}
	}
	// A URL under the allowed prefix is served, the tokens dataset here.
	tokURL := "file://" + tokens
	tr := startTrainer(t, py, srv.socket, -1, "--url", tokURL, "--field", "cls:int", "--batch-size", "10")
	got, errLine := tr.run(t)
	if errLine != nil || len(got) != 9 {
		t.Fatalf("allowed URL: %d batches, %+v", len(got), errLine)
	}
	// A bad field spec is the trainer's error, said plainly.
	tr = startTrainer(t, py, srv.socket, -1, "--field", "cls:nonsense")
	if _, errLine := tr.run(t); errLine == nil || errLine.Code != "bad_request" || !strings.Contains(errLine.Message, "nonsense") {
		t.Fatalf("bad field: %+v", errLine)
	}
}
