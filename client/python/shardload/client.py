"""The trainer side of the shardload loader process (protocol: docs/protocol.md):
Client, a connection to ``shardload serve``. Also re-exports the names
``shardload.client`` has always offered, from the modules that hold them now
(messages, state, batch, slabs, device, errors).

Only the standard library is needed; with NumPy installed, columns are zero-copy
numpy arrays, and with PyTorch, zero-copy tensors.

Batch lifetime: a batch is released when the next one is taken (or by
``Batch.release()``); then it hands out no columns, but every array, tensor,
memoryview or Ragged row taken from it stays valid and unchanged while held. Its slab
goes back to the server as it is once no view of the batch is alive, else after the
batch is copied out ("detached", ``client.stats["detached"]``); the buffer protocol,
not reference counts, says whether a view is alive (see shardload.slabs). Never write
into batch data; ``copy()`` or ``to_torch(copy=True)`` give owned data.
"""

from __future__ import annotations

import math
import os
import socket
import time
import warnings
from typing import Any, Callable, Dict, Iterable, Iterator, List, Mapping, Optional, Tuple, cast

from . import transport
from .batch import Batch, Column, Output, Ragged, output_modules
from .device import Device, gpu_pci, parse_device
from .errors import (NoServer, OrderMismatch, PermissionDenied, ProtocolError, ServerError, ServerGone,
                     ShardloadError, ShardloadWarning, Timeout, UntrustedServer)
from .hello import SETTINGS, hello_message
from .messages import (CLIENT_NAME, MAX_MESSAGE, PROTOCOL_VERSION, BatchMessage, EndMessage, EpochEnd, FieldInfo,
                       Message, OrderInfo, Placement, ReadyMessage, State)
from .order import check_order as _check_order
from .protocol import default_socket, epoch_message, release_message
from .slabs import SlabHook, Slabs, Stats, new_stats
from .state import check_state, epoch_end, epoch_start, estimated_epoch_warning, state_of

__all__ = [
    "CLIENT_NAME", "MAX_MESSAGE", "PROTOCOL_VERSION", "Batch", "Client", "Column", "Device", "EpochEnd",
    "Message", "NoServer", "OrderMismatch", "Output", "PermissionDenied", "ProtocolError", "Ragged",
    "ServerError", "ServerGone", "ShardloadError", "ShardloadWarning", "SlabHook", "State", "Stats", "Timeout",
    "UntrustedServer", "check_state", "connect", "default_socket",
]


def _env_int(name: str, default: int) -> int:
    v = os.environ.get(name)
    return int(v) if v else default


class Client:
    """A connection to ``shardload serve``: one trainer rank's pipeline.

    Settings default to what torchrun sets: rank from $RANK, world from $WORLD_SIZE,
    local rank from $LOCAL_RANK; the socket from $SHARDLOAD_SOCKET (see
    default_socket). ``fields`` are field specs as ``shardload bench --field`` takes
    them (e.g. ``["img=jpg:image:uint8:3x224x224", "label=cls:int"]``: images
    decoded, resized and cropped by the server, labels as int64); without them the
    server's fields are used. ``urls`` names the shards (the server must
    allow them); without them the server's dataset is read. ``output`` is
    "numpy" (default when NumPy is installed), "torch" or "memoryview". ``timeout``
    (seconds) bounds every wait for the server.

    ``device`` (a CUDA ordinal, "cuda:N" or a torch.device) names the trainer's GPU;
    without it, the current CUDA device. Its PCI address goes to the server, which
    places the session's memory and threads on that GPU's NUMA node, when CUDA is
    already initialised in this process (the client never initialises it); otherwise
    the server guesses from the local rank. ``placement`` is what the server did.

    Order check (``check_order``, default on): every rank of a job must read the same
    order (``order``: the server's ``fingerprint``, also ``state_dict()["order"]``;
    ``job``, a digest of every setting; the ``settings``), as $SHARDLOAD_EXPECT_ORDER
    says and as the other ranks of an initialised torch.distributed world read it
    (OrderMismatch otherwise; Timeout after ``check_timeout`` seconds): see
    shardload.order.check_order.

    The server must run as this process's user or as root, or as one of
    ``trust_uids`` (default: $SHARDLOAD_TRUST_UIDS, comma-separated uids), checked
    before the hello (UntrustedServer otherwise): see shardload.transport.connect.

    Iterating over the client yields the batches of its current epoch; ``epoch(n)``
    starts epoch n on the same slabs, at any time (an epoch left early is abandoned).

    A mix of datasets: ``streams=[{"urls": PATTERN, "weight": 0.7}, {"urls": [...],
    "weight": 0.3}]`` instead of ``urls`` (or ``repeat``/``choose`` instead of a
    weight), ``epoch_samples`` (``math.inf``: endless epochs, ``state_dict()`` exact
    throughout) and ``batching``: "random", "stratified" or "per_stream" (README:
    "Mixing datasets"). ``last_epoch["streams"]`` has each stream's samples, bytes.

    ``pack="FIELD:SEQ_LEN[:eos=ID][:pad=ID][:ids=int32]"`` packs documents into rows
    of tokens (``input_ids``, int64 or with ``ids=int32`` int32, ``position_ids``,
    ``cu_seqlens``, ``max_seqlen``; README: "Language models"); with ``streams``
    weights are shares of ``epoch_tokens``.
    ``ranks_per_node`` ($LOCAL_WORLD_SIZE) keeps each node on its shards every epoch.

    Settings that define the trainer's epochs (each None: the server's): ``slab_bytes``
    and ``slabs`` (default: slabs sized from the batch by the server, and grown, with
    one ShardloadWarning, when a batch turns out larger), ``shuffle`` (False: shards
    and samples in order), ``shuffle_buffer`` (samples), ``shuffle_bytes``,
    ``open_shards`` and ``read_gap`` (bytes; 0: none). ``image_layout`` is the shape of
    the image fields named without one: "chw" (3x224x224, what torchvision models
    take; the default with output="torch") or "hwc" (224x224x3, the default
    otherwise). ``count_first`` counts a dataset without an index before the first
    batch (exact epochs); ``allow_estimate`` lets a job of several ranks without an
    index plan from estimated counts (approximate epochs: samples left out or
    repeated, said by a ShardloadWarning at each epoch's end and in ``last_epoch``);
    without either such a job fails before its first batch with a ServerError naming
    ``shardload index``.

    ``batches_per_epoch`` is the batches of the epoch being read (from a resumed
    state: those left); ``epoch_batches`` those of a whole epoch (``len()`` of a
    ShardloadDataset). ``last_epoch`` (an EpochEnd) says what the server counted of
    the epoch that ended last. ``stats["wait_seconds"]`` is the time this client waited
    for batches that were not ready; ``stats["backpressure_seconds"]`` the time the
    server's loader waited for slabs this client held.

    Checkpoint and resume: ``state_dict()`` is the position after the last batch the
    client yielded (a dict of ints and strings to save with the trainer's
    checkpoint; the same on every rank at the same step); ``state=`` (a saved
    state_dict) starts the client there: at that epoch (``epoch`` must be 0 or the
    same), after those batches. ``load_state_dict(d)`` on a connected client makes
    the next epoch started (``epoch()``, or iterating) start at d.

    Batch lifetime: see Batch and the module docstring. ``stats`` counts releases,
    deferred releases and detaches (copies of batches whose views outlived a step).
    A client is used from one thread.
    """

    def __init__(self, socket_path: Optional[str] = None, *, rank: Optional[int] = None,
                 world: Optional[int] = None, local_rank: Optional[int] = None,
                 seed: int = 0, epoch: int = 0, batch_size: int = 32, fields: Optional[Iterable[str]] = None,
                 urls: Optional[Iterable[str]] = None, drop_last: bool = False, output: Optional[Output] = None,
                 timeout: Optional[float] = None, device: Optional[Device] = None,
                 check_order: bool = True, check_timeout: float = 300, trust_uids: Optional[Iterable[int]] = None,
                 state: Optional[Mapping[str, Any]] = None, allow_estimate: bool = False, count_first: bool = False,
                 slab_bytes: Optional[int] = None, slabs: Optional[int] = None, shuffle: Optional[bool] = None,
                 shuffle_buffer: Optional[int] = None, shuffle_bytes: Optional[int] = None,
                 open_shards: Optional[int] = None, read_gap: Optional[int] = None,
                 ranks_per_node: Optional[int] = None, node_affinity: Optional[bool] = None,
                 image_layout: Optional[str] = None, streams: Optional[Iterable[Mapping[str, Any]]] = None,
                 epoch_samples: Optional[float] = None, batching: Optional[str] = None,
                 pack: Optional[str] = None, epoch_tokens: Optional[int] = None) -> None:
        if ranks_per_node is None and os.environ.get("LOCAL_WORLD_SIZE", "").isdigit():  # torchrun's
            ranks_per_node = int(os.environ["LOCAL_WORLD_SIZE"])
        # The settings a hello carries as they are (hello.SETTINGS): passed on by name.
        settings = {name: value for name, value in locals().items() if name in SETTINGS}
        self.socket_path = socket_path or default_socket()
        # epoch_samples=math.inf: the epochs (of what the streams give) follow one
        # another without an end.
        self.endless = epoch_samples == math.inf
        if self.endless:
            epoch_samples = None
        self.rank = _env_int("RANK", 0) if rank is None else rank
        self.world = _env_int("WORLD_SIZE", 1) if world is None else world
        self.local_rank = _env_int("LOCAL_RANK", 0) if local_rank is None else local_rank
        self.output: Output
        self.output, self._np, self._torch = output_modules(output)
        self.timeout = timeout
        self.device = device
        ordinal = parse_device(device)
        self._pid = os.getpid()
        self._held: Dict[int, Batch] = {}    # slab -> Batch handed out and not released
        self._gen = 0      # bumped by epoch() and close(): older generators stop
        self._draining: Optional[int] = None  # an abandoned epoch whose end has not been read
        self._epoch_open = False
        self._sock: Optional[socket.socket] = None
        self.closed = False
        self.stats: Stats = new_stats()
        # The slabs (mapped once the ready came) and the releases deferred.
        self._slabs = Slabs(self._send_release, self.stats)
        self.last_epoch: Optional[EpochEnd] = None
        self.order: Optional[OrderInfo] = None
        self.placement: Optional[Placement] = None
        self._state: Optional[State] = None          # the position after the last batch yielded
        self._pending_state: Optional[State] = None  # load_state_dict's, for the next epoch started
        if state is not None:
            state = check_state(state)
            if epoch not in (0, state["epoch"]):
                raise ValueError(f"epoch {epoch} with a state of epoch {state['epoch']}: a state resumes its own "
                                 "epoch (pass epoch=0 or leave it out)")
            epoch = state["epoch"]
        if image_layout is None:
            image_layout = "chw" if self.output == "torch" else "hwc"
        hello = hello_message(
            rank=self.rank, world=self.world, local_rank=self.local_rank, seed=seed, epoch=epoch,
            batch_size=batch_size, drop_last=drop_last, fields=fields, urls=urls, image_layout=image_layout,
            state=state, gpu_pci=gpu_pci(ordinal) if (device is None or ordinal is not None) else None,
            cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES", ""), streams=streams,
            epoch_samples=cast(Optional[int], epoch_samples), batching=batching, pack=pack,
            epoch_tokens=epoch_tokens, **settings)
        try:
            self._sock, packet, fds, cut = transport.open_session(self.socket_path, hello, timeout, trust_uids)
        except BaseException:
            self.closed = True
            raise
        try:
            ready = transport.read_ready(packet, cut, self.socket_path)
            self._slabs.fds, fds = fds, []  # closed by close() from here on
            try:
                self._ready(ready)
            except (KeyError, TypeError, ValueError) as e:
                raise ProtocolError(f"a ready message this client cannot read ({type(e).__name__}: {e}): "
                                    f"{packet[:200]!r}") from None
            if check_order:
                _check_order(self.order, self.socket_path, check_timeout)
        except BaseException:
            for fd in fds:
                os.close(fd)
            self.close()
            raise

    def _ready(self, ready: ReadyMessage) -> None:
        if len(self._slabs.fds) != ready["slabs"]:
            raise ProtocolError(f"the server announced {ready['slabs']} slabs but passed "
                                f"{len(self._slabs.fds)} descriptors")
        self.slab_bytes: int = int(ready["slab_bytes"])
        self._slabs.map(self.slab_bytes)
        self.session: int = ready["session"]
        self.fields: List[FieldInfo] = ready["fields"]
        self.batches_per_epoch: int = ready["batches"]
        # A whole epoch's batches for this rank (an older server says only those left).
        self.epoch_batches: int = int(ready.get("epoch_batches", ready["batches"]))
        # The counts are estimates (no index): every rank still gets exactly
        # batches_per_epoch, padded or trimmed (last_epoch says how).
        self.counts_estimated = bool(ready.get("estimated", False))
        self.samples_per_epoch: int = ready["samples"]
        self.current_epoch: int = ready["epoch"]
        self.order = ready.get("order")
        self.placement = ready.get("placement")
        self._state = state_of(ready, "ready")
        self.last_end: Optional[EndMessage] = None
        self._epoch_open = True

    # -- connection and messages --

    def _send(self, obj: Mapping[str, Any]) -> None:
        if self._sock is None:
            raise ShardloadError("the client is closed")
        transport.send(self._sock, obj, self.socket_path, self.timeout)

    def _recv(self) -> Message:
        if self._sock is None:
            raise ShardloadError("the client is closed")
        return transport.recv(self._sock, self.socket_path, self.timeout)

    # -- slabs and their lifetime (shardload.slabs) --

    def _send_release(self, b: Batch) -> None:
        self._send(release_message(b._slab, b.seq, b.epoch, self.stats["wait_seconds"]))
        self.stats["released"] += 1

    def _release_batch(self, b: Batch) -> None:
        """Batch.release: give the slab back now if no view of the batch is alive, else
        once they are gone or copied (see Slabs.settle)."""
        if b.released:
            return
        b._drop()
        if self._held.get(b._slab) is b:
            del self._held[b._slab]
        if self.closed or os.getpid() != self._pid:
            return
        self._slabs.hand_back(b)

    def _batch(self, msg: Message) -> Batch:
        """The Batch of a batch message, held until released (Slabs.take)."""
        try:
            b = self._slabs.take(cast(BatchMessage, msg), self._np, self._torch, self._release_batch)
        except (KeyError, TypeError, ValueError) as e:
            raise ProtocolError(f"a batch message this client cannot read ({type(e).__name__}: {e})") from None
        self._held[b._slab] = b
        return b

    # -- epochs --

    def batches(self, auto_release: bool = True) -> Iterator[Batch]:
        """Yield the batches of the current epoch. With auto_release, each batch is
        released when the next is asked for (and the last when the epoch ends or the
        loop is left); otherwise the caller releases each (the slabs are few: hold too
        many and the server waits). Either way, views of a released batch stay valid
        (see Batch)."""
        if self.closed:
            raise ShardloadError("the client is closed")
        if self._pending_state is not None:
            return self.epoch(None, auto_release)  # a state was loaded: resume there
        if not self._epoch_open:
            raise ShardloadError(f"epoch {self.current_epoch} was read already: call epoch(n) for another")
        return self._iterate(self._gen, auto_release)

    def _iterate(self, gen: int, auto_release: bool) -> Iterator[Batch]:
        b: Optional[Batch] = None
        try:
            while True:
                if gen != self._gen:
                    return  # epoch() or close() came since: this epoch is over for us
                if b is not None:
                    if auto_release:
                        self._release_batch(b)
                    b = None
                # The loop's variables named the previous batch until now: the batches
                # released before it was taken are free now, or copied out.
                self._slabs.settle()
                if self._draining is not None:
                    self._drain()
                if not self._epoch_open:
                    return
                if self._slabs.pending and len(self._held) + len(self._slabs.pending) >= len(self._slabs):
                    self._slabs.settle(force=True)  # the server has no slab left to fill
                t0 = time.perf_counter()
                msg = self._recv()
                self.stats["wait_seconds"] += time.perf_counter() - t0
                t = msg.get("type")
                if t == "end":
                    if msg.get("epoch") != self.current_epoch:
                        raise ProtocolError(f"end of epoch {msg.get('epoch')} while reading epoch {self.current_epoch}")
                    self._epoch_open = False
                    self._ended(cast(EndMessage, msg))
                    end = state_of(msg, "end")
                    if end is not None:
                        self._state = epoch_start(end["epoch"] + 1, end)
                    return
                if t != "batch":
                    raise ProtocolError(f"unexpected message {t!r} during an epoch")
                if msg.get("epoch") != self.current_epoch:
                    raise ProtocolError(f"batch of epoch {msg.get('epoch')} while reading epoch {self.current_epoch}")
                b = self._batch(msg)
                self._slabs.takes += 1
                if b.state is not None:
                    self._state = b.state
                yield b
        finally:
            if b is not None and auto_release and gen == self._gen and not self.closed:
                try:
                    self._release_batch(b)
                except ShardloadError:
                    pass

    def __iter__(self) -> Iterator[Batch]:
        if self.endless:
            return self._endless()
        return self.batches()

    def _endless(self) -> Iterator[Batch]:
        """The batches of the current epoch and of every epoch after it."""
        yield from self.batches()
        while not self.closed:
            yield from self.epoch(self.current_epoch + 1)

    def _ended(self, msg: EndMessage) -> None:
        """Note an epoch's end message (last_end, last_epoch), and warn when an epoch
        planned from estimated counts left samples out or repeated some."""
        self.last_end = msg
        self.last_epoch = e = epoch_end(msg)
        w = estimated_epoch_warning(e, self.rank)
        if w is not None:
            warnings.warn(w, stacklevel=3)

    def epoch(self, n: Optional[int] = None, auto_release: bool = True) -> Iterator[Batch]:
        """Start epoch n and yield its batches. Called before the current epoch's end
        (the loop was left early), it abandons the current epoch: the batches of it
        still held are released (those whose views are still referenced after a copy,
        see Batch) and the server drops the rest. After a normal end, the batches of the
        epoch that ended may still be released later; those of earlier epochs are
        released now.

        After load_state_dict(d), the epoch starts at d: n is then d's epoch (or None)."""
        if self.closed:
            raise ShardloadError("the client is closed")
        state = self._pending_state
        if state is not None:
            if n is not None and n != state["epoch"]:
                raise ValueError(f"epoch({n}) after load_state_dict of a state of epoch {state['epoch']}: "
                                 f"a state resumes its own epoch (call epoch() or epoch({state['epoch']}))")
            n = state["epoch"]
        elif n is None:
            raise TypeError("epoch() needs the epoch to start, unless load_state_dict gave a state")
        self._gen += 1  # generators of the current epoch yield and release nothing more
        if self._draining is not None:
            self._drain()  # one abandoned epoch at a time
        old = self.current_epoch
        abandon = self._epoch_open
        # Batches may be released during the next epoch only if they are of this one
        # and it ends normally. After an abandon the server takes the slabs back
        # itself. Either way the releases that may not come later go first, and the
        # batches whose views live on are copied out.
        keep: Callable[[Batch], bool] = (lambda b: False) if abandon else (lambda b: b.epoch == old)
        for b in list(self._held.values()):
            if not keep(b):
                self._release_batch(b)
        self._slabs.settle(force=True, which=lambda b: not keep(b))
        self._send(epoch_message(n, state))
        self._pending_state = None
        self._state = state if state is not None else epoch_start(n, self._state)
        self.current_epoch = n
        self._epoch_open = True
        self._draining = old if abandon else None
        return self.batches(auto_release)

    def _drain(self) -> None:
        """Read up to the end of the epoch being abandoned, dropping its batches."""
        e = self._draining
        assert e is not None  # epoch()'s and _iterate's, which call this
        late = []
        while True:
            msg = self._recv()
            t = msg.get("type")
            if t == "batch" and msg.get("epoch") == e:
                late.append(msg)
                continue
            if t == "end" and msg.get("epoch") == e:
                break
            raise ProtocolError(f"unexpected message {t!r} of epoch {msg.get('epoch')} while waiting for "
                                f"the end of abandoned epoch {e}")
        self._draining = None
        self._ended(cast(EndMessage, msg))
        if not msg.get("abandoned"):
            # The epoch had ended before the server read the epoch message: it gave
            # back nothing, and the batches dropped here are this client's to release.
            for m in late:
                self._send(release_message(m["slab"], m["seq"], e))
                self.stats["released"] += 1

    # -- checkpoint and resume --

    def state_dict(self) -> State:
        """The position after the last batch this client yielded, as a plain dict of
        ints and strings (epoch, order, samples, runs, batches) to save with the
        trainer's checkpoint: before the first batch, the position the session
        started from; after an epoch's end, the start of the next epoch; after
        load_state_dict, the state loaded. Every rank of a job has the same state at
        the same step, and a job of another world size may resume from it."""
        if self._pending_state is not None:
            return self._pending_state.copy()
        if self._state is None:
            raise ShardloadError("the shardload server sent no state (it speaks a protocol older than version 3): "
                                 "upgrade the server to checkpoint the loader's position")
        return self._state.copy()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Make the next epoch started (``epoch()``, or iterating over the client)
        start at state, a dict that state_dict() returned: at its epoch, after its
        batches. The current epoch, if being read, is abandoned then. A Client made
        with ``state=`` starts there without a second epoch message."""
        if self.closed:
            raise ShardloadError("the client is closed")
        self._pending_state = check_state(state)

    # -- the end --

    def close(self) -> None:
        """Say goodbye and unmap the slabs. Views of batches still referenced stay
        valid: those batches are copied out first. Idempotent."""
        if self.closed:
            return
        self.closed = True
        self._gen += 1
        if os.getpid() != self._pid:
            # A forked child (e.g. a DataLoader worker) inherited this client: the
            # connection and the slabs are its parent's.
            if self._sock is not None:
                self._sock.close()
            self._sock = None
            self._slabs.forget()  # this process's copies of the descriptors
            self._held = {}
            return
        if self._sock is not None:
            transport.bye(self._sock)
            self._sock = None
        held, self._held = list(self._held.values()), {}
        self._slabs.close(held)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    def slab_addresses(self) -> List[Tuple[int, int]]:
        """(address, size) of each mapped slab, e.g. to register them with CUDA. A slab
        is mapped afresh (at another address) when a batch is copied out of it: see
        add_slab_hook."""
        return self._slabs.addresses()

    def add_slab_hook(self, hook: SlabHook) -> None:
        """Tell hook when a slab's mapping changes: hook.slab_unmapping(i, addr, size)
        before the memory at addr stops being slab i's (a detach, or close), and
        hook.slab_mapped(i, addr, size) when slab i is mapped afresh at addr."""
        self._slabs.hooks.append(hook)


def connect(socket_path: Optional[str] = None, **kwargs: Any) -> Client:
    """Connect to a shardload server; see Client."""
    return Client(socket_path, **kwargs)
