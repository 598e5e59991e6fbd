// Package numa owns the machine's topology as sysfs describes it: NUMA nodes, their
// CPUs and memory, and the node each NVIDIA GPU hangs off. From it, Topology.Place
// makes a placement plan for one GPU (its node and that node's CPUs), and the package
// applies such a plan: CPU affinity for the threads that run the pipeline
// (sched_setaffinity) and memory binding for its buffers (mbind).
//
// Nothing requires NUMA. A kernel without it (no /sys/devices/system/node), a
// machine with one node, or a GPU whose node the firmware does not report
// (numa_node -1) gives a plan that places nothing, and Topology.Fallback or
// Plan.Reason says so in words. The placement never guesses a node from the GPU's
// index (gpu % nodes): on many servers that is wrong, and a wrong binding costs more
// than none.
//
// # Where the facts come from
//
// Read takes a root directory so that tests (and "shardload doctor --sysfs") can
// point it at a copy of a machine's files; "/" reads this machine's:
//
//	sys/devices/system/node/nodeN/cpulist    the node's CPUs ("0-23,48-71")
//	sys/devices/system/node/nodeN/meminfo    "Node N MemTotal: ... kB", MemFree
//	sys/devices/system/cpu/online            every CPU, when there are no nodes
//	sys/bus/pci/devices/*/{vendor,class,numa_node}
//	                                         NVIDIA (vendor 0x10de) display or 3D
//	                                         controllers (class 0x03xxxx) and their node
//
// GPUs are numbered in PCI bus order, as nvidia-smi numbers them. CUDA numbers them
// the same way when CUDA_DEVICE_ORDER=PCI_BUS_ID is set (its default order is
// "fastest first", which differs on machines with unlike GPUs); CUDA_VISIBLE_DEVICES
// renumbers them further, which the placement does not follow: give it the physical
// index, or look the GPU up by PCI address with Topology.GPUByPCI.
package numa
