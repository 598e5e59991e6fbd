"""Slab mappings (Linux): map a memfd at the address of a Python mmap object, and
"detach" such a mapping, replacing it in one step with a private copy of its bytes at
the same address.

A slab's mapping is an anonymous Python ``mmap`` object, part of whose pages are
replaced by the slab's memfd (``MAP_FIXED``). The object keeps no descriptor of the memfd (an mmap made
from a descriptor keeps a duplicate of it open until it dies), so a detached mapping
holds nothing of the server's memory. Every view of a batch (numpy arrays, tensors,
memoryviews) references its slab's ``mmap`` object; when the object dies, it unmaps
whatever lies at its address by then: the memfd's pages, or the private copy.
"""

from __future__ import annotations

import ctypes
import mmap
from typing import Optional, Tuple

_MAP_FIXED = 0x10  # Linux, every architecture the server builds for
_MREMAP_MAYMOVE = 1
_MREMAP_FIXED = 2
_MADV_POPULATE_READ = 22  # Linux 5.14; older kernels refuse these, and the copy faults the pages in
_MADV_POPULATE_WRITE = 23
_MAP_FAILED = ctypes.c_void_p(-1).value
_RW = mmap.PROT_READ | mmap.PROT_WRITE

_libc: Optional[ctypes.CDLL] = None


def _c() -> ctypes.CDLL:
    global _libc
    if _libc is None:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
        libc.mremap.restype = ctypes.c_void_p
        libc.mremap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
        libc.munmap.restype = ctypes.c_int
        libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        libc.madvise.restype = ctypes.c_int
        libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        _libc = libc
    return _libc


def _oserror(what: str) -> OSError:
    import os
    e = ctypes.get_errno()
    return OSError(e, f"{what}: {os.strerror(e)}")


def address(mm: mmap.mmap) -> int:
    """The address of an mmap object's memory."""
    buf = ctypes.c_char.from_buffer(mm)
    try:
        return ctypes.addressof(buf)
    finally:
        del buf


_HUGE = 2 << 20


def map_fd(fd: int, size: int) -> Tuple[mmap.mmap, int, int]:
    """A new mmap object whose memory holds the file fd (MAP_SHARED, read and write)
    at offset pad, and that address. For slabs of 2 MiB and more, the address is a
    multiple of 2 MiB, so that huge pages of the file can be mapped as such."""
    align = _HUGE if size >= _HUGE else mmap.PAGESIZE
    mm = mmap.mmap(-1, size + align - mmap.PAGESIZE, flags=mmap.MAP_PRIVATE, prot=_RW)
    base = address(mm)
    addr = (base + align - 1) // align * align
    r = _c().mmap(addr, size, _RW, mmap.MAP_SHARED | _MAP_FIXED, fd, 0)
    if r == _MAP_FAILED or r != addr:
        err = _oserror("mapping a slab")
        mm.close()
        raise err
    return mm, addr, addr - base


def detach(addr: int, size: int, used: int) -> None:
    """Replace the mapping of [addr, addr+size) with private anonymous memory holding a
    copy of its first used bytes (the rest reads as zeros). Views of that memory keep
    their addresses and their contents; the old mapping's pages are no longer mapped
    here."""
    c = _c()
    new = c.mmap(None, size, _RW, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
    if new == _MAP_FAILED:
        raise _oserror("allocating a private copy of a slab")
    used = max(0, min(used, size))
    if used:
        # Populating the pages in one call each costs about half of faulting them in
        # one by one during the copy.
        n = (used + mmap.PAGESIZE - 1) // mmap.PAGESIZE * mmap.PAGESIZE
        c.madvise(addr, n, _MADV_POPULATE_READ)
        c.madvise(new, n, _MADV_POPULATE_WRITE)
        ctypes.memmove(new, addr, used)
    r = c.mremap(new, size, size, _MREMAP_MAYMOVE | _MREMAP_FIXED, addr)
    if r == _MAP_FAILED or r != addr:
        err = _oserror("moving a private copy over a slab")
        c.munmap(new, size)
        raise err
