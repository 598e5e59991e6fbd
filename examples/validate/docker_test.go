package validate

import (
	"bytes"
	"encoding/json"

	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
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

// imagesScript holds what scripts/images.sh sets: its variables (the image tags and
// the roots' package lists) and the lines that build each Dockerfile.
type imagesScript struct {
	vars   map[string]string
	builds map[string]string // Dockerfile -> the BASE root variable it is built on
}

func readImagesScript(t *testing.T) imagesScript {
	t.Helper()
	src := string(read(t, "scripts/images.sh"))
	s := imagesScript{vars: map[string]string{}, builds: map[string]string{}}
	for _, m := range regexp.MustCompile(`(?m)^([A-Za-z_]+)=(\S+)$`).FindAllStringSubmatch(src, -1) {
		s.vars[m[1]] = m[2]
	}
	for _, m := range regexp.MustCompile(`(?m)^\s*build "\$\w+" (\S+) "\$ctx" --build-arg "BASE=\$(\w+)"`).FindAllStringSubmatch(src, -1) {
		s.builds[m[1]] = m[2]
	}
	return s
}

// stageFrom returns the stage's base image with the default of the ARG it names
// (FROM ${BASE}) filled in.
func (d dockerfile) stageFrom(st *instructions.Stage) string {
	if name, ok := strings.CutPrefix(st.BaseName, "${"); ok {
		return d.arg(nil, strings.TrimSuffix(name, "}"))
	}
	return st.BaseName
}

func TestDockerfiles(t *testing.T) {
	versions := toolVersions(t)
	img := readImagesScript(t)

	// Every image is built by scripts/images.sh on a debootstrap root of its own
	// making: nothing is pulled from a registry.
	for file, base := range map[string]string{
		"Dockerfile":                "RUNTIME_BASE",
		"docker/minio.Dockerfile":   "RUNTIME_BASE",
		"docker/trainer.Dockerfile": "PYTHON_BASE",
	} {
		d := parseDockerfile(t, file)
		if got := img.builds[file]; got != base {
			t.Errorf("scripts/images.sh builds %s on %q, want %s", file, got, base)
		}
		for _, st := range d.stages {
			from := d.stageFrom(&st)
			if !strings.HasPrefix(from, "shardload-base/") && d.stage(from) == nil {
				t.Errorf("%s: stage %q is FROM %q: want a root scripts/images.sh makes (shardload-base/...)", file, st.Name, st.BaseName)
			}
		}
		for _, c := range d.stages[len(d.stages)-1].Commands {
			if r, ok := c.(*instructions.RunCommand); ok && regexp.MustCompile(`apt-get|curl|wget|pip `).MatchString(strings.Join(r.CmdLine, " ")) {
				t.Errorf("%s: %q fetches from the network at build time: the roots hold every package", file, r.CmdLine)
			}
		}
	}
	for name, pkgs := range map[string][]string{"runtime_pkgs": {"libturbojpeg0", "libjpeg62-turbo", "ca-certificates"}, "python_pkgs": {"python3", "python3-numpy"}} {
		for _, p := range pkgs {
			if !slices.Contains(strings.Split(img.vars[name], ","), p) {
				t.Errorf("scripts/images.sh: %s %q has no %s", name, img.vars[name], p)
			}
		}
	}

	// The loader: uid 65532, the binary where the compose healthcheck runs it, the
	// socket where the client looks.
	d := parseDockerfile(t, "Dockerfile")
	loader := &d.stages[len(d.stages)-1]
	nonRoot(t, "Dockerfile", loader, "65532:65532")
	if !copiesTo(loader, "/usr/local/bin/shardload") {
		t.Error("Dockerfile: no /usr/local/bin/shardload (the compose healthcheck runs it)")
	}
	if env := envOfStage(loader, "SHARDLOAD_SOCKET"); env != "/run/shardload/loader.sock" {
		t.Errorf("Dockerfile: SHARDLOAD_SOCKET %q", env)
	}
	if !strings.Contains(string(read(t, "scripts/images.sh")), "CGO_ENABLED=1") {
		t.Error("scripts/images.sh does not build shardload with cgo: it could not load libjpeg-turbo")
	}

	m := parseDockerfile(t, "docker/minio.Dockerfile")
	nonRoot(t, "docker/minio.Dockerfile", &m.stages[len(m.stages)-1], "")
	if got := m.arg(&m.stages[len(m.stages)-1], "MINIO_VERSION"); got != versions["MINIO_VERSION"] {
		t.Errorf("docker/minio.Dockerfile: MINIO_VERSION %q, scripts/tools.sh %q", got, versions["MINIO_VERSION"])
	}
	if want := "shardload-minio:$MINIO_VERSION"; img.vars["MINIO"] != want {
		t.Errorf("scripts/images.sh: MINIO=%q, want %q", img.vars["MINIO"], want)
	}

	// The trainer runs as the loader image's user: the client talks only to a
	// server of its own user.
	tr := parseDockerfile(t, "docker/trainer.Dockerfile")
	nonRoot(t, "docker/trainer.Dockerfile", &tr.stages[len(tr.stages)-1], user(loader))
	if env := envOfStage(&tr.stages[len(tr.stages)-1], "SHARDLOAD_SOCKET"); env != "/run/shardload/loader.sock" {
		t.Errorf("docker/trainer.Dockerfile: SHARDLOAD_SOCKET %q", env)
	}

	// The integration test runs the images scripts/images.sh tags.
	test := string(read(t, "integration/multinode_docker_test.go"))
	for _, v := range []string{"LOADER", "TRAINER"} {
		if !strings.Contains(test, `"`+img.vars[v]+`"`) {
			t.Errorf("integration/multinode_docker_test.go does not run %s (scripts/images.sh %s)", img.vars[v], v)
		}
	}
}

// envOfStage returns the value the stage's last ENV gives name, or "".
func envOfStage(st *instructions.Stage, name string) string {
	val := ""
	for _, c := range st.Commands {
		if e, ok := c.(*instructions.EnvCommand); ok {
			for _, kv := range e.Env {
				if kv.Key == name {
					val = kv.Value
				}
			}
		}
	}
	return val
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
}
