// Package numa will own the machine's topology as sysfs describes it (NUMA nodes, their
// CPUs and memory, each GPU's node), CPU affinity for pipeline threads and memory
// binding for slabs and cache. A machine without NUMA is one node; nothing requires it.
package numa
