package numa

import (
	"fmt"
	"strconv"
	"strings"
)

// CUDAIndex returns the index in t.GPUs (PCI bus order) of the GPU that CUDA numbers
// ordinal in a process whose CUDA_VISIBLE_DEVICES is visible ("" when unset). CUDA
// numbers the visible GPUs in the order CUDA_VISIBLE_DEVICES lists them, each entry
// an index in CUDA's own order: PCI bus order under CUDA_DEVICE_ORDER=PCI_BUS_ID, and
// "fastest first" otherwise, which is PCI bus order on a node of identical GPUs (the
// case this assumes). Entries given as UUIDs or MIG instances cannot be resolved from
// sysfs: the error says so, and the PCI address from the driver (Topology.GPUByPCI)
// is then the way.
func (t *Topology) CUDAIndex(ordinal int, visible string) (int, error) {
	if ordinal < 0 {
		return -1, fmt.Errorf("%w: CUDA device %d", ErrNoGPU, ordinal)
	}
	index := ordinal
	if visible = strings.TrimSpace(visible); visible != "" {
		var list []int
		for _, e := range strings.Split(visible, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(e))
			if err != nil {
				// CUDA stops at the first invalid entry; a UUID is valid to CUDA but
				// means nothing to sysfs.
				if strings.HasPrefix(strings.TrimSpace(e), "GPU-") || strings.HasPrefix(strings.TrimSpace(e), "MIG-") {
					return -1, fmt.Errorf("numa: CUDA_VISIBLE_DEVICES=%q names GPUs by UUID: CUDA device %d cannot be matched to a PCI address without the driver", visible, ordinal)
				}
				break
			}
			if n < 0 {
				break
			}
			list = append(list, n)
		}
		if ordinal >= len(list) {
			return -1, fmt.Errorf("%w: CUDA device %d, but CUDA_VISIBLE_DEVICES=%q makes %d visible", ErrNoGPU, ordinal, visible, len(list))
		}
		index = list[ordinal]
	}
	if index >= len(t.GPUs) {
		return -1, fmt.Errorf("%w: CUDA device %d is GPU %d in PCI order; the machine has %d NVIDIA GPUs", ErrNoGPU, ordinal, index, len(t.GPUs))
	}
	return index, nil
}

// PlaceCUDA plans for the GPU that CUDA numbers ordinal in a process whose
// CUDA_VISIBLE_DEVICES is visible (see CUDAIndex and Place). On a machine of one
// node a GPU that cannot be resolved is no error: nothing needs its node, and the
// plan says so.
func (t *Topology) PlaceCUDA(ordinal int, visible string) (Plan, error) {
	index, err := t.CUDAIndex(ordinal, visible)
	if err != nil {
		if len(t.Nodes) > 1 {
			return Plan{GPU: -1, Node: -1, CPUs: t.CPUs()}, err
		}
		index = ordinal
	}
	return t.Place(index)
}
