package numa

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
)

// Errors of this package.
var (
	// ErrCPUList is wrapped by ParseCPUList's errors.
	ErrCPUList = errors.New("numa: bad cpu list")
	// ErrNoGPU is wrapped by Place's error for a GPU index the topology does not have.
	ErrNoGPU = errors.New("numa: no such GPU")
)

// NVIDIAVendor is the PCI vendor ID of NVIDIA devices.
const NVIDIAVendor = 0x10de

// Node is one NUMA node.
type Node struct {
	// ID is the node number N of /sys/devices/system/node/nodeN.
	ID int `json:"id"`
	// CPUs are the node's logical CPUs, ascending.
	CPUs []int `json:"cpus"`
	// MemTotal and MemFree are the node's memory in bytes, 0 when unknown.
	MemTotal int64 `json:"mem_total_bytes"`
	MemFree  int64 `json:"mem_free_bytes"`
}

// GPU is one NVIDIA GPU on the PCI bus.
type GPU struct {
	// Index is the GPU's number in PCI bus order (nvidia-smi's numbering).
	Index int `json:"index"`
	// PCI is its PCI address, "0000:3b:00.0".
	PCI string `json:"pci"`
	// Device is the PCI device ID, "0x2335".
	Device string `json:"device"`
	// Node is the NUMA node the device is attached to, -1 when the firmware does not
	// say (numa_node -1 or missing).
	Node int `json:"node"`
}

// Topology is what Read found. Its zero value is not useful; Read always returns at
// least one node.
type Topology struct {
	// Nodes are the NUMA nodes, by ascending ID.
	Nodes []Node `json:"nodes"`
	// GPUs are the NVIDIA GPUs, in PCI bus order.
	GPUs []GPU `json:"gpus"`
	// Fallback is empty when the nodes come from sysfs; otherwise it says why the
	// machine is taken as one node ("no NUMA information in sysfs: ...").
	Fallback string `json:"fallback,omitempty"`
}

// Read reads the topology under root, a directory holding sys/ as the running
// kernel's /sys is laid out; "" means "/". A machine without NUMA information is
// returned as one node holding every online CPU, with Fallback saying so; an error
// is returned only for files that exist but cannot be read or parsed.
func Read(root string) (*Topology, error) {
	if root == "" {
		root = "/"
	}
	t := &Topology{}
	nodes, err := readNodes(root)
	if err != nil {
		return nil, err
	}
	t.Nodes = nodes
	if len(t.Nodes) == 0 {
		cpus, why := fallbackCPUs(root)
		t.Nodes = []Node{{ID: 0, CPUs: cpus}}
		t.Fallback = "no NUMA nodes in " + filepath.Join(root, "sys/devices/system/node") +
			" (kernel without NUMA, or sysfs not mounted): taken as one node with " + why
	}
	if t.GPUs, err = readGPUs(root); err != nil {
		return nil, err
	}
	return t, nil
}

// readNodes returns the nodeN directories' nodes, nil when there are none.
func readNodes(root string) ([]Node, error) {
	dir := filepath.Join(root, "sys/devices/system/node")
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("numa: %w", err)
	}
	var nodes []Node
	for _, e := range ents {
		rest, ok := strings.CutPrefix(e.Name(), "node")
		id, err := strconv.Atoi(rest)
		if !ok || err != nil || id < 0 {
			continue
		}
		n := Node{ID: id}
		p := filepath.Join(dir, e.Name(), "cpulist")
		b, err := os.ReadFile(p)
		if err != nil {
			return nil, fmt.Errorf("numa: %w", err)
		}
		if n.CPUs, err = ParseCPUList(string(b)); err != nil {
			return nil, fmt.Errorf("numa: %s: %w", p, err)
		}
		// meminfo is optional: memory-less or hot-plugged nodes may lack it.
		if b, err := os.ReadFile(filepath.Join(dir, e.Name(), "meminfo")); err == nil {
			n.MemTotal, n.MemFree = parseMeminfo(string(b))
		}
		nodes = append(nodes, n)
	}
	slices.SortFunc(nodes, func(a, b Node) int { return a.ID - b.ID })
	return nodes, nil
}

// fallbackCPUs returns every online CPU and where the list came from.
func fallbackCPUs(root string) ([]int, string) {
	p := filepath.Join(root, "sys/devices/system/cpu/online")
	if b, err := os.ReadFile(p); err == nil {
		if cpus, err := ParseCPUList(string(b)); err == nil && len(cpus) > 0 {
			return cpus, "the online CPUs of " + p
		}
	}
	cpus := make([]int, runtime.NumCPU())
	for i := range cpus {
		cpus[i] = i
	}
	return cpus, fmt.Sprintf("CPUs 0-%d (runtime.NumCPU; %s unreadable)", len(cpus)-1, p)
}

// parseMeminfo reads MemTotal and MemFree, in bytes, from a node's meminfo:
// "Node 0 MemTotal:       263856880 kB".
func parseMeminfo(s string) (total, free int64) {
	for line := range strings.Lines(s) {
		f := strings.Fields(line)
		if len(f) != 5 || f[0] != "Node" || f[4] != "kB" {
			continue
		}
		v, err := strconv.ParseInt(f[3], 10, 64)
		if err != nil {
			continue
		}
		switch f[2] {
		case "MemTotal:":
			total = v << 10
		case "MemFree:":
			free = v << 10
		}
	}
	return total, free
}

// readGPUs lists NVIDIA display and 3D controllers under sys/bus/pci/devices, in PCI
// address order. Other NVIDIA functions (NVSwitches, audio, USB) are not GPUs.
func readGPUs(root string) ([]GPU, error) {
	dir := filepath.Join(root, "sys/bus/pci/devices")
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("numa: %w", err)
	}
	var gpus []GPU
	for _, e := range ents {
		d := filepath.Join(dir, e.Name())
		vendor, err1 := readHex(filepath.Join(d, "vendor"))
		class, err2 := readHex(filepath.Join(d, "class"))
		if err1 != nil || err2 != nil || vendor != NVIDIAVendor || class>>16 != 0x03 {
			continue
		}
		g := GPU{PCI: e.Name(), Node: -1}
		if b, err := os.ReadFile(filepath.Join(d, "device")); err == nil {
			g.Device = strings.TrimSpace(string(b))
		}
		if b, err := os.ReadFile(filepath.Join(d, "numa_node")); err == nil {
			if n, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && n >= 0 {
				g.Node = n
			}
		}
		gpus = append(gpus, g)
	}
	// PCI addresses are fixed-width lower-case hex, so string order is bus order.
	slices.SortFunc(gpus, func(a, b GPU) int { return strings.Compare(a.PCI, b.PCI) })
	for i := range gpus {
		gpus[i].Index = i
	}
	return gpus, nil
}

func readHex(path string) (uint64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	return strconv.ParseUint(strings.TrimPrefix(strings.TrimSpace(string(b)), "0x"), 16, 32)
}

// Node returns the node with the given ID.
func (t *Topology) Node(id int) (Node, bool) {
	for _, n := range t.Nodes {
		if n.ID == id {
			return n, true
		}
	}
	return Node{}, false
}

// GPUByPCI returns the GPU at a PCI address; the comparison ignores case and
// accepts CUDA's 8-digit domain ("00000000:3B:00.0", from cuDeviceGetPCIBusId).
func (t *Topology) GPUByPCI(addr string) (GPU, bool) {
	want := normPCI(addr)
	for _, g := range t.GPUs {
		if normPCI(g.PCI) == want {
			return g, true
		}
	}
	return GPU{}, false
}

// normPCI lower-cases a PCI address and trims its domain to 4 digits.
func normPCI(a string) string {
	a = strings.ToLower(strings.TrimSpace(a))
	if dom, rest, ok := strings.Cut(a, ":"); ok && len(dom) > 4 {
		a = dom[len(dom)-4:] + ":" + rest
	}
	return a
}

// CPUs returns every CPU of every node, ascending.
func (t *Topology) CPUs() []int {
	var all []int
	for _, n := range t.Nodes {
		all = append(all, n.CPUs...)
	}
	slices.Sort(all)
	return slices.Compact(all)
}
