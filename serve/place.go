package serve

import (
	"fmt"
	"strings"

	"github.com/shardload/shardload/numa"
	"github.com/shardload/shardload/wire"
)

// sessionPlace is where a session's pipeline runs.
type sessionPlace struct {
	msg  wire.Placement // as the ready message reports it
	node int            // the node to bind the slabs to, -1 for none
	cpus []int          // the CPUs of the loader's threads when node >= 0
}

// unplaced is a placement that restricts nothing, for the reason given.
func unplaced(reason string) sessionPlace {
	return sessionPlace{node: -1, msg: wire.Placement{GPU: -1, Node: -1, Reason: reason}}
}

// place plans where the session of hello h runs: on the NUMA node of the GPU at
// h.GPUPCI, or else of the trainer's CUDA device h.LocalRank, found in PCI bus order
// through the trainer's CUDA_VISIBLE_DEVICES (numa.Topology.CUDAIndex). Where there
// is nothing to place, or the GPU is not found, the session runs unplaced and the
// reason says why; that never fails the session.
func (s *Server) place(h *wire.Hello) sessionPlace {
	const everywhere = "threads on every CPU, memory where the kernel puts it"
	switch {
	case s.opts.NoPlace:
		return unplaced("NUMA placement is off (--numa=false): " + everywhere)
	case s.topo == nil:
		return unplaced(fmt.Sprintf("no NUMA placement, the topology could not be read (%v): %s", s.topoErr, everywhere))
	}
	t := s.topo
	by := fmt.Sprintf("local rank %d", h.LocalRank)
	if h.CUDAVisible != "" {
		by += fmt.Sprintf(" (CUDA_VISIBLE_DEVICES=%s)", h.CUDAVisible)
	}
	var plan numa.Plan
	var err error
	if h.GPUPCI != "" {
		g, ok := t.GPUByPCI(h.GPUPCI)
		if !ok {
			return unplaced(fmt.Sprintf("gpu_pci %s: no such NVIDIA GPU among the %d of this machine (sys/bus/pci/devices): %s",
				h.GPUPCI, len(t.GPUs), everywhere))
		}
		by = "gpu_pci " + h.GPUPCI
		plan, err = t.Place(g.Index)
	} else {
		plan, err = t.PlaceCUDA(h.LocalRank, h.CUDAVisible)
	}
	if err != nil {
		return unplaced(fmt.Sprintf("%s: %v: %s", by, err, everywhere))
	}
	p := unplaced(by + ": " + plan.Reason)
	if plan.PCI != "" {
		p.msg.GPU, p.msg.PCI = plan.GPU, plan.PCI
	}
	if plan.Placed() {
		p.node, p.cpus = plan.Node, plan.CPUs
		p.msg.Node, p.msg.CPUs = plan.Node, numa.FormatCPUList(plan.CPUs)
	}
	return p
}

// pciAddress reports whether a is empty or could be a PCI address: hex digits,
// colons and a dot, as sysfs and CUDA write them ("0000:3b:00.0", "00000000:3B:00.0").
func pciAddress(a string) bool {
	if len(a) > 32 {
		return false
	}
	for _, c := range a {
		if !strings.ContainsRune("0123456789abcdefABCDEF:.", c) {
			return false
		}
	}
	return true
}

// visibleDevices reports whether v could be a CUDA_VISIBLE_DEVICES list: indices,
// GPU or MIG UUIDs, commas.
func visibleDevices(v string) bool {
	if len(v) > 1024 {
		return false
	}
	for _, c := range v {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || strings.ContainsRune(",-/ ", c)) {
			return false
		}
	}
	return true
}

// bind returns the function that binds a slab to the session's node, nil when the
// session is not placed.
func (p *sessionPlace) bind() func(mem []byte) error {
	if p.node < 0 {
		return nil
	}
	node := p.node
	return func(mem []byte) error { return numa.Bind(mem, node) }
}
