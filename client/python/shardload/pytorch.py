"""PyTorch helpers: an IterableDataset over a shardload server, and a prefetcher that
copies each batch to the GPU on a side stream while the previous batch computes.
"""

from __future__ import annotations

import math
import os
import sys
from typing import Any, Dict, Iterator, Mapping, Optional, Set, Tuple, Union

import torch

from .batch import Batch, Columns
from .client import Client
from .errors import ShardloadError
from .messages import State
from .state import check_state

# torch's CUDA streams, events and runtime, and get_worker_info, are untyped in some
# torch versions and typed differently in others: they are called through these.
_cuda: Any = torch.cuda
_data: Any = torch.utils.data

# A batch being copied to the GPU: the host batch, its device copy, the copy's CUDA event.
_Issued = Tuple[Batch, Dict[str, Any], Any]

WORKERS_MESSAGE = (
    "ShardloadDataset in a DataLoader with num_workers={n}: each worker process would connect "
    "as the same rank and read the whole epoch, so every sample would come {n} times. The "
    "shardload server already does the workers' job (fetching, decoding and collating in its "
    "own process): use DataLoader(ds, batch_size=None, num_workers=0)")

BATCHED_MESSAGE = (
    "ShardloadDataset in a DataLoader that batches again: its items are whole batches, "
    "collated by the shardload server, and a DataLoader with a batch_size (its default is "
    "batch_size=1) would stack them into batches of batches (a leading dimension of 1 with "
    "the default). Use DataLoader(ds, batch_size=None) and give the batch size to "
    "ShardloadDataset(batch_size=...)")


def _refuse_batching(batch: Any, **_: Any) -> Any:
    """torch's default_collate of a list of ShardloadDataset batches: an error."""
    raise ShardloadError(BATCHED_MESSAGE)


# default_collate refuses lists of batches (the check in ShardloadDataset.__iter__
# finds a batching DataLoader first, where torch's fetcher can be seen; this catches
# the rest). torch 1.13 and later dispatch default_collate on this table.
_collate_map = getattr(getattr(getattr(_data, "_utils", None), "collate", None), "default_collate_fn_map", None)
if isinstance(_collate_map, dict):
    _collate_map[Columns] = _refuse_batching


def _batching_loader() -> bool:
    """Whether the caller of ShardloadDataset.__iter__ is a torch DataLoader's fetcher
    that batches what the dataset yields (batch_size not None: auto-collation). The
    fetcher calls iter(dataset) in its constructor, after setting auto_collation."""
    fetch = getattr(getattr(_data, "_utils", None), "fetch", None)
    base = getattr(fetch, "_BaseDatasetFetcher", None)
    if not isinstance(base, type):
        return False
    try:
        f: Any = sys._getframe(2)  # __iter__'s caller
    except ValueError:
        return False
    for _ in range(3):
        if f is None:
            break
        obj = f.f_locals.get("self")
        if isinstance(obj, base):
            return bool(getattr(obj, "auto_collation", False))
        f = f.f_back
    return False


class ShardloadDataset(torch.utils.data.IterableDataset[Dict[str, Any]]):
    """Yields batches (dicts of tensors plus "__key__") from a shardload server.

    ``ShardloadDataset(socket_path, **kwargs)`` takes Client's arguments (the socket
    path, positional or as ``socket_path=``, and the keyword arguments; the output is
    always "torch"), plus ``epoch``, ``copy`` and ``state``.

    Use it with ``DataLoader(ds, batch_size=None, num_workers=0)``: the server does the
    work that DataLoader workers would, and its items are whole batches. A DataLoader
    that batches again (any ``batch_size`` but None; DataLoader's default is 1) raises
    ShardloadError at the first iteration, naming ``batch_size=None``, instead of
    yielding batches of batches. With ``num_workers`` above 1, iterating raises
    ShardloadError: "ShardloadDataset in a DataLoader with num_workers=N: each worker
    process would connect as the same rank and read the whole epoch, so every sample
    would come N times. The shardload server already does the workers' job (...): use
    DataLoader(ds, batch_size=None, num_workers=0)". ``num_workers=1`` works (one
    process reads each epoch once, on a connection of its own; call ``set_epoch``
    before each epoch, as the worker's copy of the dataset does not count them).

    Each ``iter()`` reads one epoch, starting at ``epoch`` and counting up, on one
    connection kept between epochs; ``set_epoch`` chooses the next. Leaving a loop
    early is fine: the next ``iter()`` abandons the rest of that epoch. The epoch
    starts when the first batch is asked for, not at ``iter()`` itself. Tensors are
    read-only views into shared slabs (no in-place ops on them) that stay valid while
    referenced (see shardload.Batch); ``copy=True`` yields owned clones instead.

    ``len(ds)``, and so ``len(DataLoader(ds, batch_size=None))``, is the batches this
    rank yields in an epoch, exactly: with an index (or count_first) every sample
    once; with counts estimated from the shards' sizes the server pads or trims the
    epoch to its planned batches (``client.last_epoch`` and a ShardloadWarning say
    how many samples were repeated or left out). It connects to the server if the
    dataset has not yet.

    Items are dicts of the columns plus "__key__" (a dict subclass whose KeyError
    for a name that is not a column lists the columns).

    Checkpoint and resume (with ``num_workers=0``): ``state_dict()`` is the position
    after the last batch yielded, a dict of ints and strings (between epochs: the
    start of the next one), to save with the model, e.g.
    ``torch.save({"model": ..., "data": ds.state_dict()}, path)``;
    ``load_state_dict(d)`` (or ``state=d``) makes the next ``iter()`` resume at d's
    epoch, after its batches, and the epochs after it follow. ``set_epoch`` with
    another epoch than a loaded state's drops that state. torchdata's
    ``StatefulDataLoader`` calls both methods itself.
    """

    def __init__(self, socket_path: Optional[str] = None, *, epoch: int = 0, copy: bool = False,
                 state: Optional[Mapping[str, Any]] = None, **client_kwargs: Any) -> None:
        super().__init__()
        self._kwargs = dict(client_kwargs, output="torch")
        if socket_path is not None:
            self._kwargs["socket_path"] = socket_path
        self._next_epoch = epoch
        self._copy = copy
        self._client: Optional[Client] = None
        self._pending: Optional[State] = None    # a loaded state, for the next iter()
        self._in_epoch = False  # an epoch started and did not end: the client has the position
        self._gen = 0           # numbers the epochs started: an older generator's end changes nothing
        # (epoch, state) the client was made for, whose first epoch (its hello's) has
        # not been read yet: len() connects ahead of the first iter().
        self._fresh: Optional[Tuple[int, Optional[State]]] = None
        if state is not None:
            self.load_state_dict(state)

    def set_epoch(self, epoch: int) -> None:
        """Read epoch next (from its start, or from a loaded state of that epoch)."""
        self._next_epoch = epoch
        self._in_epoch = False
        if self._pending is not None and self._pending["epoch"] != epoch:
            self._pending = None

    def state_dict(self) -> State:
        """The position after the last batch yielded (a dict of ints and strings):
        where a dataset given it by load_state_dict resumes. Between epochs, and
        before the first, the start of the epoch the next ``iter()`` reads."""
        if self._pending is not None:
            return self._pending.copy()
        c = self._client
        if self._in_epoch and c is not None and not c.closed:
            return c.state_dict()
        known = None
        if c is not None and not c.closed and c._state is not None:
            known = c._state  # the dataset's order and size, the same in every epoch
        return {"epoch": self._next_epoch, "order": known["order"] if known else "",
                "samples": known["samples"] if known else 0, "runs": "", "batches": 0}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Make the next ``iter()`` resume at state (a dict state_dict() returned): at
        its epoch, after its batches; later ``iter()`` calls read the epochs after it."""
        self._pending = check_state(state)
        self._next_epoch = self._pending["epoch"]
        self._in_epoch = False

    def __iter__(self) -> Iterator[Dict[str, Any]]:
        if _batching_loader():
            raise ShardloadError(BATCHED_MESSAGE)
        info = _data.get_worker_info()
        if info is not None and info.num_workers > 1:
            raise ShardloadError(WORKERS_MESSAGE.format(n=info.num_workers))
        if self._kwargs.get("epoch_samples") == math.inf:
            return self._endless()
        return self._epoch()

    def _endless(self) -> Iterator[Dict[str, Any]]:
        """Epoch after epoch, without an end (epoch_samples=math.inf)."""
        while True:
            yield from self._epoch()

    def __len__(self) -> int:
        if self._kwargs.get("epoch_samples") == math.inf:
            raise TypeError("an endless ShardloadDataset (epoch_samples=math.inf) has no length")
        return self._connect().epoch_batches

    def _connect(self) -> Client:
        """The dataset's client, connected for the next epoch when there is none."""
        if self._client is not None and self._client._pid != os.getpid():
            self._client = None  # inherited by a forked worker: its parent's connection
        if self._client is None:
            state = self._pending
            e = state["epoch"] if state is not None else self._next_epoch
            self._client = Client(epoch=e, state=state, **self._kwargs)
            self._fresh = (e, state)
        return self._client

    def _epoch(self) -> Iterator[Dict[str, Any]]:
        # A generator: nothing happens until the first batch is asked for, so that an
        # iterator made and dropped (as StatefulDataLoader does) changes nothing.
        state = self._pending
        e = state["epoch"] if state is not None else self._next_epoch
        client = self._connect()
        fresh, self._fresh = self._fresh, None
        if fresh is not None and fresh[0] == e and fresh[1] is state:
            it = client.batches()  # the epoch the client's hello asked for
        else:
            if state is not None:
                client.load_state_dict(state)
            it = client.epoch(e)
        # Started: a failure before this point leaves the position to the next try.
        self._pending = None
        self._next_epoch = e + 1
        self._gen += 1
        gen = self._gen
        self._in_epoch = True
        for b in it:
            yield b.to_torch(copy=self._copy)
        if gen == self._gen and self._client is not None and not self._client._epoch_open:
            self._in_epoch = False  # the epoch ended: the position is the next one's start

    def __getstate__(self) -> Dict[str, Any]:
        state = dict(self.__dict__)
        state["_client"] = None  # a connection does not travel to another process
        state["_fresh"] = None
        return state

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None


class CudaPrefetcher:
    """Copies batches from the host slabs to a GPU, batch N+1 on a side stream while the
    trainer computes on batch N (the copy needs no extra thread or queue).

    ``client`` is a Client made with output="torch"; the copies go to ``device`` (default:
    the client's local rank's GPU). The slabs are registered with CUDA as pinned memory
    once (they are already page-locked by the server; this makes the copies asynchronous
    DMA), and again when one is mapped afresh. Fixed-shape columns arrive on the device; ragged
    columns (bytes such as jpg) and keys are copied out on the host. Without CUDA it
    yields the host batches' tensors, releasing each when the next is asked for.

    ``state_dict()`` is the position after the last batch handed over (the client's
    own is one batch ahead, the one being copied); ``client.load_state_dict`` then
    ``epoch()`` resumes.
    """

    def __init__(self, client: Client, device: Union[int, str, torch.device, None] = None) -> None:
        if client.output != "torch":
            raise ValueError("CudaPrefetcher needs a Client with output='torch'")
        self.client = client
        self.cuda = torch.cuda.is_available()
        if self.cuda:
            self.device = torch.device(device if device is not None else f"cuda:{client.local_rank % torch.cuda.device_count()}")
            self.stream = _cuda.Stream(device=self.device)
            self._register()
        else:
            self.device = torch.device("cpu")
        self.registered = getattr(self, "registered", False)
        self._state: Optional[State] = None  # after the last batch handed over in the current epoch

    def state_dict(self) -> State:
        """The position after the last batch handed over (see Client.state_dict);
        before the first batch of an epoch and after its end, the client's."""
        if self._state is not None:
            return self._state.copy()
        return self.client.state_dict()

    def _register(self) -> None:
        _cuda.cudart()  # the CUDA runtime's bindings: raises here when torch has none
        self.registered = True
        self._pinned: Set[int] = set()
        for addr, size in self.client.slab_addresses():
            self.slab_mapped(None, addr, size)
        # A slab whose batch the trainer kept is copied out and mapped afresh: the
        # registration follows the slab, not the kept copy.
        self.client.add_slab_hook(self)

    def slab_mapped(self, i: Optional[int], addr: int, size: int) -> None:
        # cudaHostRegisterPortable (1): pinned for every context.
        if int(_cuda.cudart().cudaHostRegister(addr, size, 1)) == 0:
            self._pinned.add(addr)
        else:
            self.registered = False  # copies still work, synchronously staged

    def slab_unmapping(self, i: Optional[int], addr: int, size: int) -> None:
        if addr in self._pinned:
            self._pinned.discard(addr)
            _cuda.cudart().cudaHostUnregister(addr)

    def _issue(self, b: Batch) -> _Issued:
        out = Columns()
        with torch.cuda.stream(self.stream):
            for name, col in b.items():
                if isinstance(col, torch.Tensor):
                    out[name] = col.to(self.device, non_blocking=True)
                else:  # ragged columns, and numpy arrays of types torch lacks
                    out[name] = col.copy()
            ev = _cuda.Event()
            ev.record(self.stream)
        out["__key__"] = list(b.keys)
        return b, out, ev

    def epoch(self, n: Optional[int] = None) -> Iterator[Dict[str, Any]]:
        """Iterate over the current epoch, or epoch n."""
        it = self.client.epoch(n, auto_release=False) if n is not None else self.client.batches(auto_release=False)
        self._state = None
        if not self.cuda:
            prev: Optional[Batch] = None
            for b in it:
                if prev is not None:
                    prev.release()
                prev = b
                self._state = b.state
                yield b.to_dict()
            if prev is not None:
                prev.release()
            self._state = None
            return
        cur: Optional[_Issued] = None
        for b in it:
            nxt = self._issue(b)
            if cur is not None:
                yield self._hand_over(cur)
            cur = nxt
        if cur is not None:
            yield self._hand_over(cur)
        self._state = None

    def _hand_over(self, item: _Issued) -> Dict[str, Any]:
        host, out, ev = item
        _cuda.current_stream(self.device).wait_event(ev)
        for v in out.values():
            if isinstance(v, torch.Tensor) and v.is_cuda:
                # (through Any: torch 1.13's stubs want a torch._C.Stream, which a CUDA stream is not)
                v.record_stream(_cuda.current_stream(self.device))
        # The copy is done once the event is: then the host slab can be reused.
        ev.synchronize()
        host.release()
        self._state = host.state
        return out

    def __iter__(self) -> Iterator[Dict[str, Any]]:
        return self.epoch()
