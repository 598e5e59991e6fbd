package validate

import (
	"bytes"
	"encoding/json"

	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/moby/buildkit/frontend/dockerfile/instructions"
	"github.com/moby/buildkit/frontend/dockerfile/linter"
	"github.com/moby/buildkit/frontend/dockerfile/parser"
	"github.com/moby/patternmatcher"
	"github.com/moby/patternmatcher/ignorefile"
)

// dockerfile is a Dockerfile parsed as BuildKit parses it.
type dockerfile struct {
	stages   []instructions.Stage
	metaArgs []instructions.ArgCommand
}

// parseDockerfile parses rel with BuildKit's parser and its linter, failing the test
// on any error or warning.
func parseDockerfile(t *testing.T, rel string) dockerfile {
	t.Helper()
	res, err := parser.Parse(bytes.NewReader(read(t, rel)))
	if err != nil {
		t.Fatalf("%s: %v", rel, err)
	}
	for _, w := range res.Warnings {
		t.Errorf("%s: parser warning: %s", rel, w.Short)
	}
	lint := linter.New(&linter.Config{Warn: func(rule, desc, url, msg string, loc []parser.Range) {
		t.Errorf("%s: lint %s: %s (line %v)", rel, rule, msg, loc)
	}})
	stages, metaArgs, err := instructions.Parse(res.AST, lint)
	if err != nil {
		t.Fatalf("%s: %v", rel, err)
	}
	return dockerfile{stages, metaArgs}
}

func (d dockerfile) stage(name string) *instructions.Stage {
	for i := range d.stages {
		if d.stages[i].Name == name {
			return &d.stages[i]
		}
	}
	return nil
}

// arg returns the default of ARG name in the stage (or before the first FROM).
func (d dockerfile) arg(st *instructions.Stage, name string) string {
	var cmds []instructions.Command
	for i := range d.metaArgs {
		cmds = append(cmds, &d.metaArgs[i])
	}
	if st != nil {
		cmds = append(cmds, st.Commands...)
	}
	val := ""
	for _, c := range cmds {
		if a, ok := c.(*instructions.ArgCommand); ok {
			for _, kv := range a.Args {
				if kv.Key == name && kv.Value != nil {
					val = *kv.Value
				}
			}
		}
	}
	return val
}

// user returns the stage's last USER, or "" when it has none.
func user(st *instructions.Stage) string {
	u := ""
	for _, c := range st.Commands {
		if uc, ok := c.(*instructions.UserCommand); ok {
			u = uc.User
		}
	}
	return u
}

// copiesTo reports whether the stage COPYs something to dest.
func copiesTo(st *instructions.Stage, dest string) bool {
	for _, c := range st.Commands {
		if cc, ok := c.(*instructions.CopyCommand); ok && cc.DestPath == dest {
			return true
		}
	}
	return false
}

// nonRoot fails the test unless a final stage runs as a numeric non-root uid (so
// that Kubernetes' runAsNonRoot can verify it).
func nonRoot(t *testing.T, rel string, st *instructions.Stage, want string) {
	t.Helper()
	u := user(st)
	if u == "" || u == "0" || strings.HasPrefix(u, "0:") || strings.HasPrefix(u, "root") {
		t.Errorf("%s: stage %q runs as %q: want a non-root user", rel, st.Name, u)
	}
	if want != "" && u != want {
		t.Errorf("%s: stage %q runs as %q, want %q", rel, st.Name, u, want)
	}
}

func TestDockerfiles(t *testing.T) {
	versions := toolVersions(t)

	d := parseDockerfile(t, "Dockerfile")
	static, cgo := d.stage("static"), d.stage("cgo")
	if static == nil || cgo == nil {
		t.Fatal("Dockerfile: no static or cgo stage")
	}
	if last := d.stages[len(d.stages)-1]; last.Name != "static" {
		t.Errorf("Dockerfile: the default target (last stage) is %q, want static", last.Name)
	}
	if !strings.HasPrefix(static.BaseName, "gcr.io/distroless/static") {
		t.Errorf("Dockerfile: static stage from %q, want distroless/static", static.BaseName)
	}
	for _, st := range []*instructions.Stage{static, cgo} {
		nonRoot(t, "Dockerfile", st, "65532:65532")
		if !copiesTo(st, "/usr/local/bin/shardload") {
			t.Errorf("Dockerfile: stage %q has no /usr/local/bin/shardload (the compose healthcheck runs it)", st.Name)
		}
	}
	for name, cgoWant := range map[string]string{"build-static": "CGO_ENABLED=0", "build-cgo": "CGO_ENABLED=1"} {
		st := d.stage(name)
		if st == nil {
			t.Fatalf("Dockerfile: no stage %s", name)
		}
		var run string
		for _, c := range st.Commands {
			if r, ok := c.(*instructions.RunCommand); ok {
				run += strings.Join(r.CmdLine, " ")
			}
		}
		if !strings.Contains(run, cgoWant) || !strings.Contains(run, "-trimpath") || !strings.Contains(run, "./cmd/shardload") {
			t.Errorf("Dockerfile: stage %s builds with %q: want %s, -trimpath, ./cmd/shardload", name, run, cgoWant)
		}
	}

	m := parseDockerfile(t, "docker/minio.Dockerfile")
	for _, target := range []string{"minio", "mc"} {
		st := m.stage(target)
		if st == nil {
			t.Fatalf("docker/minio.Dockerfile: no target %s", target)
		}
		nonRoot(t, "docker/minio.Dockerfile", st, "")
	}
	if got := m.arg(m.stage("build-minio"), "MINIO_VERSION"); got != versions["MINIO_VERSION"] {
		t.Errorf("docker/minio.Dockerfile: MINIO_VERSION %q, scripts/tools.sh %q", got, versions["MINIO_VERSION"])
	}
	if got := m.arg(m.stage("build-mc"), "MC_VERSION"); !strings.HasPrefix(got, "v") {
		t.Errorf("docker/minio.Dockerfile: MC_VERSION %q: want a pinned module version", got)
	}

	g := parseDockerfile(t, "docker/fake-gcs-server.Dockerfile")
	nonRoot(t, "docker/fake-gcs-server.Dockerfile", &g.stages[len(g.stages)-1], "")
	if got := g.arg(&g.stages[0], "FAKE_GCS_VERSION"); got != versions["FAKE_GCS_VERSION"] {
		t.Errorf("docker/fake-gcs-server.Dockerfile: FAKE_GCS_VERSION %q, scripts/tools.sh %q", got, versions["FAKE_GCS_VERSION"])
	}

	// The trainer runs as the shardload image's user: the client talks only to a
	// server of its own user.
	tr := parseDockerfile(t, "docker/trainer.Dockerfile")
	nonRoot(t, "docker/trainer.Dockerfile", &tr.stages[len(tr.stages)-1], user(static))
}

// ignored returns the patterns of a .dockerignore file.
func ignored(t *testing.T, rel string) *patternmatcher.PatternMatcher {
	t.Helper()
	f, err := os.Open(filepath.Join(root, rel))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	patterns, err := ignorefile.ReadAll(f)
	if err != nil {
		t.Fatalf("%s: %v", rel, err)
	}
	pm, err := patternmatcher.New(patterns)
	if err != nil {
		t.Fatalf("%s: %v", rel, err)
	}
	return pm
}

func excluded(t *testing.T, pm *patternmatcher.PatternMatcher, rel string) bool {
	t.Helper()
	ex, err := pm.MatchesOrParentMatches(filepath.ToSlash(rel))
	if err != nil {
		t.Fatal(err)
	}
	return ex
}

// buildFiles lists the files of the main module that building ./cmd/shardload reads
// (Go, cgo, assembly and embedded files), with and without cgo, relative to root.
func buildFiles(t *testing.T) []string {
	t.Helper()
	files := []string{"go.mod", "go.sum"}
	for _, cgo := range []string{"0", "1"} {
		cmd := exec.Command("go", "list", "-deps", "-json=Dir,Module,GoFiles,CgoFiles,CFiles,HFiles,SFiles,EmbedFiles", "./cmd/shardload")
		cmd.Dir = root
		cmd.Env = append(os.Environ(), "CGO_ENABLED="+cgo, "GOFLAGS=-buildvcs=false", "GOWORK=off")
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("go list (CGO_ENABLED=%s): %v: %s", cgo, err, stderr.String())
		}
		dec := json.NewDecoder(bytes.NewReader(out))
		for {
			var p struct {
				Dir                                                   string
				Module                                                *struct{ Main bool }
				GoFiles, CgoFiles, CFiles, HFiles, SFiles, EmbedFiles []string
			}
			if err := dec.Decode(&p); err == io.EOF {
				break
			} else if err != nil {
				t.Fatal(err)
			}
			if p.Module == nil || !p.Module.Main {
				continue
			}
			rel, err := filepath.Rel(root, p.Dir)
			if err != nil {
				t.Fatal(err)
			}
			for _, list := range [][]string{p.GoFiles, p.CgoFiles, p.CFiles, p.HFiles, p.SFiles, p.EmbedFiles} {
				for _, f := range list {
					files = append(files, filepath.Join(rel, f))
				}
			}
		}
	}
	slices.Sort(files)
	return slices.Compact(files)
}

func TestDockerignore(t *testing.T) {
	pm := ignored(t, ".dockerignore")
	files := buildFiles(t)
	if len(files) < 20 {
		t.Fatalf("only %d files to build: %v", len(files), files)
	}
	for _, f := range files {
		if excluded(t, pm, f) {
			t.Errorf(".dockerignore leaves out %s, which the build needs", f)
		}
	}
	for _, f := range []string{".git/HEAD", ".demo/data/train-000000.tar", "bin/shardload", "testdata/x.tar",
		"shard/testdata/fuzz/x", "examples/train.py", "shard/reader_test.go", "client/python/shardload/__pycache__/x.pyc"} {
		if !excluded(t, pm, f) {
			t.Errorf(".dockerignore sends %s to the builder", f)
		}
	}

	// The trainer image's context: the client package and train.py, nothing else.
	tr := ignored(t, "docker/trainer.Dockerfile.dockerignore")
	for _, f := range []string{"client/python/pyproject.toml", "client/python/README.md",
		"client/python/shardload/__init__.py", "client/python/shardload/client.py", "examples/train.py"} {
		if excluded(t, tr, f) {
			t.Errorf("docker/trainer.Dockerfile.dockerignore leaves out %s", f)
		}
		if _, err := os.Stat(filepath.Join(root, f)); err != nil {
			t.Errorf("the trainer image needs %s: %v", f, err)
		}
	}
	for _, f := range []string{".git/HEAD", "go.mod", "cmd/shardload/main.go", ".demo/data/x.tar", "examples/k8s/train-job.yaml",
		"client/python/shardload/__pycache__/client.cpython-312.pyc"} {
		if !excluded(t, tr, f) {
			t.Errorf("docker/trainer.Dockerfile.dockerignore sends %s", f)
		}
	}
}
