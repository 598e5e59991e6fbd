// Package pinned owns the host memory that batches are collated into: a fixed ring of
// page-locked slabs that another process can map. It does not know field types; a slab
// is just bytes.
//
// # Slabs are memfd memory
//
// Each slab is an anonymous memory file (memfd_create(2), close-on-exec) of
// Ring.SlabBytes bytes, mapped MAP_SHARED into this process. Its file descriptor
// (Slab.FD) is what the loader process passes to a trainer over a unix socket with
// SCM_RIGHTS; the trainer mmaps it once and sees the very same pages, so a batch is
// written once and read in place, with no copy between the processes. The memfd's size
// is sealed (F_SEAL_SHRINK, F_SEAL_GROW, F_SEAL_SEAL) so that a process it is shared
// with cannot truncate it under this one's mapping. Memfds are Linux's; on other
// systems NewRing returns an error wrapping errors.ErrUnsupported.
//
// # Locking, and what happens when it is not allowed
//
// Unless Options.NoLock is set, every slab is mlock(2)ed, which keeps it resident and
// lets a GPU driver copy from it by DMA without staging it first. Locked memory is
// capped by RLIMIT_MEMLOCK (often only 8 MiB, or 64 KiB on older systems) unless the
// process has CAP_IPC_LOCK (root normally has). Before locking, NewRing compares the
// ring's total size with the soft limit: if it does not fit and the process lacks
// CAP_IPC_LOCK, it does not try. If it tries and mlock fails (memory this process has
// already locked counts against the same limit), it unlocks what it had locked. In both
// cases it reports one line through Options.Warn, naming the limit, the bytes needed
// and how to raise the limit (ulimit -l, systemd LimitMEMLOCK=, docker --ulimit
// memlock=-1), and carries on: the slabs work unpinned, only device copies are slower.
// Locking never makes NewRing fail; Ring.Locked says whether it happened.
//
// Pages are faulted in when the ring is made (by MADV_POPULATE_WRITE where the kernel
// has it, by mlock, or else by writing one byte per page) so the first batch does not
// stall on page faults.
//
// # Huge pages
//
// Unless Options.NoHugePages is set, slabs are sized in multiples of 2 MiB and advised
// with MADV_HUGEPAGE, so that the kernel may back them with transparent huge pages:
// fewer TLB misses when a batch is written and fewer pages for a driver to pin. Whether
// shared memory actually gets huge pages is the system's choice
// (/sys/kernel/mm/transparent_hugepage/shmem_enabled must be "advise", "always" or
// "within_size"); an advice the kernel refuses is not an error, and Ring.HugePages
// says whether it was accepted.
//
// # NUMA placement
//
// Options.Bind is called with each slab's memory after mapping and before any page
// is faulted in, so that a caller can bind the slabs to the NUMA node of the GPU they
// feed (package numa's Bind does it with mbind). This package does not know nodes; a
// Bind that fails gives one warning and the ring carries on, as with locking.
//
// # The ring
//
// A Ring hands out its slabs with Acquire, which blocks while all of them are in use:
// that is the back-pressure that stops collation when the trainer falls behind. Release
// hands a slab back. All methods are safe for concurrent use. Close unmaps the memory;
// a slab still acquired at that moment must not be touched afterwards.
package pinned
