package pinned

import (
	"errors"
	"fmt"
	"github.com/shardload/shardload/mem"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Seams for tests: the locking decision and the system calls that can fail. Tests
// replace them (never in parallel) to reach the fallback and cleanup paths as root.
var (
	// memlockLimit returns the soft RLIMIT_MEMLOCK in bytes.
	memlockLimit = softMemlockLimit
	// canExceedMemlock reports whether the process may lock more than the limit.
	canExceedMemlock = hasCapIPCLock
	// mlock locks one slab's memory.
	mlock = unix.Mlock
	// mmap maps one slab's memfd.
	mmap = unix.Mmap
	// populate faults a slab's pages in, writable.
	populate = mem.Prefault
)

func softMemlockLimit() (uint64, error) {
	var rl unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_MEMLOCK, &rl); err != nil {
		return 0, err
	}
	return rl.Cur, nil
}

// HasCapIPCLock reports whether the calling thread has CAP_IPC_LOCK in its effective
// set, which lets mlock ignore RLIMIT_MEMLOCK (false where it cannot be known).
func HasCapIPCLock() bool { return hasCapIPCLock() }

func hasCapIPCLock() bool {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return false
	}
	return data[unix.CAP_IPC_LOCK/32].Effective&(1<<(unix.CAP_IPC_LOCK%32)) != 0
}

// newRing creates and maps c.slabs memfds. On error everything made so far is undone.
func newRing(c config) (_ *Ring, err error) {
	r := &Ring{slabBytes: c.slabBytes, huge: !c.noHuge, bound: c.bind != nil}
	defer func() {
		if err != nil {
			unmapSlabs(r.slabs)
		}
	}()
	r.c = c
	populated := make([]bool, c.slabs)
	for i := range c.slabs {
		s := &Slab{ring: r, index: i, fd: -1}
		name := c.name + "-" + strconv.Itoa(i)
		s.fd, err = unix.MemfdCreate(name, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
		if err != nil {
			return nil, fmt.Errorf("pinned: memfd_create %q: %w", name, err)
		}
		r.slabs = append(r.slabs, s)
		// Sealing against shrinking keeps a process the memfd is shared with from
		// truncating it, which would make this process's mapping fault; it may grow
		// (Ring.Grow), which changes nothing for a mapping of the old size. Memfds
		// have supported seals since Linux 3.17; a kernel that refuses only loses
		// that protection.
		_, _ = unix.FcntlInt(uintptr(s.fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK)
		if populated[i], err = r.mapSlab(s, c.slabBytes); err != nil {
			return nil, err
		}
	}
	if !c.noLock {
		r.locked = lockSlabs(r.slabs, c)
	}
	for i, s := range r.slabs {
		if !populated[i] && !s.locked {
			touchPages(s.data)
		}
	}
	return r, nil
}

// mapSlab sizes s's memfd to size and maps it, bound, advised and faulted in as the
// ring's options say; it reports whether the pages were faulted in.
func (r *Ring) mapSlab(s *Slab, size int64) (populated bool, err error) {
	c := r.c
	if err = unix.Ftruncate(s.fd, size); err != nil {
		return false, fmt.Errorf("pinned: size slab %d to %d bytes: %w", s.index, size, err)
	}
	s.data, err = mmap(s.fd, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		s.data = nil
		return false, fmt.Errorf("pinned: mmap slab %d (%d bytes): %w", s.index, size, err)
	}
	s.size.Store(size)
	if r.bound {
		if berr := c.bind(s.data); berr != nil {
			r.bound = false
			c.warn(fmt.Sprintf("pinned: slab %d of %d not bound: %v; slabs left where the kernel puts them", s.index, c.slabs, berr))
		}
	}
	if !c.noHuge && unix.Madvise(s.data, unix.MADV_HUGEPAGE) != nil {
		// EINVAL: no transparent huge pages in this kernel. Not an error.
		r.huge = false
	}
	// Fault every page in now, writable, so the first batch does not. Linux
	// 5.14+; older kernels say EINVAL and get mlock or touchPages instead.
	return populate(s.data) == nil, nil
}

// grow remaps s, acquired and not in use, at size bytes: its memfd grows (its
// contents are not kept), and the new mapping is bound, faulted in and locked as the
// ring's were.
func (r *Ring) grow(s *Slab, size int64) error {
	old := s.data
	if s.locked {
		_ = unix.Munlock(old)
	}
	if err := unix.Munmap(old); err != nil {
		return fmt.Errorf("pinned: munmap slab %d: %w", s.index, err)
	}
	s.data = nil
	populated, err := r.mapSlab(s, size)
	if err != nil {
		return err
	}
	if s.locked {
		if err := mlock(s.data); err != nil {
			s.locked, r.locked = false, false
			r.c.warn(fmt.Sprintf("pinned: slab %d, grown to %s, cannot be locked (mlock: %v): it works unpinned; raise RLIMIT_MEMLOCK", s.index, formatBytes(uint64(size)), err))
		}
	}
	if !populated && !s.locked {
		touchPages(s.data)
	}
	return nil
}

// lockSlabs mlocks every slab, or none: it reports false, after one call to c.warn,
// when RLIMIT_MEMLOCK forbids it or mlock fails.
func lockSlabs(slabs []*Slab, c config) bool {
	total := uint64(c.slabBytes) * uint64(len(slabs))
	limit, limitErr := memlockLimit()
	if limitErr == nil && limit != unix.RLIM_INFINITY && total > limit && !canExceedMemlock() {
		c.warn(memlockWarning(len(slabs), c.slabBytes, total, limit,
			"the process lacks CAP_IPC_LOCK to exceed it", nil))
		return false
	}
	for i, s := range slabs {
		if err := mlock(s.data); err != nil {
			for _, t := range slabs[:i] {
				_ = unix.Munlock(t.data)
				t.locked = false
			}
			// Memory this process locked before (other rings, say) counts against
			// the same limit, so it is part of what the limit must allow.
			need := total
			why := "memory this process has locked already counts against it"
			if kib, err := lockedKiB(); err == nil && kib > 0 {
				need += kib << 10
				why = "this process has " + formatBytes(kib<<10) + " locked already"
			}
			if limitErr != nil {
				why = "it could not be read: " + limitErr.Error()
				limit = unix.RLIM_INFINITY
			}
			c.warn(memlockWarning(len(slabs), c.slabBytes, need, limit, why, err))
			return false
		}
		s.locked = true
	}
	return true
}

// lockedKiB returns VmLck from /proc/self/status: the memory this process has locked.
func lockedKiB() (uint64, error) {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0, err
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, "VmLck:"); ok {
			return strconv.ParseUint(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
		}
	}
	return 0, errors.New("pinned: no VmLck in /proc/self/status")
}

// memlockWarning is the one line given when n slabs stay unlocked: need is what
// RLIMIT_MEMLOCK would have to allow, why says why limit was not enough, and err is
// mlock's error, nil when locking was not tried.
func memlockWarning(n int, slabBytes int64, need, limit uint64, why string, err error) string {
	total := uint64(slabBytes) * uint64(n)
	lim := "unlimited"
	if limit != unix.RLIM_INFINITY {
		lim = formatBytesExact(limit)
	}
	cause := ""
	switch {
	case err == nil:
	case errors.Is(err, unix.EPERM), errors.Is(err, unix.ENOMEM), errors.Is(err, unix.EAGAIN):
		cause = "mlock: " + err.Error() + "; "
	default:
		cause = "mlock failed unexpectedly: " + err.Error() + "; "
	}
	kib := (need + 1023) / 1024
	slabs := "slabs"
	if n == 1 {
		slabs = "slab"
	}
	return fmt.Sprintf("pinned: cannot lock %s in memory (%d %s of %s): %s"+
		"RLIMIT_MEMLOCK is %s and %s; raise it to at least %d KiB "+
		"(ulimit -l %d or unlimited; systemd LimitMEMLOCK=infinity; docker run --ulimit memlock=-1) "+
		"or grant CAP_IPC_LOCK; slabs work unpinned (slower device copies)",
		formatBytesExact(total), n, slabs, formatBytes(uint64(slabBytes)), cause, lim, why, kib, kib)
}

// touchPages writes one byte per page so each is faulted in (the memory is new, so
// writing zero changes nothing).
func touchPages(b []byte) {
	step := os.Getpagesize()
	for off := 0; off < len(b); off += step {
		b[off] = 0
	}
}

// unmapSlabs unlocks, unmaps and closes what the slabs hold, returning every error.
func unmapSlabs(slabs []*Slab) error {
	var errs []error
	for _, s := range slabs {
		if s.data != nil {
			if s.locked {
				if err := unix.Munlock(s.data); err != nil {
					errs = append(errs, fmt.Errorf("pinned: munlock slab %d: %w", s.index, err))
				}
			}
			if err := unix.Munmap(s.data); err != nil {
				errs = append(errs, fmt.Errorf("pinned: munmap slab %d: %w", s.index, err))
			}
		}
		if s.fd >= 0 {
			if err := unix.Close(s.fd); err != nil {
				errs = append(errs, fmt.Errorf("pinned: close slab %d: %w", s.index, err))
			}
		}
	}
	return errors.Join(errs...)
}
