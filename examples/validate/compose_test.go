package validate

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
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
	img := readImagesScript(t)
	images := map[string]string{
		"LOADER":  img.vars["LOADER"],
		"TRAINER": img.vars["TRAINER"],
		"MINIO":   strings.ReplaceAll(img.vars["MINIO"], "$MINIO_VERSION", versions["MINIO_VERSION"]),
	}
	service := func(name string) types.ServiceConfig {
		t.Helper()
		s, ok := p.Services[name]
		if !ok {
			t.Fatalf("docker-compose.yml: no service %q (have %v)", name, p.ServiceNames())
		}
		return s
	}
	isImage := func(s types.ServiceConfig, which string) {
		t.Helper()
		if s.Image != images[which] {
			t.Errorf("service %s: image %q, want %s (scripts/images.sh %s)", s.Name, s.Image, images[which], which)
		}
	}
	// completed says that s starts once dep completed successfully (or is healthy).
	after := func(s types.ServiceConfig, dep string, cond string) {
		t.Helper()
		if d, ok := s.DependsOn[dep]; !ok || d.Condition != cond {
			t.Errorf("service %s depends on %+v: want %s %s", s.Name, s.DependsOn, dep, cond)
		}
	}
	// Every image is built by scripts/images.sh: compose builds and pulls nothing.
	for _, s := range p.Services {
		if s.Build != nil {
			t.Errorf("service %s builds an image: scripts/images.sh builds them all", s.Name)
		}
		if !slices.Contains(slices.Collect(maps.Values(images)), s.Image) {
			t.Errorf("service %s: image %q is none of scripts/images.sh's %v", s.Name, s.Image, images)
		}
	}

	minio := service("minio")
	isImage(minio, "MINIO")
	if hc := minio.HealthCheck; hc == nil || len(hc.Test) < 2 || hc.Test[0] != "CMD" || !strings.Contains(strings.Join(hc.Test, " "), "/minio/health/live") {
		t.Errorf("service minio: healthcheck %+v: want a CMD asking /minio/health/live", hc)
	}

	// The dataset: written, uploaded where the index and serve read it, indexed.
	dataset, upload, index, serve := service("dataset"), service("upload"), service("index"), service("serve")
	isImage(dataset, "LOADER")
	isImage(index, "LOADER")
	isImage(serve, "LOADER")
	isImage(upload, "TRAINER")
	if len(dataset.Command) < 1 || dataset.Command[0] != "gen" {
		t.Fatalf("service dataset: command %q: want shardload gen", dataset.Command)
	}
	shards, _ := strconv.Atoi(flagOf(dataset.Command, "shards"))
	perShard, _ := strconv.Atoi(flagOf(dataset.Command, "samples"))
	out := dataset.Command[len(dataset.Command)-1]
	after(upload, "dataset", types.ServiceConditionCompletedSuccessfully)
	after(upload, "minio", types.ServiceConditionHealthy)
	after(index, "upload", types.ServiceConditionCompletedSuccessfully)
	after(serve, "index", types.ServiceConditionCompletedSuccessfully)
	if len(upload.Command) != 3 || !strings.HasSuffix(out, strings.TrimPrefix(upload.Command[1], "/dataset")) {
		t.Errorf("service upload: command %q does not upload dataset's %s", upload.Command, out)
	}
	dest := upload.Command[len(upload.Command)-1]
	if len(index.Command) < 4 || index.Command[0] != "index" || flagOf(index.Command, "output") != dest {
		t.Errorf("service index: command %q: want index --output %s", index.Command, dest)
	}
	pattern := index.Command[len(index.Command)-1]
	if want := fmt.Sprintf("%strain-{000000..%06d}.tar", dest, shards-1); pattern != want {
		t.Errorf("service index reads %q, the dataset is %s", pattern, want)
	}
	if serve.Command[len(serve.Command)-1] != pattern {
		t.Errorf("service serve reads %q, the index is of %q", serve.Command[len(serve.Command)-1], pattern)
	}
	for _, s := range []types.ServiceConfig{upload, index, serve} {
		for _, k := range []string{"AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION"} {
			if s.Environment[k] == nil {
				t.Errorf("service %s: no %s", s.Name, k)
			}
		}
		if h := s.Environment["AWS_ENDPOINT_URL"]; h != nil && *h != "http://minio:9000" {
			t.Errorf("service %s: AWS_ENDPOINT_URL %s", s.Name, *h)
		}
	}

	// serve: its socket and cache on volumes, memlock unlimited, healthy when it
	// listens.
	const sock = "/run/shardload/loader.sock" // the images' SHARDLOAD_SOCKET (TestDockerfiles)
	if len(serve.Command) == 0 || serve.Command[0] != "serve" {
		t.Errorf("service serve: command %q", serve.Command)
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
	runVol := mount(serve, sock)
	if runVol == nil || runVol.Type != types.VolumeTypeVolume || runVol.Target != filepath.Dir(sock) {
		t.Fatalf("service serve: the socket %s is not in a volume mounted at its directory: %+v", sock, serve.Volumes)
	}
	if _, ok := p.Volumes[runVol.Source]; !ok {
		t.Errorf("volume %q is not declared", runVol.Source)
	}
	cacheDir := flagOf(serve.Command, "cache-dir")
	if v := mount(serve, cacheDir); cacheDir == "" || v == nil || v.Type != types.VolumeTypeVolume || v.Source == runVol.Source {
		t.Errorf("service serve: --cache-dir %q is not on a volume of its own: %+v", cacheDir, serve.Volumes)
	}
	if u := serve.Ulimits["memlock"]; u == nil || (u.Single != -1 && u.Soft != -1) {
		t.Errorf("service serve: memlock ulimit %+v: want -1 (the slabs are page-locked)", u)
	}
	if hc := serve.HealthCheck; hc == nil || len(hc.Test) < 2 || hc.Test[1] != "/usr/local/bin/shardload" {
		t.Errorf("service serve: healthcheck %+v: want the shardload binary itself", hc)
	}

	// The ranks: one world, each rank once, on serve's socket volume, started when
	// serve is healthy; check waits for all of them and knows the world and samples.
	var ranks []types.ServiceConfig
	for _, s := range p.Services {
		if strings.HasPrefix(s.Name, "rank") {
			ranks = append(ranks, s)
		}
	}
	if len(ranks) < 2 {
		t.Fatalf("docker-compose.yml: %d rank services, want two or more", len(ranks))
	}
	seen := map[string]bool{}
	for _, r := range ranks {
		isImage(r, "TRAINER")
		after(r, "serve", types.ServiceConditionHealthy)
		if v := mount(r, sock); v == nil || v.Source != runVol.Source || v.Target != runVol.Target {
			t.Errorf("service %s does not mount %s at %s: %+v", r.Name, runVol.Source, runVol.Target, r.Volumes)
		}
		if s := r.Environment["SHARDLOAD_SOCKET"]; s != nil && *s != sock {
			t.Errorf("service %s: SHARDLOAD_SOCKET %s, serve's is %s", r.Name, *s, sock)
		}
		rank, world := r.Environment["RANK"], r.Environment["WORLD_SIZE"]
		if rank == nil || world == nil || *world != strconv.Itoa(len(ranks)) || seen[*rank] {
			t.Errorf("service %s: RANK %v WORLD_SIZE %v: want a rank of its own in a world of %d", r.Name, rank, world, len(ranks))
		} else {
			seen[*rank] = true
		}
	}
	check := service("check")
	isImage(check, "TRAINER")
	for _, r := range ranks {
		after(check, r.Name, types.ServiceConditionCompletedSuccessfully)
	}
	if n := len(check.Command); n < 3 || check.Command[n-2] != strconv.Itoa(len(ranks)) || check.Command[n-1] != strconv.Itoa(shards*perShard) {
		t.Errorf("service check: command %q: want the world %d and the %d x %d samples", check.Command, len(ranks), shards, perShard)
	}
}

// flagOf returns the value of --name V or --name=V in args, or "".
func flagOf(args []string, name string) string {
	for i, a := range args {
		if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
			return v
		}
		if a == "--"+name && i+1 < len(args) {
			return args[i+1]
		}
	}
	return ""
}
