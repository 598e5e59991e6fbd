package integration

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// The Python client reads the golden fixtures of package wire (every message, a
// collated slab and its values) through its own code, as the Go tests do: the two
// sides cannot drift apart. client/python/tests/wire_check.py does the Python side.
func TestPythonReadsTheWireFixtures(t *testing.T) {
	py := python(t)
	script, _ := filepath.Abs("../client/python/tests/wire_check.py")
	fixtures, _ := filepath.Abs("../wire/testdata")
	out, err := exec.Command(py, script, fixtures).CombinedOutput()
	if err != nil {
		t.Fatalf("wire_check.py: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), `"messages": 7`) {
		t.Errorf("wire_check.py checked other fixtures than the seven messages:\n%s", out)
	}
}

// The Python client is typed: mypy --strict finds nothing (scripts/deps.sh installs
// mypy).
func TestPythonClientTypes(t *testing.T) {
	py := python(t)
	pkg, _ := filepath.Abs("../client/python/shardload")
	cmd := exec.Command(py, "-m", "mypy", "--strict", "--cache-dir=/dev/null", pkg)
	cmd.Dir = filepath.Dir(pkg)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("mypy --strict: %v\n%s", err, out)
	}
}
