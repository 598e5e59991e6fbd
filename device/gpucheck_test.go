package device

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestGPUCheckScript checks what of scripts/gpu-check.sh can run without a GPU: the
// shell parses, its Python part compiles, and on a machine without NVIDIA's tools it
// says so and exits 2 without checking anything.
func TestGPUCheckScript(t *testing.T) {
	script := filepath.Join("..", "scripts", "gpu-check.sh")
	if out, err := exec.Command("bash", "-n", script).CombinedOutput(); err != nil {
		t.Fatalf("bash -n: %v: %s", err, out)
	}
	src, err := os.ReadFile(script)
	if err != nil {
		t.Fatal(err)
	}
	_, py, ok := strings.Cut(string(src), "<<'PY'\n")
	py, _, ok2 := strings.Cut(py, "\nPY\n")
	if !ok || !ok2 {
		t.Fatal("no Python part between <<'PY' and PY")
	}
	pyFile := filepath.Join(t.TempDir(), "check.py")
	if err := os.WriteFile(pyFile, []byte(py), 0o644); err != nil {
		t.Fatal(err)
	}
	python, err := exec.LookPath("python3")
	if err != nil {
		t.Fatalf("python3 is needed to check the script's Python part: %v", err)
	}
	if out, err := exec.Command(python, "-m", "py_compile", pyFile).CombinedOutput(); err != nil {
		t.Fatalf("the script's Python does not compile: %v: %s", err, out)
	}

	// No nvidia-smi on PATH and an empty linker cache: the no-GPU path.
	bin := t.TempDir()
	for _, tool := range []string{"bash", "dirname", "grep", "printf"} {
		p, err := exec.LookPath(tool)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(p, filepath.Join(bin, tool)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(bin, "ldconfig"), []byte("#!/bin/sh\nexit 0\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("bash", script)
	cmd.Env = []string{"PATH=" + bin, "SHARDLOAD=/bin/true", "HOME=" + t.TempDir()}
	out, err := cmd.CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 || !strings.Contains(string(out), "no NVIDIA GPU here") {
		t.Errorf("without a GPU: %v: %s; want exit 2 saying there is no GPU", err, out)
	}
	cmd = exec.Command("bash", script)
	cmd.Env = []string{"PATH=" + bin, "SHARDLOAD=/nonexistent/shardload"}
	out, err = cmd.CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 3 || !strings.Contains(string(out), "make build") {
		t.Errorf("without a binary: %v: %s; want exit 3 saying how to build it", err, out)
	}
}
