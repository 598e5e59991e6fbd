package main

import (
	"encoding/json"
	"math"
	"path/filepath"
	"strings"
	"testing"
)

func TestDoctorFakeSysfs(t *testing.T) {
	root := filepath.Join("..", "..", "numa", "testdata", "two-socket-8gpu")
	code, stdout, stderr := runCLI(t, "doctor", "--sysfs", root, "--cache-dir", t.TempDir())
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	for _, want := range []string{
		"numa:      2 node(s)",
		"node 1: CPUs 24-47,72-95, memory 1008.0 GiB",
		"8 NVIDIA GPU(s)",
		"--gpu 4: GPU 4 (0000:9a:00.0) is on node 1",
		"--gpu 3: GPU 3 (0000:5d:00.0) is on node 0",
		"hugepages: transparent huge pages madvise, for shared memory never",
		"echo advise > /sys/kernel/mm/transparent_hugepage/shmem_enabled",
		"memlock:",
		"/dev/shm:",
		"to change:",
	} {
		if !strings.Contains(stdout, want) {
			t.Errorf("doctor output lacks %q:\n%s", want, stdout)
		}
	}

	code, stdout, stderr = runCLI(t, "doctor", "--json", "--sysfs", root, "--ring-size", "1TiB")
	if code != 0 {
		t.Fatalf("--json: exit %d: %s", code, stderr)
	}
	var rep doctorReport
	if err := json.Unmarshal([]byte(stdout), &rep); err != nil {
		t.Fatalf("--json output does not parse: %v\n%s", err, stdout)
	}
	if len(rep.Topology.Nodes) != 2 || len(rep.Topology.GPUs) != 8 || len(rep.Plans) != 8 || rep.Plans[7].Node != 1 || rep.Memlock.Need != 1<<40 {
		t.Errorf("--json: %+v", rep)
	}
	if !rep.Memlock.Unlimited && !rep.Memlock.CapIPC && !strings.Contains(strings.Join(rep.Advice, "\n"), "memlock limit") {
		t.Errorf("a 1 TiB ring above the memlock limit gives no advice: %q", rep.Advice)
	}
	// The JPEG decoder: libjpeg-turbo where it loads (deps.sh installs it), named
	// with its library; else Go's, with the reason.
	if (rep.JPEG.Decoder == "libjpeg-turbo") != (rep.JPEG.Library != "" && rep.JPEG.Err == "") || (rep.JPEG.Decoder == "go" && rep.JPEG.Err == "") {
		t.Errorf("--json jpeg: %+v", rep.JPEG)
	}
	if _, stdout, _ := runCLI(t, "doctor", "--sysfs", root); !strings.Contains(stdout, "jpeg:      "+map[string]string{"go": "Go's image/jpeg", "libjpeg-turbo": "libjpeg-turbo ("}[rep.JPEG.Decoder]) {
		t.Errorf("doctor's report does not name the %s decoder:\n%s", rep.JPEG.Decoder, stdout)
	}
}

func TestDoctorNoNUMA(t *testing.T) {
	for _, tree := range []string{"no-numa", "gpu-node-unknown"} {
		root := filepath.Join("..", "..", "numa", "testdata", tree)
		code, stdout, stderr := runCLI(t, "doctor", "--sysfs", root)
		if code != 0 {
			t.Fatalf("%s: exit %d: %s", tree, code, stderr)
		}
		want := map[string]string{
			"no-numa":          "numa:      1 node(s) (no NUMA nodes in",
			"gpu-node-unknown": "GPU 0 (0000:3b:00.0): its NUMA node is unknown, so --gpu 0 places nothing",
		}[tree]
		if !strings.Contains(stdout, want) || !strings.Contains(stdout, "hugepages: transparent huge pages unknown") {
			t.Errorf("%s: output lacks %q:\n%s", tree, want, stdout)
		}
	}
	if code, _, _ := runCLI(t, "doctor", "extra"); code != 2 {
		t.Errorf("doctor with an argument: exit %d, want 2", code)
	}
}

// TestBenchDevice runs bench's device stage on this machine: host leaves batches in
// the slabs and --verify compares them; cuda without a driver fails with one clear
// line, auto falls back.
func TestBenchDevice(t *testing.T) {
	shards := "../../testdata/aistore__small-mnist-3.tar"
	code, stdout, stderr := runCLI(t, "bench", "--json", "--verify", "--batch-size", "1", "--step-time", "1ms", "--numa=false", shards)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	var res benchResult
	if err := json.Unmarshal([]byte(stdout), &res); err != nil {
		t.Fatal(err)
	}
	if res.BytesIn <= 0 || res.CPUSeconds <= 0 || math.Abs(res.CPUPerGB-res.CPUSeconds/(float64(res.BytesIn)/1e9)) > 1e-9*res.CPUPerGB {
		t.Errorf("cpu_seconds_per_gb %g: want cpu_seconds %g per GB of bytes_in %d", res.CPUPerGB, res.CPUSeconds, res.BytesIn)
	}
	d := res.Device
	if d.Kind != "host" || d.Copies != 3 || d.Verified != 3 || d.Bytes != res.BytesOut || d.Placement != "" {
		t.Errorf("device result %+v (bytes out %d)", d, res.BytesOut)
	}
	code, _, stderr = runCLI(t, "bench", "--device", "cuda", shards)
	if code != 0 && (code != 1 || !strings.Contains(stderr, "no CUDA driver or GPU")) {
		t.Errorf("--device cuda: exit %d: %s", code, stderr)
	}
	if code == 0 {
		t.Log("a CUDA driver and GPU are present here")
	}
	if code, _, stderr := runCLI(t, "bench", "--device", "tpu", shards); code != 2 || !strings.Contains(stderr, "host, cuda or auto") {
		t.Errorf("--device tpu: exit %d: %s", code, stderr)
	}
	code, stdout, stderr = runCLI(t, "bench", "--device", "auto", shards)
	if code != 0 || !strings.Contains(stdout, "device ") {
		t.Errorf("--device auto: exit %d: %s %s", code, stdout, stderr)
	}
}
