package integration

import (
	"archive/zip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// wheelPython returns the interpreter that builds the client's wheel: Debian's, with
// pip, setuptools and wheel (python3-pip, python3-setuptools, python3-wheel). It fails
// the test in CI when they are missing, and skips it loudly elsewhere.
func wheelPython(t *testing.T) string {
	t.Helper()
	// Looked up, not imported: pip imported before setuptools upsets setuptools'
	// distutils shim.
	const probe = `import importlib.util, sys
missing = [m for m in ("pip", "setuptools", "wheel") if importlib.util.find_spec(m) is None]
print("missing: " + ", ".join(missing) if missing else "")
sys.exit(1 if missing else 0)`
	out, err := exec.Command(systemPython, "-c", probe).CombinedOutput()
	if err != nil {
		msg := "building the client's wheel needs " + systemPython + " with pip, setuptools and wheel " +
			"(Debian: python3-pip, python3-setuptools, python3-wheel): " + err.Error() + ": " + strings.TrimSpace(string(out))
		if ci := os.Getenv("CI"); ci != "" && ci != "false" && ci != "0" {
			t.Fatal(msg)
		}
		t.Skip("SKIPPED: " + msg)
	}
	return systemPython
}

// offlinePip is the environment for pip with no index and no usable network: every
// proxy points at a port nothing listens on, and no pip configuration of the caller's
// (a find-links directory, an index) applies.
func offlinePip() []string {
	var env []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		switch {
		case strings.HasPrefix(name, "PIP_"), strings.HasPrefix(name, "PYTHON"):
			continue
		case strings.EqualFold(name, "http_proxy"), strings.EqualFold(name, "https_proxy"),
			strings.EqualFold(name, "all_proxy"), strings.EqualFold(name, "no_proxy"):
			continue
		}
		env = append(env, kv)
	}
	const nowhere = "http://127.0.0.1:9"
	return append(env,
		"PIP_NO_INDEX=1", "PIP_DISABLE_PIP_VERSION_CHECK=1", "PIP_CONFIG_FILE="+os.DevNull,
		"PIP_ROOT_USER_ACTION=ignore", "PIP_NO_CACHE_DIR=1", "PYTHONDONTWRITEBYTECODE=1",
		"HTTP_PROXY="+nowhere, "HTTPS_PROXY="+nowhere, "http_proxy="+nowhere, "https_proxy="+nowhere,
		"ALL_PROXY="+nowhere, "all_proxy="+nowhere)
}

// The client builds into a wheel with no index and no network (Debian's setuptools
// and wheel, no build isolation); the wheel carries the package and its py.typed
// marker, installs with pip and imports from where it was installed.
func TestWheelBuildsOffline(t *testing.T) {
	py := wheelPython(t)
	srcAbs, err := filepath.Abs("../client/python")
	if err != nil {
		t.Fatal(err)
	}
	// The build writes build/ and shardload.egg-info/ next to pyproject.toml: build a
	// copy, so that the repository stays as it was.
	src := filepath.Join(t.TempDir(), "python")
	if err := os.CopyFS(src, os.DirFS(srcAbs)); err != nil {
		t.Fatal(err)
	}
	for _, junk := range []string{"build", "shardload.egg-info"} {
		if err := os.RemoveAll(filepath.Join(src, junk)); err != nil {
			t.Fatal(err)
		}
	}
	env := offlinePip()

	dist := t.TempDir()
	cmd := exec.Command(py, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "--no-index", "-w", dist, src)
	cmd.Dir = t.TempDir()
	cmd.Env = env
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("pip wheel: %v\n%s", err, out)
	}
	wheels, err := filepath.Glob(filepath.Join(dist, "shardload-*.whl"))
	if err != nil {
		t.Fatal(err)
	}
	if len(wheels) != 1 {
		entries, _ := os.ReadDir(dist)
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		t.Fatalf("want one shardload wheel in the output directory, found %q", names)
	}
	whl := wheels[0]
	if name := filepath.Base(whl); !strings.HasSuffix(name, "-py3-none-any.whl") {
		t.Errorf("wheel %s: want a pure-Python wheel (py3-none-any)", name)
	}

	zr, err := zip.OpenReader(whl)
	if err != nil {
		t.Fatalf("opening the wheel: %v", err)
	}
	files := map[string]bool{}
	for _, f := range zr.File {
		files[f.Name] = true
	}
	zr.Close()
	for _, want := range []string{"shardload/__init__.py", "shardload/client.py", "shardload/pytorch.py", "shardload/py.typed"} {
		if !files[want] {
			t.Errorf("the wheel lacks %s", want)
		}
	}
	for name := range files {
		if strings.Contains(name, "__pycache__") || strings.HasPrefix(name, "tests/") {
			t.Errorf("the wheel carries %s", name)
		}
	}

	target := filepath.Join(t.TempDir(), "site")
	cmd = exec.Command(py, "-m", "pip", "install", "--no-deps", "--no-index", "--target", target, whl)
	cmd.Dir = t.TempDir()
	cmd.Env = env
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("pip install of the wheel: %v\n%s", err, out)
	}
	if _, err := os.Stat(filepath.Join(target, "shardload", "py.typed")); err != nil {
		t.Errorf("installed package: %v", err)
	}

	// Imported from a directory outside the repository, with the target as the only
	// addition to the path: the package must come from the target.
	cmd = exec.Command(py, "-c", "import shardload, sys; print(shardload.__file__)")
	cmd.Dir = t.TempDir()
	cmd.Env = append(env, "PYTHONPATH="+target)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("importing the installed wheel: %v\n%s", err, out)
	}
	got := strings.TrimSpace(string(out))
	if want := filepath.Join(target, "shardload", "__init__.py"); got != want {
		t.Errorf("shardload imported from %q, want %q", got, want)
	}
}
