package numa

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strconv"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Memory policy modes and flags of linux/mempolicy.h (x/sys/unix has no names for
// them).
const (
	mpolPreferred = 1 // MPOL_PREFERRED: allocate on the node, fall back to others when full
	mpolMFMove    = 2 // MPOL_MF_MOVE: move pages already faulted in
)

// ErrNotPermitted is wrapped by the errors of Bind and the affinity functions when
// the kernel refused (EPERM): in a container, mbind and set_mempolicy usually need
// CAP_SYS_NICE or a seccomp profile that allows them, and a cpuset cgroup may forbid
// the CPUs. The memory and threads work, only unplaced.
var ErrNotPermitted = errors.New("numa: not permitted")

// cpuSet builds the kernel's mask of cpus.
func cpuSet(cpus []int) (unix.CPUSetDynamic, error) {
	if len(cpus) == 0 {
		return nil, errors.New("numa: empty CPU set")
	}
	set := unix.NewCPUSet(slices.Max(cpus) + 1)
	for _, c := range cpus {
		if c < 0 {
			return nil, fmt.Errorf("numa: CPU %d", c)
		}
		set.Set(c)
	}
	return set, nil
}

// denied wraps EPERM and EACCES in ErrNotPermitted, keeping the errno.
func denied(err error) error {
	if errors.Is(err, unix.EPERM) || errors.Is(err, unix.EACCES) {
		return fmt.Errorf("%w: %w", ErrNotPermitted, err)
	}
	return err
}

// SetThreadAffinity restricts the calling OS thread to cpus. A goroutine must hold
// its thread (runtime.LockOSThread) for this to mean anything; LockThread does both.
func SetThreadAffinity(cpus []int) error {
	set, err := cpuSet(cpus)
	if err != nil {
		return err
	}
	if err := unix.SchedSetaffinityDynamic(0, set); err != nil {
		return fmt.Errorf("numa: sched_setaffinity to CPUs %s: %w", FormatCPUList(cpus), denied(err))
	}
	return nil
}

// ThreadAffinity returns the CPUs the calling OS thread may run on.
func ThreadAffinity() ([]int, error) {
	return threadAffinity(0)
}

func threadAffinity(tid int) ([]int, error) {
	set := unix.NewCPUSet(MaxCPU)
	if err := unix.SchedGetaffinityDynamic(tid, set); err != nil {
		return nil, fmt.Errorf("numa: sched_getaffinity: %w", err)
	}
	var cpus []int
	for c := range MaxCPU {
		if set.IsSet(c) {
			cpus = append(cpus, c)
		}
	}
	return cpus, nil
}

// LockThread wires the calling goroutine to its OS thread (runtime.LockOSThread) and
// restricts that thread to cpus: what a pipeline worker calls first. unlock restores
// the thread's former CPUs and unwires it; it must be called from the same goroutine.
// On error the goroutine is left as it was.
func LockThread(cpus []int) (unlock func(), err error) {
	runtime.LockOSThread()
	old, err := ThreadAffinity()
	if err == nil {
		err = SetThreadAffinity(cpus)
	}
	if err != nil {
		runtime.UnlockOSThread()
		return nil, err
	}
	return func() {
		// If the old mask cannot be restored, the thread must not go back to the
		// pool of threads other goroutines run on: exit it with the goroutine.
		if SetThreadAffinity(old) == nil {
			runtime.UnlockOSThread()
		}
	}, nil
}

// SetProcessAffinity restricts every thread of this process to cpus. Threads the Go
// runtime starts later inherit the mask from the thread that starts them, so after
// this every goroutine runs on cpus: the simplest way to keep a whole pipeline on
// one node. The caller may also lower GOMAXPROCS to len(cpus).
func SetProcessAffinity(cpus []int) error {
	set, err := cpuSet(cpus)
	if err != nil {
		return err
	}
	done := map[int]bool{}
	// A thread started while the list is read inherits either mask; a second pass
	// catches the threads the first one missed.
	for pass := 0; pass < 3; pass++ {
		ents, err := os.ReadDir("/proc/self/task")
		if err != nil {
			return fmt.Errorf("numa: list threads: %w", err)
		}
		fresh := 0
		for _, e := range ents {
			tid, err := strconv.Atoi(e.Name())
			if err != nil || done[tid] {
				continue
			}
			fresh++
			err = unix.SchedSetaffinityDynamic(tid, set)
			if errors.Is(err, unix.ESRCH) { // the thread exited meanwhile
				continue
			}
			if err != nil {
				return fmt.Errorf("numa: sched_setaffinity of thread %d to CPUs %s: %w", tid, FormatCPUList(cpus), denied(err))
			}
			done[tid] = true
		}
		if fresh == 0 {
			break
		}
	}
	return nil
}

// Bind asks the kernel to place mem's pages on node (mbind with MPOL_PREFERRED and
// MPOL_MF_MOVE): pages faulted in later come from that node while it has free
// memory, pages already there are moved. mem must start on a page boundary (slabs
// and mmap'd memory do). A kernel or container that forbids it gives an error
// wrapping ErrNotPermitted; the memory stays usable either way.
func Bind(mem []byte, node int) error {
	if len(mem) == 0 {
		return nil
	}
	if node < 0 || node >= 1024 {
		return fmt.Errorf("numa: bind to node %d: no such node", node)
	}
	addr := uintptr(unsafe.Pointer(unsafe.SliceData(mem)))
	if addr%uintptr(os.Getpagesize()) != 0 {
		return fmt.Errorf("numa: bind to node %d: memory at %#x is not page aligned", node, addr)
	}
	mask := make([]uint64, node/64+1)
	mask[node/64] |= 1 << (node % 64)
	// maxnode counts one more bit than the mask holds: the kernel drops the last.
	_, _, e := unix.Syscall6(unix.SYS_MBIND, addr, uintptr(len(mem)), mpolPreferred,
		uintptr(unsafe.Pointer(&mask[0])), uintptr(len(mask)*64+1), mpolMFMove)
	runtime.KeepAlive(mask)
	if e != 0 {
		hint := ""
		if e == unix.EPERM {
			hint = " (in a container: needs CAP_SYS_NICE or a seccomp profile allowing mbind)"
		}
		return fmt.Errorf("numa: mbind %d bytes at %#x to node %d: %w%s", len(mem), addr, node, denied(e), hint)
	}
	return nil
}
