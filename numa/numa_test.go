package numa

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// span returns the CPUs lo..hi.
func span(lo, hi int) []int {
	var c []int
	for i := lo; i <= hi; i++ {
		c = append(c, i)
	}
	return c
}

func TestParseCPUList(t *testing.T) {
	tests := []struct {
		in   string
		want []int
	}{
		{"", nil},
		{"\n", nil},
		{"0", []int{0}},
		{"0-3", span(0, 3)},
		{"0-3,8-11\n", append(span(0, 3), span(8, 11)...)},
		{"8-11,0-3", append(span(0, 3), span(8, 11)...)},
		{"0,2,4", []int{0, 2, 4}},
		{"1-2,2-3", span(1, 3)},
		{"5-5", []int{5}},
		{"0-23,48-71", append(span(0, 23), span(48, 71)...)},
	}
	for _, tt := range tests {
		got, err := ParseCPUList(tt.in)
		if err != nil || !slices.Equal(got, tt.want) {
			t.Errorf("ParseCPUList(%q) = %v, %v; want %v", tt.in, got, err, tt.want)
		}
	}
	for _, bad := range []string{"a", "1-", "-1", "3-1", "1,,2", "0x1", "1 - 2", "0-65536", "99999999999999999999", "+1", "0-3:2"} {
		if got, err := ParseCPUList(bad); !errors.Is(err, ErrCPUList) {
			t.Errorf("ParseCPUList(%q) = %v, %v; want ErrCPUList", bad, got, err)
		}
	}
}

func TestFormatCPUList(t *testing.T) {
	tests := []struct {
		in   []int
		want string
	}{
		{nil, ""},
		{[]int{0}, "0"},
		{[]int{3, 2, 1, 0, 9, 8}, "0-3,8-9"},
		{[]int{0, 2, 4}, "0,2,4"},
		{[]int{1, 1, 2}, "1-2"},
	}
	for _, tt := range tests {
		if got := FormatCPUList(tt.in); got != tt.want {
			t.Errorf("FormatCPUList(%v) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

// FuzzParseCPUList checks that the parser never panics, returns sorted distinct CPUs
// below MaxCPU, and that formatting and parsing again gives the same CPUs.
func FuzzParseCPUList(f *testing.F) {
	for _, s := range []string{"0-3,8-11", "0", "", "0-23,48-71", "1,3,5-7", "3-1", "0-65535", "a-b"} {
		f.Add(s)
	}
	// Seed with every cpulist of the fake trees.
	paths, _ := filepath.Glob("testdata/*/sys/devices/system/node/node*/cpulist")
	for _, p := range paths {
		if b, err := os.ReadFile(p); err == nil {
			f.Add(string(b))
		}
	}
	f.Fuzz(func(t *testing.T, s string) {
		cpus, err := ParseCPUList(s)
		if err != nil {
			if !errors.Is(err, ErrCPUList) {
				t.Fatalf("error %v does not wrap ErrCPUList", err)
			}
			return
		}
		for i, c := range cpus {
			if c < 0 || c >= MaxCPU || (i > 0 && c <= cpus[i-1]) {
				t.Fatalf("ParseCPUList(%q) = %v: not ascending distinct CPUs below %d", s, cpus, MaxCPU)
			}
		}
		again, err := ParseCPUList(FormatCPUList(cpus))
		if err != nil || !slices.Equal(again, cpus) {
			t.Fatalf("round trip of %q: %v -> %q -> %v, %v", s, cpus, FormatCPUList(cpus), again, err)
		}
	})
}

func readTree(t *testing.T, name string) *Topology {
	t.Helper()
	topo, err := Read(filepath.Join("testdata", name))
	if err != nil {
		t.Fatalf("Read(%s): %v", name, err)
	}
	return topo
}

func TestReadTwoSocket(t *testing.T) {
	topo := readTree(t, "two-socket-8gpu")
	if topo.Fallback != "" {
		t.Errorf("Fallback = %q, want none", topo.Fallback)
	}
	want := []Node{
		{ID: 0, CPUs: append(span(0, 23), span(48, 71)...), MemTotal: 1056462436 << 10, MemFree: 1001226212 << 10},
		{ID: 1, CPUs: append(span(24, 47), span(72, 95)...), MemTotal: 1056935576 << 10, MemFree: 998230012 << 10},
	}
	if len(topo.Nodes) != len(want) {
		t.Fatalf("%d nodes, want %d: %+v", len(topo.Nodes), len(want), topo.Nodes)
	}
	for i, n := range topo.Nodes {
		w := want[i]
		if n.ID != w.ID || !slices.Equal(n.CPUs, w.CPUs) || n.MemTotal != w.MemTotal || n.MemFree != w.MemFree {
			t.Errorf("node %d = %+v, want %+v", i, n, w)
		}
	}
	// The NVSwitch, the audio function and the NICs are not GPUs.
	wantPCI := []string{"0000:18:00.0", "0000:2a:00.0", "0000:3a:00.0", "0000:5d:00.0",
		"0000:9a:00.0", "0000:ab:00.0", "0000:ba:00.0", "0000:db:00.0"}
	if len(topo.GPUs) != len(wantPCI) {
		t.Fatalf("GPUs = %+v, want %v", topo.GPUs, wantPCI)
	}
	for i, g := range topo.GPUs {
		node := i / 4
		if g.Index != i || g.PCI != wantPCI[i] || g.Node != node || g.Device != "0x2330" {
			t.Errorf("GPU %d = %+v, want index %d at %s on node %d, device 0x2330", i, g, i, wantPCI[i], node)
		}
	}
	if got := topo.CPUs(); !slices.Equal(got, span(0, 95)) {
		t.Errorf("CPUs() = %s, want 0-95", FormatCPUList(got))
	}
	for _, addr := range []string{"0000:AB:00.0", "00000000:ab:00.0", " 0000:ab:00.0\n"} {
		if g, ok := topo.GPUByPCI(addr); !ok || g.Index != 5 {
			t.Errorf("GPUByPCI(%q) = %+v, %v; want GPU 5", addr, g, ok)
		}
	}
	if g, ok := topo.GPUByPCI("0000:05:00.0"); ok {
		t.Errorf("GPUByPCI(NVSwitch) = %+v", g)
	}
}

func TestPlans(t *testing.T) {
	node0 := append(span(0, 23), span(48, 71)...)
	node1 := append(span(24, 47), span(72, 95)...)
	tests := []struct {
		tree       string
		gpu        int
		node       int
		cpus       []int
		reasonHas  string
		pci        string
		wantNoGPU  bool
		noFallback bool
	}{
		{tree: "two-socket-8gpu", gpu: 0, node: 0, cpus: node0, pci: "0000:18:00.0", reasonHas: "GPU 0 (0000:18:00.0) is on node 0: threads on its CPUs 0-23,48-71"},
		{tree: "two-socket-8gpu", gpu: 3, node: 0, cpus: node0, pci: "0000:5d:00.0", reasonHas: "memory bound to node 0"},
		// gpu % nodes would say node 0 for GPU 4 and node 1 for GPU 1: both wrong here.
		{tree: "two-socket-8gpu", gpu: 4, node: 1, cpus: node1, pci: "0000:9a:00.0", reasonHas: "is on node 1"},
		{tree: "two-socket-8gpu", gpu: 1, node: 0, cpus: node0, pci: "0000:2a:00.0", reasonHas: "is on node 0"},
		{tree: "two-socket-8gpu", gpu: 7, node: 1, cpus: node1, pci: "0000:db:00.0", reasonHas: "CPUs 24-47,72-95"},
		{tree: "two-socket-8gpu", gpu: 8, node: -1, wantNoGPU: true},
		{tree: "two-socket-8gpu", gpu: -1, node: -1, wantNoGPU: true},
		{tree: "no-numa", gpu: 0, node: -1, cpus: span(0, 7), pci: "0000:01:00.0", reasonHas: "one NUMA node, nothing to place; threads on CPUs 0-7 (no NUMA nodes in"},
		{tree: "no-numa", gpu: 3, node: -1, cpus: span(0, 7), reasonHas: "GPU 3 not found among 1 NVIDIA GPUs"},
		{tree: "gpu-node-unknown", gpu: 0, node: -1, cpus: span(0, 15), pci: "0000:3b:00.0", reasonHas: "has no NUMA node in sysfs (numa_node -1): memory left unbound, threads on every CPU 0-15"},
		{tree: "gpu-node-unknown", gpu: 1, node: 1, cpus: span(8, 15), pci: "0000:86:00.0", reasonHas: "is on node 1: threads on its CPUs 8-15"},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%s/gpu%d", tt.tree, tt.gpu), func(t *testing.T) {
			p, err := readTree(t, tt.tree).Place(tt.gpu)
			if tt.wantNoGPU {
				if !errors.Is(err, ErrNoGPU) {
					t.Fatalf("Place(%d) = %+v, %v; want ErrNoGPU", tt.gpu, p, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if p.GPU != tt.gpu || p.Node != tt.node || p.PCI != tt.pci || !slices.Equal(p.CPUs, tt.cpus) || p.Placed() != (tt.node >= 0) {
				t.Errorf("Place(%d) = %+v, want node %d CPUs %s PCI %q", tt.gpu, p, tt.node, FormatCPUList(tt.cpus), tt.pci)
			}
			if !strings.Contains(p.Reason, tt.reasonHas) {
				t.Errorf("Reason %q lacks %q", p.Reason, tt.reasonHas)
			}
		})
	}
}

func TestReadNoNUMA(t *testing.T) {
	topo := readTree(t, "no-numa")
	if len(topo.Nodes) != 1 || topo.Nodes[0].ID != 0 || !slices.Equal(topo.Nodes[0].CPUs, span(0, 7)) {
		t.Errorf("Nodes = %+v, want one node 0 with CPUs 0-7", topo.Nodes)
	}
	if !strings.Contains(topo.Fallback, "no NUMA nodes") || !strings.Contains(topo.Fallback, "cpu/online") {
		t.Errorf("Fallback = %q, want it to say there are no nodes and where the CPUs came from", topo.Fallback)
	}
	if len(topo.GPUs) != 1 || topo.GPUs[0].Node != -1 || topo.GPUs[0].PCI != "0000:01:00.0" {
		t.Errorf("GPUs = %+v, want one at 0000:01:00.0 with node -1", topo.GPUs)
	}
}

func TestReadGPUNodeUnknown(t *testing.T) {
	topo := readTree(t, "gpu-node-unknown")
	if len(topo.Nodes) != 2 || topo.Nodes[1].MemTotal != 0 || topo.Nodes[0].MemTotal != 131072000<<10 {
		t.Errorf("Nodes = %+v, want 2, node 1 without meminfo", topo.Nodes)
	}
	if len(topo.GPUs) != 2 || topo.GPUs[0].Node != -1 || topo.GPUs[1].Node != 1 {
		t.Errorf("GPUs = %+v, want nodes -1 and 1", topo.GPUs)
	}
}

func TestReadEmptyRoot(t *testing.T) {
	topo, err := Read(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if len(topo.Nodes) != 1 || len(topo.Nodes[0].CPUs) == 0 || len(topo.GPUs) != 0 || !strings.Contains(topo.Fallback, "runtime.NumCPU") {
		t.Errorf("empty root: %+v", topo)
	}
}

func TestReadBadCPUList(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "sys/devices/system/node/node0")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "cpulist"), []byte("0-x\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := Read(root)
	if !errors.Is(err, ErrCPUList) || !strings.Contains(err.Error(), "node0/cpulist") {
		t.Errorf("Read with a bad cpulist: %v, want ErrCPUList naming the file", err)
	}
}

// TestReadThisMachine reads the real /sys: whatever the machine, there is at least
// one node with CPUs, and every GPU index matches its position.
func TestReadThisMachine(t *testing.T) {
	topo, err := Read("")
	if err != nil {
		t.Fatal(err)
	}
	if len(topo.Nodes) == 0 || len(topo.CPUs()) == 0 {
		t.Fatalf("no nodes or CPUs: %+v", topo)
	}
	for i, g := range topo.GPUs {
		if g.Index != i {
			t.Errorf("GPU %d has index %d", i, g.Index)
		}
	}
}

func TestCUDAIndex(t *testing.T) {
	topo := readTree(t, "two-socket-8gpu")
	tests := []struct {
		ordinal int
		visible string
		want    int
		errHas  string
	}{
		{ordinal: 0, want: 0},
		{ordinal: 5, want: 5},
		{ordinal: 0, visible: "4,5", want: 4},
		{ordinal: 1, visible: " 6, 2 ", want: 2},
		{ordinal: 2, visible: "4,5", want: -1, errHas: "makes 2 visible"},
		{ordinal: 1, visible: "3,-1,5", want: -1, errHas: "makes 1 visible"},
		{ordinal: 0, visible: "GPU-8a7c2e52-0000", want: -1, errHas: "by UUID"},
		{ordinal: 8, want: -1, errHas: "has 8 NVIDIA GPUs"},
		{ordinal: 0, visible: "9", want: -1, errHas: "has 8 NVIDIA GPUs"},
		{ordinal: -1, want: -1, errHas: "no such GPU"},
	}
	for _, tt := range tests {
		got, err := topo.CUDAIndex(tt.ordinal, tt.visible)
		if got != tt.want || (tt.errHas == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tt.errHas)) {
			t.Errorf("CUDAIndex(%d, %q) = %d, %v; want %d, error with %q", tt.ordinal, tt.visible, got, err, tt.want, tt.errHas)
		}
	}
}

func TestPlaceCUDA(t *testing.T) {
	if p, err := readTree(t, "two-socket-8gpu").PlaceCUDA(0, "4,5"); err != nil || p.GPU != 4 || p.Node != 1 {
		t.Errorf("PlaceCUDA(0, \"4,5\") = %+v, %v; want GPU 4 on node 1", p, err)
	}
	if p, err := readTree(t, "two-socket-8gpu").PlaceCUDA(0, "GPU-8a7c"); err == nil || p.Placed() {
		t.Errorf("a UUID on two nodes: %+v, %v; want an error and no placement", p, err)
	}
	if p, err := readTree(t, "no-numa").PlaceCUDA(0, "GPU-8a7c"); err != nil || p.Placed() || !strings.Contains(p.Reason, "one NUMA node") {
		t.Errorf("a UUID on one node: %+v, %v; want nothing to place, no error", p, err)
	}
}
