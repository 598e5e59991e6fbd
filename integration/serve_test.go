package integration

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	sl "github.com/shardload/shardload"
	"github.com/shardload/shardload/decode"
	"github.com/shardload/shardload/index"
	"github.com/shardload/shardload/internal/shardgen"
	"github.com/shardload/shardload/shard"
	"github.com/shardload/shardload/wire"
)

// The Python that runs the client: Debian's, where scripts/deps.sh installs numpy and
// PyTorch.
const systemPython = "/usr/bin/python3"

// python returns the interpreter for the client tests. It fails the test in CI when
// the interpreter or its numpy and torch are missing, and skips it loudly elsewhere.
func python(t *testing.T) string {
	t.Helper()
	out, err := exec.Command(systemPython, "-c", "import numpy, torch").CombinedOutput()
	if err != nil {
		msg := fmt.Sprintf("%s with numpy and torch is needed for the client tests (scripts/deps.sh installs them): %v: %s", systemPython, err, out)
		if ci := os.Getenv("CI"); ci != "" && ci != "false" && ci != "0" {
			t.Fatal(msg)
		}
		t.Skip("SKIPPED: " + msg)
	}
	return systemPython
}

var trainerScript = func() string {
	p, _ := filepath.Abs("../client/python/tests/trainer.py")
	return p
}()

// server is a running "shardload serve".
type server struct {
	cmd    *exec.Cmd
	socket string
	out    *lineReader
	stderr *strings.Builder
	lw     *lockedWriter
	done   chan error
}

// lineReader hands out the lines of a process's output as they come.
type lineReader struct {
	lines chan string
}

func newLineReader(r io.Reader) *lineReader {
	lr := &lineReader{lines: make(chan string, 1024)}
	go func() {
		sc := bufio.NewScanner(r)
		sc.Buffer(make([]byte, 1<<20), 16<<20)
		for sc.Scan() {
			lr.lines <- sc.Text()
		}
		close(lr.lines)
	}()
	return lr
}

// next returns the next line, failing the test after timeout (a guard against a hang,
// not a measurement) or at the end of the output.
func (lr *lineReader) next(t *testing.T, timeout time.Duration) string {
	t.Helper()
	select {
	case l, ok := <-lr.lines:
		if !ok {
			t.Fatal("output ended")
		}
		return l
	case <-time.After(timeout):
		t.Fatalf("no output line within %v", timeout)
	}
	return ""
}

// startServer starts "shardload serve" on a socket in a new directory and waits for
// it to say it listens.
func startServer(t *testing.T, socket string, args ...string) *server {
	t.Helper()
	return startServerAs(t, -1, socket, args...)
}

// startServerAs is startServer with the server running as uid (>= 0).
func startServerAs(t *testing.T, uid int, socket string, args ...string) *server {
	t.Helper()
	return startServerWith(t, uid, nil, socket, args...)
}

// startServerEnv is startServer with more environment variables (a store's
// endpoint and credentials).
func startServerEnv(t *testing.T, env []string, socket string, args ...string) *server {
	t.Helper()
	return startServerWith(t, -1, env, socket, args...)
}

func startServerWith(t *testing.T, uid int, env []string, socket string, args ...string) *server {
	t.Helper()
	if socket == "" {
		socket = filepath.Join(t.TempDir(), "run", "loader.sock")
	}
	cmd := exec.Command(bin, append([]string{"serve", "--socket", socket}, args...)...)
	cmd.Env = append(append(os.Environ(), "AWS_EC2_METADATA_DISABLED=true"), env...)
	if uid >= 0 {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(uid)}}
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	s := &server{cmd: cmd, socket: socket, stderr: &strings.Builder{}, done: make(chan error, 1)}
	s.lw = &lockedWriter{w: s.stderr}
	cmd.Stderr = s.lw
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	s.out = newLineReader(stdout)
	go func() { s.done <- cmd.Wait() }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-s.done
	})
	line := s.out.next(t, 30*time.Second)
	if !strings.Contains(line, "listening on "+socket) {
		t.Fatalf("server said %q; stderr: %s", line, s.stderr)
	}
	return s
}

type lockedWriter struct {
	mu sync.Mutex
	w  *strings.Builder
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// String returns what was written so far.
func (l *lockedWriter) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.String()
}

func (s *server) pid() int { return s.cmd.Process.Pid }

// log returns what the server has written to stderr so far.
func (s *server) log() string {
	s.lw.mu.Lock()
	defer s.lw.mu.Unlock()
	return s.lw.w.String()
}

// wait waits for the server to exit and returns its exit status.
func (s *server) wait(t *testing.T) int {
	t.Helper()
	select {
	case err := <-s.done:
		s.done <- err
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return ee.ExitCode()
		}
		if err != nil {
			t.Fatal(err)
		}
		return 0
	case <-time.After(60 * time.Second):
		t.Fatal("server did not exit within 60s")
	}
	return -1
}

// trainer is a running client/python/tests/trainer.py.
type trainer struct {
	cmd   *exec.Cmd
	out   *lineReader
	stdin io.WriteCloser
	errb  *strings.Builder
}

func startTrainer(t *testing.T, py, socket string, uid int, args ...string) *trainer {
	t.Helper()
	cmd := exec.Command(py, append([]string{trainerScript, "--socket", socket}, args...)...)
	cmd.Env = append(os.Environ(), "PYTHONDONTWRITEBYTECODE=1")
	if uid >= 0 {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(uid)}}
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	tr := &trainer{cmd: cmd, stdin: stdin, errb: &strings.Builder{}}
	cmd.Stderr = &lockedWriter{w: tr.errb}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	tr.out = newLineReader(stdout)
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	return tr
}

// trainerLine is one line of trainer.py's output.
type trainerLine struct {
	Ready *struct {
		Batches, Samples, Slabs int
	} `json:"ready"`
	Epoch   int               `json:"epoch"`
	Seq     int               `json:"seq"`
	Rows    int               `json:"rows"`
	Padded  int               `json:"padded"`
	Keys    []string          `json:"keys"`
	Columns map[string]string `json:"columns"`
	End     map[string]any    `json:"end"`
	Paused  int               `json:"paused"`
	Error   string            `json:"error"`
	Code    string            `json:"code"`
	Message string            `json:"message"`
}

func (tr *trainer) line(t *testing.T) trainerLine {
	t.Helper()
	l := tr.out.next(t, 60*time.Second)
	var tl trainerLine
	if err := json.Unmarshal([]byte(l), &tl); err != nil {
		t.Fatalf("trainer printed %q: %v (stderr: %s)", l, err, tr.errb)
	}
	return tl
}

// run reads the trainer's output to its end: its batches, and its error if any.
func (tr *trainer) run(t *testing.T) (batches []trainerLine, errLine *trainerLine) {
	t.Helper()
	for {
		select {
		case l, ok := <-tr.out.lines:
			if !ok {
				if err := tr.cmd.Wait(); err != nil && errLine == nil {
					t.Fatalf("trainer: %v; stderr: %s", err, tr.errb)
				}
				return batches, errLine
			}
			var tl trainerLine
			if err := json.Unmarshal([]byte(l), &tl); err != nil {
				t.Fatalf("trainer printed %q: %v (stderr: %s)", l, err, tr.errb)
			}
			switch {
			case tl.Error != "":
				errLine = &tl
			case tl.Columns != nil:
				batches = append(batches, tl)
			}
		case <-time.After(120 * time.Second):
			t.Fatalf("trainer did not finish within 120s; stderr: %s", tr.errb)
		}
	}
}

// digest is trainer.py's column digest, computed from a Go batch.
func digest(c *wire.Column, slab []byte, rows int) string {
	h := sha256.New()
	if c.Ragged {
		var n [8]byte
		for i := range rows {
			r := c.Row(slab, i)
			binary.LittleEndian.PutUint64(n[:], uint64(len(r)))
			h.Write(n[:])
			h.Write(r)
		}
	} else {
		h.Write(slab[c.Offset : c.Offset+c.Length])
	}
	return hex.EncodeToString(h.Sum(nil))
}

// libraryBatches reads epochs with the Go library and describes each batch as
// trainer.py does.
func libraryBatches(t *testing.T, cfg sl.Config, epochs int) []trainerLine {
	t.Helper()
	var out []trainerLine
	for e := cfg.Epoch; e < cfg.Epoch+epochs; e++ {
		c := cfg
		c.Epoch = e
		l, err := sl.Open(context.Background(), c)
		if err != nil {
			t.Fatal(err)
		}
		for b, err := range l.All(context.Background()) {
			if err != nil {
				t.Fatal(err)
			}
			tl := trainerLine{Epoch: e, Seq: b.Seq, Rows: b.Rows, Padded: b.Padded, Keys: b.Keys(), Columns: map[string]string{}}
			for i := range b.Columns {
				col := &b.Columns[i]
				if col.Name != wire.KeyColumn {
					tl.Columns[col.Name] = digest(col, b.Data(), b.Rows)
				}
			}
			out = append(out, tl)
		}
		l.Close()
	}
	return out
}

func sameBatches(t *testing.T, what string, got, want []trainerLine) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d batches, want %d", what, len(got), len(want))
	}
	for i := range want {
		g, w := got[i], want[i]
		if g.Epoch != w.Epoch || g.Seq != w.Seq || g.Rows != w.Rows || g.Padded != w.Padded || !slices.Equal(g.Keys, w.Keys) {
			t.Fatalf("%s: batch %d: epoch %d seq %d rows %d keys %v, want epoch %d seq %d rows %d keys %v",
				what, i, g.Epoch, g.Seq, g.Rows, g.Keys, w.Epoch, w.Seq, w.Rows, w.Keys)
		}
		for name, d := range w.Columns {
			if g.Columns[name] != d {
				t.Fatalf("%s: batch %d column %q: digest %s, want %s", what, i, name, g.Columns[name], d)
			}
		}
		if len(g.Columns) != len(w.Columns) {
			t.Fatalf("%s: batch %d columns %v, want %v", what, i, g.Columns, w.Columns)
		}
	}
}

// datasets writes two small datasets: "images" (plain tar: jpg, cls, txt) and
// "tokens" (zstd shards of fixed-shape npy arrays and a label).
func datasets(t *testing.T) (images, tokens string) {
	t.Helper()
	dir := t.TempDir()
	img := shardgen.Spec{Shards: 5, SamplesPerShard: 23, Fields: shardgen.Presets["default"], Prefix: "img"}
	imgs, err := shardgen.Generate(dir, img)
	if err != nil {
		t.Fatal(err)
	}
	tok := shardgen.Spec{Shards: 3, SamplesPerShard: 30, Fields: shardgen.Presets["tokens"], Compression: shard.Zstd, Prefix: "tok"}
	toks, err := shardgen.Generate(dir, tok)
	if err != nil {
		t.Fatal(err)
	}
	// An index beside the shards (both datasets in one): epochs are planned from
	// exact counts, the same in the server and in the library.
	infos, err := sl.Count(context.Background(), sl.Config{URLs: append(imgs, toks...), NoIndexStore: true, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(filepath.Join(dir, index.FileName))
	if err != nil {
		t.Fatal(err)
	}
	if err := index.Write(f, infos, true); err != nil {
		t.Fatal(err)
	}
	f.Close()
	return filepath.Join(dir, img.Pattern()), filepath.Join(dir, tok.Pattern())
}

// eventually polls cond until it holds or the deadline passes: the server frees a
// session's resources on its own schedule after the peer is gone.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 30s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// hello sends a raw hello and returns the server's first answer.
func rawHello(t *testing.T, socket string, h map[string]any) map[string]any {
	t.Helper()
	c, err := net.Dial("unixpacket", socket)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	b, _ := json.Marshal(h)
	if _, err := c.Write(b); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(30 * time.Second))
	buf := make([]byte, 1<<16)
	n, err := c.Read(buf)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(buf[:n], &m); err != nil {
		t.Fatal(err)
	}
	return m
}

func fields(t *testing.T, specs ...string) []decode.Field {
	t.Helper()
	fs, err := decode.ParseFields(specs...)
	if err != nil {
		t.Fatal(err)
	}
	return fs
}

func TestServeMatchesLibrary(t *testing.T) {
	py := python(t)
	images, tokens := datasets(t)
	for _, tc := range []struct {
		name, pattern string
		fields        []string
		output        string
		batch         int
	}{
		{"images-numpy", images, []string{"jpg", "label=cls:int", "txt"}, "numpy", 8},
		{"images-torch", images, []string{"jpg", "label=cls:int", "txt"}, "torch", 8},
		{"images-stdlib", images, []string{"jpg", "label=cls:int", "txt"}, "memoryview", 16},
		{"tokens-numpy", tokens, []string{"tokens=npy:npy:int32:2048", "cls:int"}, "numpy", 7},
		{"tokens-torch", tokens, []string{"tokens=npy:npy:int32:2048", "cls:int"}, "torch", 7},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := startServer(t, "", "--shuffle-buffer", "40", "--open-shards", "3", tc.pattern)
			var fieldArgs []string
			var fields []decode.Field
			for _, f := range tc.fields {
				fieldArgs = append(fieldArgs, "--field", f)
				df, err := decode.ParseField(f)
				if err != nil {
					t.Fatal(err)
				}
				fields = append(fields, df)
			}
			tr := startTrainer(t, py, srv.socket, -1, append(fieldArgs, "--seed", "11", "--epoch", "2", "--epochs", "2",
				"--batch-size", strconv.Itoa(tc.batch), "--output", tc.output)...)
			got, errLine := tr.run(t)
			if errLine != nil {
				t.Fatalf("trainer: %+v", *errLine)
			}
			want := libraryBatches(t, sl.Config{URLs: []string{tc.pattern}, Fields: fields, Seed: 11, Epoch: 2,
				BatchSize: tc.batch, ShuffleBuffer: 40, OpenShards: 3, Logf: t.Logf}, 2)
			sameBatches(t, tc.name, got, want)
		})
	}
}

func TestServeTwoRanks(t *testing.T) {
	py := python(t)
	images, _ := datasets(t)
	srv := startServer(t, "", images)
	all := map[string]int{}
	var counts []int
	var trainers []*trainer
	for rank := range 2 {
		trainers = append(trainers, startTrainer(t, py, srv.socket, -1, "--rank", strconv.Itoa(rank), "--world", "2",
			"--seed", "3", "--batch-size", "6", "--field", "jpg", "--field", "cls:int"))
	}
	for rank, tr := range trainers {
		got, errLine := tr.run(t)
		if errLine != nil {
			t.Fatalf("rank %d: %+v", rank, *errLine)
		}
		counts = append(counts, len(got))
		for _, b := range got {
			for _, k := range b.Keys[:b.Rows-b.Padded] {
				all[k]++
			}
		}
	}
	if counts[0] != counts[1] {
		t.Errorf("ranks got %v batches", counts)
	}
	// 115 samples in world 2: 57 each, one sample of the epoch read by neither.
	if len(all) != 114 {
		t.Errorf("%d distinct samples across the ranks, want 114", len(all))
	}
	for k, n := range all {
		if n != 1 {
			t.Errorf("sample %s seen %d times", k, n)
		}
	}
}

// torchLine is one line of torch_check.py's output.
type torchLine struct {
	Epoch      int               `json:"epoch"`
	Keys       []string          `json:"keys"`
	Columns    map[string]string `json:"columns"`
	Device     []string          `json:"device"`
	CUDA       *bool             `json:"cuda"`
	Registered bool              `json:"registered"`
}

func TestServeTorchAdapters(t *testing.T) {
	py := python(t)
	_, tokens := datasets(t)
	srv := startServer(t, "", tokens)
	fieldSpecs := []string{"tokens=npy:npy:int32:2048", "label=cls:int"}
	// Rank 1 of 2, from the variables torchrun sets.
	want := libraryBatches(t, sl.Config{URLs: []string{tokens}, Fields: fields(t, fieldSpecs...), Seed: 1, Rank: 1, World: 2,
		BatchSize: 8, Logf: t.Logf}, 2)
	for _, mode := range []string{"dataset", "prefetch"} {
		t.Run(mode, func(t *testing.T) {
			script, _ := filepath.Abs("../client/python/tests/torch_check.py")
			cmd := exec.Command(py, append([]string{script, mode, srv.socket, "2", "8"}, fieldSpecs...)...)
			cmd.Env = append(os.Environ(), "RANK=1", "WORLD_SIZE=2", "LOCAL_RANK=0", "PYTHONDONTWRITEBYTECODE=1")
			out, err := cmd.Output()
			if err != nil {
				var stderr []byte
				if ee, ok := err.(*exec.ExitError); ok {
					stderr = ee.Stderr
				}
				t.Fatalf("%v: %s", err, stderr)
			}
			var got []trainerLine
			for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
				var tl torchLine
				if err := json.Unmarshal([]byte(l), &tl); err != nil {
					t.Fatalf("%q: %v", l, err)
				}
				if tl.CUDA != nil {
					t.Logf("CUDA %v, slabs registered %v", *tl.CUDA, tl.Registered)
					continue
				}
				for _, d := range tl.Device {
					if !strings.HasPrefix(d, "cuda") && d != "cpu" {
						t.Errorf("device %q", d)
					}
				}
				got = append(got, trainerLine{Epoch: tl.Epoch, Rows: len(tl.Keys), Keys: tl.Keys, Columns: tl.Columns})
			}
			// torch_check.py does not print seq or padding: compare what it prints.
			w := slices.Clone(want)
			for i := range w {
				w[i].Seq, w[i].Padded = 0, 0
			}
			sameBatches(t, mode, got, w)
		})
	}
}

// The client installs with pip from the repository, with no index and no network.
func TestPythonClientInstallsWithPip(t *testing.T) {
	py := python(t)
	src := filepath.Join(t.TempDir(), "python")
	if err := os.CopyFS(src, os.DirFS("../client/python")); err != nil {
		t.Fatal(err)
	}
	target := filepath.Join(t.TempDir(), "site")
	cmd := exec.Command(py, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation", "--no-index", "--target", target, src)
	cmd.Env = append(os.Environ(), "PIP_DISABLE_PIP_VERSION_CHECK=1", "PIP_ROOT_USER_ACTION=ignore")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("pip install: %v\n%s", err, out)
	}
	cmd = exec.Command(py, "-c", "import shardload, shardload.pytorch; print(shardload.__file__); print(shardload.PROTOCOL_VERSION)")
	cmd.Dir = t.TempDir()
	cmd.Env = append(os.Environ(), "PYTHONPATH="+target)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("importing the installed client: %v\n%s", err, out)
	}
	lines := strings.Fields(string(out))
	if len(lines) != 2 || !strings.HasPrefix(lines[0], target) || lines[1] != "4" {
		t.Errorf("installed client: %q", out)
	}
}
