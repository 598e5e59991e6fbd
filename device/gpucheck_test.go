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
	python, err := exec.LookPath("python3")
	if err != nil {
		t.Fatalf("python3 is needed to check the script's Python parts: %v", err)
	}
	// Every Python part between <<'PY' and PY compiles.
	parts := 0
	for rest := string(src); ; parts++ {
		var py string
		var ok, ok2 bool
		if _, rest, ok = strings.Cut(rest, "<<'PY'"); !ok {
			break
		}
		_, rest, _ = strings.Cut(rest, "\n") // the rest of the line that starts it
		if py, rest, ok2 = strings.Cut(rest, "\nPY\n"); !ok2 {
			t.Fatal("a Python part without its closing PY")
		}
		pyFile := filepath.Join(t.TempDir(), "check.py")
		if err := os.WriteFile(pyFile, []byte(py), 0o644); err != nil {
			t.Fatal(err)
		}
		if out, err := exec.Command(python, "-m", "py_compile", pyFile).CombinedOutput(); err != nil {
			t.Fatalf("Python part %d of the script does not compile: %v: %s", parts+1, err, out)
		}
	}
	if parts < 2 {
		t.Fatalf("%d Python parts in the script, want the device comparison and the client check", parts)
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
