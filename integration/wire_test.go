package integration

import (
	"fmt"
	sl "github.com/shardload/shardload"
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

// The settings a trainer's hello may give are one table in the server (shardload.Knobs:
// each Knob's Hello) and one in the Python client (shardload.hello.SETTINGS), which
// must name the same ones. client/python/tests/settings_check.py compares them, and
// checks that the client's hello is made from its table.
func TestPythonSettingsAreTheKnobs(t *testing.T) {
	py := python(t)
	var names []string
	for _, k := range sl.Knobs {
		if k.Hello != "" {
			names = append(names, k.Hello)
		}
	}
	if len(names) == 0 {
		t.Fatal("sl.Knobs has no Hello")
	}
	script, _ := filepath.Abs("../client/python/tests/settings_check.py")
	out, err := exec.Command(py, append([]string{script}, names...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("settings_check.py %s: %v\n%s", strings.Join(names, " "), err, out)
	}
	if want := fmt.Sprintf(`{"settings": %d}`, len(names)); !strings.Contains(string(out), want) {
		t.Errorf("settings_check.py: want %s:\n%s", want, out)
	}
}

// The Python client's modules import one another without a circle (function-level
// imports included), and none is over 500 lines: client/python/tests/layout_check.py.
func TestPythonClientLayout(t *testing.T) {
	py := python(t)
	script, _ := filepath.Abs("../client/python/tests/layout_check.py")
	out, err := exec.Command(py, script).CombinedOutput()
	if err != nil {
		t.Fatalf("layout_check.py: %v\n%s", err, out)
	}
}
