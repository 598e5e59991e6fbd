package serve

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/shardload/shardload"
	"github.com/shardload/shardload/numa"
	"github.com/shardload/shardload/wire"
)

// fakeSysfs writes a machine of two NUMA nodes (node 0: CPU 0, node 1: CPU 1) with
// one NVIDIA GPU on each, and returns its root for numa.Read.
func fakeSysfs(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	files := map[string]string{
		"sys/devices/system/node/node0/cpulist": "0\n",
		"sys/devices/system/node/node1/cpulist": "1\n",
	}
	for pci, node := range map[string]string{"0000:3b:00.0": "0", "0000:d8:00.0": "1"} {
		d := "sys/bus/pci/devices/" + pci + "/"
		files[d+"vendor"], files[d+"class"], files[d+"device"], files[d+"numa_node"] = "0x10de\n", "0x030200\n", "0x2330\n", node+"\n"
	}
	for name, text := range files {
		p := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

// logLines collects a server's log.
type logLines struct {
	t     *testing.T
	mu    sync.Mutex
	lines []string
}

func (l *logLines) logf(format string, args ...any) {
	line := fmt.Sprintf(format, args...)
	l.mu.Lock()
	l.lines = append(l.lines, line)
	l.mu.Unlock()
	l.t.Log(line)
}

// find returns the first line that contains every one of subs.
func (l *logLines) find(subs ...string) (string, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
outer:
	for _, line := range l.lines {
		for _, s := range subs {
			if !strings.Contains(line, s) {
				continue outer
			}
		}
		return line, true
	}
	return "", false
}

// threadOn reports whether a thread of this process may run on exactly the CPUs of
// list (as /proc writes it).
func threadOn(list string) bool {
	ents, _ := os.ReadDir("/proc/self/task")
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join("/proc/self/task", e.Name(), "status"))
		if err != nil {
			continue
		}
		for line := range strings.Lines(string(b)) {
			if v, ok := strings.CutPrefix(line, "Cpus_allowed_list:"); ok && strings.TrimSpace(v) == list {
				return true
			}
		}
	}
	return false
}

// TestPlacement places sessions on a fake two-node machine: by local rank, by the GPU's
// PCI address in CUDA's form, and not at all for a GPU the machine lacks. The slabs
// are bound to node 1, which this machine may lack: a warning, not a failure.
func TestPlacement(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("CPU affinity is Linux's")
	}
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil || !set.IsSet(0) || !set.IsSet(1) {
		t.Skipf("this process may not run on CPUs 0 and 1 (%v)", err)
	}
	topo, err := numa.Read(fakeSysfs(t))
	if err != nil {
		t.Fatal(err)
	}
	log := &logLines{t: t}
	s := start(t, Options{URLs: []string{dataset(t)}, Topology: topo, Logf: log.logf,
		Pipeline: shardload.Config{Fields: fields(t, "cls:int"), Slabs: 2, SlabBytes: 4 << 20}})

	for _, tc := range []struct {
		name   string
		h      wire.Hello
		want   wire.Placement // but Reason
		reason string
	}{
		{"local rank 1", wire.Hello{LocalRank: 1}, wire.Placement{GPU: 1, PCI: "0000:d8:00.0", Node: 1, CPUs: "1"}, "local rank 1: GPU 1 (0000:d8:00.0) is on node 1"},
		{"gpu_pci in CUDA's form", wire.Hello{LocalRank: 1, GPUPCI: "00000000:3B:00.0"}, wire.Placement{GPU: 0, PCI: "0000:3b:00.0", Node: 0, CPUs: "0"}, "gpu_pci 00000000:3B:00.0: GPU 0 (0000:3b:00.0) is on node 0"},
		{"no GPU of that local rank", wire.Hello{LocalRank: 5}, wire.Placement{GPU: -1, Node: -1}, "no such GPU"},
		{"local rank through CUDA_VISIBLE_DEVICES", wire.Hello{LocalRank: 0, CUDAVisible: "1,0"}, wire.Placement{GPU: 1, PCI: "0000:d8:00.0", Node: 1, CPUs: "1"}, "local rank 0 (CUDA_VISIBLE_DEVICES=1,0): GPU 1 (0000:d8:00.0) is on node 1"},
		{"CUDA_VISIBLE_DEVICES by UUID", wire.Hello{LocalRank: 0, CUDAVisible: "GPU-5e6a"}, wire.Placement{GPU: -1, Node: -1}, "by UUID"},
		{"no GPU at that address", wire.Hello{GPUPCI: "0000:01:00.0"}, wire.Placement{GPU: -1, Node: -1}, "no such NVIDIA GPU"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := tc.h
			h.Version, h.World, h.BatchSize = Version, 1, 10
			cl, m := dial(t, s.Addr(), h)
			if m != nil {
				t.Fatal(m)
			}
			defer cl.c.Close()
			got := cl.ready.Placement
			// A node this machine lacks cannot be bound: then the node is -1 and the
			// reason says so.
			unbound := got.Node == -1 && tc.want.Node >= 0 && strings.Contains(got.Reason, "memory left unbound")
			if got.GPU != tc.want.GPU || got.PCI != tc.want.PCI || (got.Node != tc.want.Node && !unbound) || got.CPUs != tc.want.CPUs ||
				!strings.Contains(got.Reason, tc.reason) {
				t.Errorf("placement %+v, want %+v with reason %q", got, tc.want, tc.reason)
			}
			if _, ok := log.find(fmt.Sprintf("session %d:", cl.ready.Session), "placement: ", tc.reason); !ok {
				t.Errorf("no start line with the placement in the log")
			}
			// The batches come, the trainer holds them: the pipeline waits for a slab,
			// its threads on the node's CPUs.
			held := []wire.Batch{cl.batch(), cl.batch()}
			if got.CPUs == "1" {
				waitUntil(t, "a loader thread runs on CPU 1 alone", func() bool { return threadOn("1") })
			}
			for _, b := range held {
				cl.release(b)
			}
			if _, e := cl.epoch(); e.Batches != 10 || e.Samples != 100 {
				t.Errorf("end %+v", e)
			}
			if unbound {
				if _, ok := log.find(fmt.Sprintf("session %d: warning:", cl.ready.Session), "not bound"); !ok {
					t.Errorf("the slabs were not bound to node %d, and no warning says so", tc.want.Node)
				}
			}
		})
	}
}

// TestNoPlacement: placement turned off, and a machine of one node, place nothing.
func TestNoPlacement(t *testing.T) {
	topo, err := numa.Read(fakeSysfs(t))
	if err != nil {
		t.Fatal(err)
	}
	one, err := numa.Read(filepath.Join("..", "numa", "testdata", "no-numa"))
	if err != nil {
		t.Fatal(err)
	}
	pattern := dataset(t)
	for _, tc := range []struct {
		name   string
		opts   Options
		gpu    int
		reason string
	}{
		{"off", Options{NoPlace: true, Topology: topo}, -1, "placement is off"},
		{"one node", Options{Topology: one}, 0, "one NUMA node"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			opts := tc.opts
			opts.URLs, opts.Pipeline = []string{pattern}, shardload.Config{Fields: fields(t, "cls:int"), Slabs: 2, SlabBytes: 4 << 20}
			s := start(t, opts)
			cl, m := dial(t, s.Addr(), wire.Hello{Version: Version, World: 1, BatchSize: 10})
			if m != nil {
				t.Fatal(m)
			}
			p := cl.ready.Placement
			if p.GPU != tc.gpu || p.Node != -1 || p.CPUs != "" || !strings.Contains(p.Reason, tc.reason) {
				t.Errorf("placement %+v, want GPU %d, no node, no CPUs, reason with %q", p, tc.gpu, tc.reason)
			}
		})
	}
}
