package validate

import (
	"os"
	"path/filepath"
	"regexp"
	"testing"
)

// root is the repository's root directory.
var root = func() string {
	p, err := filepath.Abs("../..")
	if err != nil {
		panic(err)
	}
	return p
}()

func read(t *testing.T, rel string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, rel))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// toolVersions returns the versions scripts/tools.sh pins, by its variable names
// (MINIO_VERSION, FAKE_GCS_VERSION).
func toolVersions(t *testing.T) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, m := range regexp.MustCompile(`(?m)^([A-Z_]+_VERSION)=(\S+)$`).FindAllSubmatch(read(t, "scripts/tools.sh"), -1) {
		out[string(m[1])] = string(m[2])
	}
	for _, name := range []string{"MINIO_VERSION", "FAKE_GCS_VERSION"} {
		if out[name] == "" {
			t.Fatalf("scripts/tools.sh sets no %s (found %v)", name, out)
		}
	}
	return out
}

// TestToolVersions: internal/testutil starts the binaries scripts/tools.sh builds, by
// version; the compose services and Dockerfiles are checked against tools.sh.
func TestToolVersions(t *testing.T) {
	versions := toolVersions(t)
	for file, c := range map[string][2]string{
		"internal/testutil/minio.go":   {"MinIOVersion", "MINIO_VERSION"},
		"internal/testutil/fakegcs.go": {"FakeGCSVersion", "FAKE_GCS_VERSION"},
	} {
		m := regexp.MustCompile(`const ` + c[0] + ` = "([^"]+)"`).FindSubmatch(read(t, file))
		if m == nil || string(m[1]) != versions[c[1]] {
			t.Errorf("%s: %s %q, scripts/tools.sh %s %q", file, c[0], m, c[1], versions[c[1]])
		}
	}
}
