"""The session's slabs in this process: their mappings (shardload._mem) and who owns
their bytes, which decides when a slab goes back to the server.

Ownership
---------
Each batch gets a memoryview of its own over its slab (``Slabs.lend``), and every
view of the batch (numpy arrays, torch tensors, memoryviews, Ragged rows, and the
views derived from those) is made from an export of that memoryview and holds it
while it lives (shardload.batch). When the batch is released, the client calls the
memoryview's ``release()``:

- it succeeds only when no export of it is alive: nothing of the batch is referenced
  any more, and the slab goes back to the server as it is (no copy);
- it raises BufferError ("memoryview has N exported buffers") while a view is alive:
  the release is deferred, and tried again once the next batch has been taken (a
  normal loop has dropped last step's views by then);
- when a view is still alive then, the batch is "detached": its bytes are copied into
  private memory at the same address (one atomic mremap: the views keep their
  addresses and contents), the memoryview stays with those views (it keeps the old
  mapping, now private, alive until the last of them dies), and the slab is mapped
  afresh for the next batch.

Nothing here counts interpreter references: a view is alive exactly as long as the
buffer protocol says it is.
"""

from __future__ import annotations

import mmap
import os
import time
import warnings
from types import ModuleType
from typing import Callable, List, Optional, Protocol, Tuple, TypedDict

from . import _mem
from .batch import Batch, batch_views
from .errors import ProtocolError, ShardloadWarning
from .messages import BatchMessage
from .state import state_of


class Stats(TypedDict):
    """Client.stats: releases, deferred releases and detaches (copies of batches whose
    views outlived a step), with the bytes and seconds the detaches took; the seconds
    this client waited for a batch that was not ready (``wait_seconds``: the loader
    was behind, the figure that matters) and those the server's loader waited for a
    slab this client still held (``backpressure_seconds``: the loader was ahead)."""

    released: int
    deferred: int
    detached: int
    detached_bytes: int
    detach_seconds: float
    wait_seconds: float
    backpressure_seconds: float


def new_stats() -> Stats:
    return {"released": 0, "deferred": 0, "detached": 0, "detached_bytes": 0, "detach_seconds": 0.0,
            "wait_seconds": 0.0, "backpressure_seconds": 0.0}


class SlabHook(Protocol):
    """What Client.add_slab_hook takes: an object told when a slab's mapping changes."""

    def slab_mapped(self, i: Optional[int], addr: int, size: int) -> None:
        """Slab i (None: one already mapped, when the hook registers them itself) is
        mapped at addr."""

    def slab_unmapping(self, i: Optional[int], addr: int, size: int) -> None:
        """The memory at addr is about to stop being slab i's."""


def _free(buf: memoryview) -> bool:
    """Release buf, a batch's memoryview: True when no view of the batch was alive."""
    try:
        buf.release()
    except BufferError:  # "memoryview has N exported buffers": views of the batch live
        return False
    return True


class Slabs:
    """The slabs of a session, mapped from the memfds the ready passed (``fds``, which
    close() closes; map() maps them), and the batches released whose slab has not gone
    back yet (``pending``). ``send_release(b)`` tells the server that batch b's slab is
    free; stats counts the deferred releases and the detaches."""

    def __init__(self, send_release: Callable[[Batch], None], stats: Stats) -> None:
        self.fds: List[int] = []
        self.maps: List[mmap.mmap] = []      # per slab: the mmap object the batch in it is read from
        self.addrs: List[int] = []           # per slab: its address
        self.pads: List[int] = []            # per slab: the slab's offset in its mmap object
        self.sizes: List[int] = []           # per slab: its size as mapped (slabs grow)
        self.used: List[Optional[int]] = []  # per slab: bytes the latest batch in it occupies
        # Per slab: the memoryview lent to the batch in it, until it is released
        # (no view was alive) or left to the views over a detached copy.
        self.lent: List[Optional[memoryview]] = []
        self.pending: List[Batch] = []       # released batches whose views were alive
        self.takes = 0   # batches taken: the clock of deferred releases
        self.grew = False  # a slab grew (warned once)
        self.first_size = 0  # the slabs' size as the ready said
        self.hooks: List[SlabHook] = []
        self._send_release = send_release
        self.stats = stats

    def map(self, size: int) -> None:
        """Map each of fds at size bytes."""
        self.first_size = size
        for fd in self.fds:
            mm, addr, pad = _mem.map_fd(fd, size)
            self.maps.append(mm)
            self.addrs.append(addr)
            self.pads.append(pad)
            self.sizes.append(size)
            self.used.append(None)
            self.lent.append(None)
            del mm

    def __len__(self) -> int:
        return len(self.maps)

    def lend(self, i: int, used: Optional[int]) -> memoryview:
        """A read-only memoryview of slab i for a batch that now lies in it (used bytes
        of it), its own: the batch's views are made from it (batch.batch_views)."""
        old = self.lent[i]
        if old is not None and not _free(old):
            # Never expected (the server refills only slabs given back); keeps the
            # views of the batch there valid if it happens.
            self.detach(i)
        pad = self.pads[i]
        buf = memoryview(self.maps[i])[pad:pad + self.sizes[i]].toreadonly()
        self.lent[i] = buf
        self.used[i] = used
        return buf

    def take(self, msg: BatchMessage, np: Optional[ModuleType], torch: Optional[ModuleType],
             release: Callable[[Batch], None]) -> Batch:
        """The Batch of a batch message: the views of its columns (batch.batch_views)
        over the slab it names, lent to it (grown first when the server grew the slab);
        release is what the batch's release() calls. Raises ProtocolError, KeyError,
        TypeError or ValueError for a message it cannot read."""
        i = msg["slab"]
        if not 0 <= i < len(self):
            raise ProtocolError(f"batch in slab {i} of {len(self)}")
        size = int(msg.get("slab_bytes", 0) or self.sizes[i])
        if size > self.sizes[i]:
            self.grow(i, size)  # warns the first time (stacklevel: the trainer's loop)
        if "backpressure" in msg:
            self.stats["backpressure_seconds"] = float(msg["backpressure"])
        buf = self.lend(i, msg.get("used"))
        cols, keys = batch_views(buf, msg["columns"], msg["rows"], np, torch)
        return Batch(release, msg, cols, keys, state_of(msg, "batch"), buf)

    def _owns(self, b: Batch) -> bool:
        """Whether the views of b, a batch released, are gone (b's memoryview could be
        released), or live on over a detached copy: either way its slab may go back."""
        buf = b._buf
        if buf is None:
            return True
        if self.lent[b._slab] is not buf:  # copied out already (close, or a refilled slab)
            b._buf = None
            return True
        if not _free(buf):
            return False
        b._buf = None
        self.lent[b._slab] = None
        return True

    def hand_back(self, b: Batch) -> None:
        """b was released: give its slab back now if no view of b is alive, else once
        they are gone or copied (see settle)."""
        if self._owns(b):
            self._send_release(b)
        else:
            b._mark = self.takes
            self.pending.append(b)
            self.stats["deferred"] += 1

    def settle(self, force: bool = False, which: Optional[Callable[[Batch], bool]] = None) -> None:
        """Hand back the deferred batches: those deferred before the latest batch was
        taken (all of them with force; only those which(batch) accepts, if given): free
        ones as they are, the others after a detach."""
        for b in list(self.pending):
            if which is not None and not which(b):
                continue
            if not force and b._mark >= self.takes:
                continue
            self.pending.remove(b)
            if not self._owns(b):
                self.detach(b._slab)
                b._buf = None
            self._send_release(b)

    def detach(self, i: int, fresh: bool = True) -> None:
        """Copy the batch in slab i into private memory at the slab's address (its views
        keep working), and map the slab afresh for the next batch (unless not fresh:
        the client is closing)."""
        t0 = time.perf_counter()
        addr, size = self.addrs[i], self.sizes[i]
        used = self.used[i]
        used = size if used is None else used
        for h in self.hooks:
            h.slab_unmapping(i, addr, size)
        _mem.detach(addr, size, used)
        # The batch's memoryview, and with it the old mmap object that now holds the
        # private copy, belong to the views from here on: the last of them unmaps it.
        self.lent[i] = None
        if fresh:
            self.maps[i], self.addrs[i], self.pads[i] = _mem.map_fd(self.fds[i], size)
            for h in self.hooks:
                h.slab_mapped(i, self.addrs[i], size)
        self.stats["detached"] += 1
        self.stats["detached_bytes"] += used
        self.stats["detach_seconds"] += time.perf_counter() - t0

    def grow(self, i: int, size: int) -> None:
        """Map slab i again at size bytes: the server grew it for a larger batch. The
        slab holds no batch of this client (it went back: its views were gone, or it
        was copied out and mapped afresh). Warns the first time (ShardloadWarning)."""
        old_buf = self.lent[i]
        if old_buf is not None and not _free(old_buf):
            self.detach(i)  # never expected; keeps the views valid if it happens
        self.lent[i] = None
        for h in self.hooks:
            h.slab_unmapping(i, self.addrs[i], self.sizes[i])
        old = self.maps[i]
        self.maps[i], self.addrs[i], self.pads[i] = _mem.map_fd(self.fds[i], size)
        self.sizes[i] = size
        try:
            old.close()
        except BufferError:
            pass
        for h in self.hooks:
            h.slab_mapped(i, self.addrs[i], size)
        if not self.grew:
            self.grew = True
            # stacklevel: grow, take, Client._batch, the epoch's generator, the trainer
            warnings.warn(ShardloadWarning(
                f"shardload: a batch did not fit the slabs of {self.first_size} bytes: the server grew them "
                f"(to {size} bytes so far); pass slab_bytes= to size them up front"), stacklevel=5)

    def addresses(self) -> List[Tuple[int, int]]:
        """(address, size) of each mapped slab."""
        return [(a, n) for a, n in zip(self.addrs, self.sizes)]

    def close(self, held: List[Batch]) -> None:
        """Unmap the slabs, after the batches held and pending drop their columns. The
        views of a batch still alive stay valid: its slab is copied out first. Closes
        the memfds."""
        batches = held + self.pending
        for b in batches:
            b._drop()
        self.pending = []
        for i in range(len(self.maps)):
            buf = self.lent[i]
            if buf is not None and not _free(buf):
                try:
                    self.detach(i, fresh=False)
                except OSError:
                    pass  # the mapping stays as it is, valid while referenced
            else:
                self.lent[i] = None
                for h in self.hooks:
                    h.slab_unmapping(i, self.addrs[i], self.sizes[i])
                try:
                    self.maps[i].close()
                except BufferError:
                    pass
        for b in batches:
            b._buf = None
        self.forget()

    def forget(self) -> None:
        """Close this process's memfds and drop the mappings without touching them (a
        forked child's copies of its parent's)."""
        for fd in self.fds:
            os.close(fd)
        self.fds, self.maps, self.addrs, self.pads, self.sizes, self.used, self.lent = [], [], [], [], [], [], []
        self.pending = []
