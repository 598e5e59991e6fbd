"""PyTorch helpers: an IterableDataset over a shardload server, and a prefetcher that
copies each batch to the GPU on a side stream while the previous batch computes.
"""

import os

import torch

from .client import Client, ShardloadError

WORKERS_MESSAGE = (
    "ShardloadDataset in a DataLoader with num_workers={n}: each worker process would connect "
    "as the same rank and read the whole epoch, so every sample would come {n} times. The "
    "shardload server already does the workers' job (fetching, decoding and collating in its "
    "own process): use DataLoader(ds, batch_size=None, num_workers=0)")


class ShardloadDataset(torch.utils.data.IterableDataset):
    """Yields batches (dicts of tensors plus "__key__") from a shardload server.

    Use it with ``DataLoader(ds, batch_size=None, num_workers=0)``: the server does the
    work that DataLoader workers would. With ``num_workers`` above 1, iterating raises
    ShardloadError: "ShardloadDataset in a DataLoader with num_workers=N: each worker
    process would connect as the same rank and read the whole epoch, so every sample
    would come N times. The shardload server already does the workers' job (...): use
    DataLoader(ds, batch_size=None, num_workers=0)". ``num_workers=1`` works (one
    process reads each epoch once, on a connection of its own; call ``set_epoch``
    before each epoch, as the worker's copy of the dataset does not count them).

    Each ``iter()`` reads one epoch, starting at ``epoch`` and counting up, on one
    connection kept between epochs; ``set_epoch`` chooses the next. Leaving a loop
    early is fine: the next ``iter()`` abandons the rest of that epoch. Tensors are
    read-only views into shared slabs (no in-place ops on them) that stay valid while
    referenced (see shardload.Batch); ``copy=True`` yields owned clones instead.
    """

    def __init__(self, *, epoch=0, copy=False, **client_kwargs):
        super().__init__()
        self._kwargs = dict(client_kwargs, output="torch")
        self._next_epoch = epoch
        self._copy = copy
        self._client = None

    def set_epoch(self, epoch):
        self._next_epoch = epoch

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        if info is not None and info.num_workers > 1:
            raise ShardloadError(WORKERS_MESSAGE.format(n=info.num_workers))
        if self._client is not None and self._client._pid != os.getpid():
            self._client = None  # inherited by a forked worker: its parent's connection
        e = self._next_epoch
        self._next_epoch += 1
        if self._client is None:
            self._client = Client(epoch=e, **self._kwargs)
            it = self._client.batches()
        else:
            it = self._client.epoch(e)
        return self._batches(it)

    def _batches(self, it):
        for b in it:
            yield b.to_torch(copy=self._copy)

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_client"] = None  # a connection does not travel to another process
        return state

    def close(self):
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
    """

    def __init__(self, client, device=None):
        if client.output != "torch":
            raise ValueError("CudaPrefetcher needs a Client with output='torch'")
        self.client = client
        self.cuda = torch.cuda.is_available()
        if self.cuda:
            self.device = torch.device(device if device is not None else f"cuda:{client.local_rank % torch.cuda.device_count()}")
            self.stream = torch.cuda.Stream(device=self.device)
            self._register()
        else:
            self.device = torch.device("cpu")
        self.registered = getattr(self, "registered", False)

    def _register(self):
        cudart = torch.cuda.cudart()
        self.registered = True
        self._pinned = set()
        for addr, size in self.client.slab_addresses():
            self.slab_mapped(None, addr, size)
        # A slab whose batch the trainer kept is copied out and mapped afresh: the
        # registration follows the slab, not the kept copy.
        self.client.add_slab_hook(self)

    def slab_mapped(self, i, addr, size):
        # cudaHostRegisterPortable (1): pinned for every context.
        if int(torch.cuda.cudart().cudaHostRegister(addr, size, 1)) == 0:
            self._pinned.add(addr)
        else:
            self.registered = False  # copies still work, synchronously staged

    def slab_unmapping(self, i, addr, size):
        if addr in self._pinned:
            self._pinned.discard(addr)
            torch.cuda.cudart().cudaHostUnregister(addr)

    def _issue(self, b):
        out = {}
        with torch.cuda.stream(self.stream):
            for name, col in b.items():
                if isinstance(col, torch.Tensor):
                    out[name] = col.to(self.device, non_blocking=True)
                else:  # ragged columns, and numpy arrays of types torch lacks
                    out[name] = col.copy()
            ev = torch.cuda.Event()
            ev.record(self.stream)
        out["__key__"] = list(b.keys)
        return b, out, ev

    def epoch(self, n=None):
        """Iterate over the current epoch, or epoch n."""
        it = self.client.epoch(n, auto_release=False) if n is not None else self.client.batches(auto_release=False)
        if not self.cuda:
            prev = None
            for b in it:
                if prev is not None:
                    prev.release()
                prev = b
                yield b.to_dict()
            if prev is not None:
                prev.release()
            return
        cur = None
        for b in it:
            nxt = self._issue(b)
            if cur is not None:
                yield self._hand_over(cur)
            cur = nxt
        if cur is not None:
            yield self._hand_over(cur)

    def _hand_over(self, item):
        host, out, ev = item
        torch.cuda.current_stream(self.device).wait_event(ev)
        for v in out.values():
            if isinstance(v, torch.Tensor) and v.is_cuda:
                v.record_stream(torch.cuda.current_stream(self.device))
        # The copy is done once the event is: then the host slab can be reused.
        ev.synchronize()
        host.release()
        return out

    def __iter__(self):
        return self.epoch()
