package numa

import "fmt"

// Plan says where the pipeline feeding one GPU should run: the CPUs for its threads
// and the node for its memory.
type Plan struct {
	// GPU is the GPU index the plan was made for, PCI its address ("" when the
	// topology lists no such GPU).
	GPU int    `json:"gpu"`
	PCI string `json:"pci,omitempty"`
	// Node is the NUMA node to bind memory to, -1 when memory is not to be bound
	// (one node, or the GPU's node unknown).
	Node int `json:"node"`
	// CPUs are the CPUs the pipeline's threads may run on: the node's, or every CPU
	// when Node is -1.
	CPUs []int `json:"cpus"`
	// Reason says in one line what the plan does and why.
	Reason string `json:"reason"`
}

// Placed reports whether the plan restricts anything: a node to bind memory to and
// its CPUs.
func (p Plan) Placed() bool { return p.Node >= 0 }

// Place plans for GPU gpu (an index in Topology.GPUs). On a machine with several
// nodes and a GPU whose node is known, the plan is that node and its CPUs. In every
// other case it places nothing (Node -1, every CPU) and Reason says why: one node,
// a GPU whose firmware reports no node, a node without CPUs. A gpu index the
// topology lacks is an error wrapping ErrNoGPU, unless the machine has one node (then
// nothing needs the GPU's node, and the plan says so).
func (t *Topology) Place(gpu int) (Plan, error) {
	all := t.CPUs()
	p := Plan{GPU: gpu, Node: -1, CPUs: all}
	if gpu < 0 || gpu >= len(t.GPUs) {
		if len(t.Nodes) <= 1 {
			p.Reason = fmt.Sprintf("one NUMA node, nothing to place (GPU %d not found among %d NVIDIA GPUs); threads on CPUs %s",
				gpu, len(t.GPUs), FormatCPUList(all))
			return p, nil
		}
		return p, fmt.Errorf("%w: GPU %d, the machine has %d NVIDIA GPUs (sys/bus/pci/devices)", ErrNoGPU, gpu, len(t.GPUs))
	}
	g := t.GPUs[gpu]
	p.PCI = g.PCI
	switch {
	case len(t.Nodes) <= 1:
		p.Reason = fmt.Sprintf("one NUMA node, nothing to place; threads on CPUs %s", FormatCPUList(all))
		if t.Fallback != "" {
			p.Reason += " (" + t.Fallback + ")"
		}
	case g.Node < 0:
		p.Reason = fmt.Sprintf("GPU %d (%s) has no NUMA node in sysfs (numa_node -1): memory left unbound, threads on every CPU %s; "+
			"check the BIOS (ACPI SRAT/_PXM) or pin by hand", gpu, g.PCI, FormatCPUList(all))
	default:
		n, ok := t.Node(g.Node)
		if !ok || len(n.CPUs) == 0 {
			p.Reason = fmt.Sprintf("GPU %d (%s) is on node %d, which has no CPUs: memory left unbound, threads on every CPU %s",
				gpu, g.PCI, g.Node, FormatCPUList(all))
			return p, nil
		}
		p.Node = n.ID
		p.CPUs = n.CPUs
		p.Reason = fmt.Sprintf("GPU %d (%s) is on node %d: threads on its CPUs %s, memory bound to node %d",
			gpu, g.PCI, n.ID, FormatCPUList(n.CPUs), n.ID)
	}
	return p, nil
}
