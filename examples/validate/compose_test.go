package validate

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/compose-spec/compose-go/v2/loader"
	"github.com/compose-spec/compose-go/v2/types"
)

// loadCompose loads a compose file with compose-go's loader: YAML, the compose
// specification's JSON schema, interpolation and normalisation, every profile on.
func loadCompose(t *testing.T, path string) (*types.Project, error) {
	t.Helper()
	details := types.ConfigDetails{
		WorkingDir:  root,
		ConfigFiles: []types.ConfigFile{{Filename: path}},
		Environment: types.Mapping{},
	}
	return loader.LoadWithContext(context.Background(), details, loader.WithProfiles([]string{"*"}),
		func(o *loader.Options) { o.SetProjectName("shardload", true) })
}

// TestComposeSchemaIsChecked makes sure the loader refuses what the schema refuses,
// so that TestCompose's load is a validation.
func TestComposeSchemaIsChecked(t *testing.T) {
	for name, doc := range map[string]string{
		"unknown key":   "services:\n  a:\n    image: x\n    imagee: y\n",
		"wrong type":    "services:\n  a:\n    image: x\n    ports: 9000\n",
		"bad ulimit":    "services:\n  a:\n    image: x\n    ulimits:\n      memlock: unlimited\n",
		"bad depends":   "services:\n  a:\n    image: x\n    depends_on:\n      b:\n        condition: healthy\n  b:\n    image: x\n",
		"bad top-level": "service:\n  a:\n    image: x\n",
	} {
		path := filepath.Join(t.TempDir(), "compose.yml")
		if err := os.WriteFile(path, []byte(doc), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := loadCompose(t, path); err == nil {
			t.Errorf("%s: the loader accepted %q", name, doc)
		}
	}
}

func TestCompose(t *testing.T) {
	p, err := loadCompose(t, filepath.Join(root, "docker-compose.yml"))
	if err != nil {
		t.Fatalf("docker-compose.yml: %v", err)
	}
	versions := toolVersions(t)
	service := func(name string) types.ServiceConfig {
		t.Helper()
		s, ok := p.Services[name]
		if !ok {
			t.Fatalf("docker-compose.yml: no service %q (have %v)", name, p.ServiceNames())
		}
		return s
	}

	// The servers of the tests, built from source at the versions of scripts/tools.sh.
	minio, fakeGCS := service("minio"), service("fake-gcs")
	for _, c := range []struct {
		s               types.ServiceConfig
		arg, dockerfile string
		port            uint32
	}{
		{minio, "MINIO_VERSION", "docker/minio.Dockerfile", 9000},
		{fakeGCS, "FAKE_GCS_VERSION", "docker/fake-gcs-server.Dockerfile", 4443},
	} {
		if c.s.Build == nil {
			t.Fatalf("service %s is not built from source", c.s.Name)
		}
		if got := filepath.Join(c.s.Build.Context, c.s.Build.Dockerfile); got != filepath.Join(root, c.dockerfile) {
			t.Errorf("service %s builds %s, want %s", c.s.Name, got, c.dockerfile)
		}
		if v := c.s.Build.Args[c.arg]; v == nil || *v != versions[c.arg] {
			t.Errorf("service %s: build arg %s %v, scripts/tools.sh has %s", c.s.Name, c.arg, v, versions[c.arg])
		}
		if !strings.HasSuffix(c.s.Image, ":"+versions[c.arg]) && !strings.HasSuffix(c.s.Image, ":"+strings.TrimPrefix(versions[c.arg], "v")) {
			t.Errorf("service %s: image %q is not tagged with its version %s", c.s.Name, c.s.Image, versions[c.arg])
		}
		published := false
		for _, port := range c.s.Ports {
			published = published || (port.Target == c.port && port.Published != "")
		}
		if !published {
			t.Errorf("service %s does not publish port %d: %+v", c.s.Name, c.port, c.s.Ports)
		}
		hc := c.s.HealthCheck
		if hc == nil || len(hc.Test) < 2 || hc.Test[0] != "CMD" || slices.Contains(hc.Test, "curl") {
			t.Errorf("service %s: healthcheck %+v: want a CMD without curl (the images have none)", c.s.Name, hc)
		}
	}
	if minio.Build.Target != "minio" {
		t.Errorf("service minio builds target %q", minio.Build.Target)
	}

	// The one-shot service makes the "shards" bucket once MinIO is healthy.
	mc := service("mc")
	if mc.Build == nil || mc.Build.Target != "mc" || !strings.Contains(strings.Join(mc.Entrypoint, " "), "mc mb --ignore-existing local/shards") {
		t.Errorf("service mc: build %+v entrypoint %q: want docker/minio.Dockerfile's mc making local/shards", mc.Build, mc.Entrypoint)
	}
	if d, ok := mc.DependsOn["minio"]; !ok || d.Condition != types.ServiceConditionHealthy {
		t.Errorf("service mc depends on %+v: want minio healthy", mc.DependsOn)
	}
	if h := mc.Environment["MC_HOST_local"]; h == nil || !strings.Contains(*h, "@minio:9000") {
		t.Errorf("service mc: MC_HOST_local %v", h)
	}

	// serve: the root Dockerfile, its socket and cache on volumes trainers share.
	serve := service("serve")
	if serve.Build == nil || serve.Build.Context != root || serve.Build.Target != "static" {
		t.Errorf("service serve: build %+v: want the root Dockerfile's static target", serve.Build)
	}
	if len(serve.Command) == 0 || serve.Command[0] != "serve" {
		t.Errorf("service serve: command %q", serve.Command)
	}
	sock := serve.Environment["SHARDLOAD_SOCKET"]
	if sock == nil {
		t.Fatal("service serve sets no SHARDLOAD_SOCKET")
	}
	mount := func(s types.ServiceConfig, path string) *types.ServiceVolumeConfig {
		for i := range s.Volumes {
			v := &s.Volumes[i]
			if path == v.Target || strings.HasPrefix(path, v.Target+"/") {
				return v
			}
		}
		return nil
	}
	runVol := mount(serve, *sock)
	if runVol == nil || runVol.Type != types.VolumeTypeVolume || runVol.Target != filepath.Dir(*sock) {
		t.Fatalf("service serve: the socket %s is not in a volume mounted at its directory: %+v", *sock, serve.Volumes)
	}
	if _, ok := p.Volumes[runVol.Source]; !ok {
		t.Errorf("volume %q is not declared", runVol.Source)
	}
	var cacheDir string
	for _, a := range serve.Command {
		if v, ok := strings.CutPrefix(a, "--cache-dir="); ok {
			cacheDir = v
		}
	}
	if v := mount(serve, cacheDir); cacheDir == "" || v == nil || v.Type != types.VolumeTypeVolume || v.Source == runVol.Source {
		t.Errorf("service serve: --cache-dir %q is not on a volume of its own: %+v", cacheDir, serve.Volumes)
	}
	if u := serve.Ulimits["memlock"]; u == nil || (u.Single != -1 && u.Soft != -1) {
		t.Errorf("service serve: memlock ulimit %+v: want -1 (the slabs are page-locked)", u)
	}
	if hc := serve.HealthCheck; hc == nil || len(hc.Test) < 2 || hc.Test[1] != "/usr/local/bin/shardload" {
		t.Errorf("service serve: healthcheck %+v: want the shardload binary itself (distroless has no tools)", hc)
	}
	for _, k := range []string{"AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION"} {
		if serve.Environment[k] == nil {
			t.Errorf("service serve: no %s", k)
		}
	}
	if h := serve.Environment["AWS_ENDPOINT_URL"]; h != nil && *h != "http://minio:9000" {
		t.Errorf("service serve: AWS_ENDPOINT_URL %s", *h)
	}
	if d, ok := serve.DependsOn["minio"]; !ok || d.Condition != types.ServiceConditionHealthy {
		t.Errorf("service serve depends on %+v: want minio healthy", serve.DependsOn)
	}

	// Trainers reach the socket through the same volume, at the same path.
	for _, name := range []string{"trainer", "shardload"} {
		s := service(name)
		v := mount(s, *sock)
		if v == nil || v.Source != runVol.Source || v.Target != runVol.Target {
			t.Errorf("service %s does not mount %s at %s: %+v", name, runVol.Source, runVol.Target, s.Volumes)
		}
	}
	trainer := service("trainer")
	if s := trainer.Environment["SHARDLOAD_SOCKET"]; s == nil || *s != *sock {
		t.Errorf("service trainer: SHARDLOAD_SOCKET %v, serve's is %s", s, *sock)
	}
	if trainer.Build == nil || filepath.Join(trainer.Build.Context, trainer.Build.Dockerfile) != filepath.Join(root, "docker/trainer.Dockerfile") {
		t.Errorf("service trainer: build %+v", trainer.Build)
	}
	if !slices.Contains(trainer.Profiles, "train") {
		t.Errorf("service trainer: profiles %v: want it started only on request", trainer.Profiles)
	}

	// Every Dockerfile and target named exists.
	for _, s := range p.Services {
		if s.Build == nil {
			continue
		}
		df := filepath.Join(s.Build.Context, s.Build.Dockerfile)
		rel, err := filepath.Rel(root, df)
		if err != nil {
			t.Fatal(err)
		}
		d := parseDockerfile(t, rel)
		if s.Build.Target != "" && d.stage(s.Build.Target) == nil {
			t.Errorf("service %s: target %q not in %s", s.Name, s.Build.Target, rel)
		}
	}
}
