"""The trainer side of the shardload loader process (protocol: docs/protocol.md).

Only the standard library is needed; with NumPy installed, columns are zero-copy
numpy arrays, and with PyTorch, zero-copy tensors.

Batch lifetime
--------------
Columns are read-only views into a shared slab. A batch is released when the next one
is taken (or by ``Batch.release()``); from then on the Batch object no longer hands
out columns (``b["x"]`` raises ShardloadError; ``b.keys`` stays), but every array,
tensor, memoryview or Ragged row the trainer took from it stays valid and never
changes, for as long as the trainer holds it:

- When nothing of the batch is referenced any more at its release, the slab goes back
  to the server at once (no copy).
- When something is (a loop variable still names last step's labels), the client
  looks again when the next batch is taken; a normal loop has moved on by then, and
  the slab goes back without a copy.
- When something still is (a list of kept labels), the client "detaches" the batch:
  it copies the batch's bytes into private memory placed at the same address (one
  atomic ``mremap``), so the views keep their addresses and contents, and gives the
  slab back. ``client.stats["detached"]`` counts these copies.

Columns must not be modified in place: numpy arrays and memoryviews are read-only,
and torch tensors, which cannot be made read-only, must not be written either
(``x.add_(1)`` on a batch tensor would write into the shared slab). Use ``copy()`` or
``to_torch(copy=True)`` for data to modify.
"""

from __future__ import annotations

import itertools
import json
import mmap
import os
import socket
import struct
import sys
import tempfile
import time
import warnings
from types import ModuleType
from typing import (TYPE_CHECKING, Any, Callable, Dict, ItemsView, Iterable, Iterator, List, Literal,
                    Mapping, Optional, Protocol, Tuple, TypedDict, Union, cast)

from . import _mem

if TYPE_CHECKING:  # optional at run time
    import numpy
    import torch

PROTOCOL_VERSION = 4
MAX_MESSAGE = 64 << 10
_MAX_FDS = 253
CLIENT_NAME = "shardload-python/0.4.0"


class State(TypedDict):
    """A position in the loader's order (the Go library's shardload.State), as
    Client.state_dict() returns it: a plain dict of ints and strings."""

    epoch: int
    order: str
    samples: int
    runs: str
    batches: int


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


class EpochEnd(TypedDict):
    """Client.last_epoch: what the server says of the epoch that ended last, for this
    rank: batches, samples (padding rows not counted), padded (rows repeating other
    samples), left_out (samples read past the planned batches and dropped), skipped
    (by the skip policy), estimated (the epoch was planned from estimated counts) and
    abandoned."""

    epoch: int
    batches: int
    samples: int
    padded: int
    left_out: int
    skipped: int
    estimated: bool
    abandoned: bool


# A server message: a JSON object.
Message = Dict[str, Any]

# What Client's output may be.
Output = Literal["numpy", "torch", "memoryview"]

# What Client's device may be: a CUDA ordinal, "cuda:N" ("cuda": the current device;
# any other type: no CUDA device) or a torch.device.
Device = Union[int, str, "torch.device"]

# A column of a batch: a numpy array, a torch tensor or a memoryview (by the client's
# output), or a Ragged of those for variable-length fields. Typed Any: which one comes
# is decided at run time.
Column = Any


class SlabHook(Protocol):
    """What Client.add_slab_hook takes: an object told when a slab's mapping changes."""

    def slab_mapped(self, i: Optional[int], addr: int, size: int) -> None:
        """Slab i (None: one already mapped, when the hook registers them itself) is
        mapped at addr."""

    def slab_unmapping(self, i: Optional[int], addr: int, size: int) -> None:
        """The memory at addr is about to stop being slab i's."""


# The members of a state (the Go library's shardload.State) and their types.
_STATE_MEMBERS: Tuple[Tuple[str, type], ...] = (
    ("epoch", int), ("order", str), ("samples", int), ("runs", str), ("batches", int))


class ShardloadWarning(UserWarning):
    """A warning of the shardload client: an epoch planned from estimated counts left
    samples out or repeated some, or the server grew the slabs for a larger batch."""


class ShardloadError(Exception):
    """Base class of the client's errors."""


class ServerError(ShardloadError):
    """The server ended the session and said why (``code`` and ``message``)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"shardload server: {message} ({code})")
        self.code = code
        self.message = message


class ServerGone(ShardloadError):
    """The server closed the connection without a word: it stopped or crashed."""


class ProtocolError(ShardloadError):
    """The server sent something this client cannot read."""


class NoServer(ShardloadError):
    """No server listens on the socket: there is no socket file, or one that a server
    left when it exited or was killed."""


class PermissionDenied(ShardloadError):
    """The socket (or its directory) may not be opened by this user."""


class UntrustedServer(ShardloadError):
    """The server at the socket runs as a user this client does not trust (see
    Client's ``trust_uids``): another user may have put its socket there."""


class Timeout(ShardloadError):
    """The server, or another rank, did not answer within the time given."""


class OrderMismatch(ShardloadError):
    """This rank's server reads another order than the other ranks' servers (or than
    $SHARDLOAD_EXPECT_ORDER says): the ranks would read overlapping or incomplete parts
    of each epoch."""


def default_socket() -> str:
    """The socket path ``shardload serve`` uses by default: $SHARDLOAD_SOCKET, else
    $XDG_RUNTIME_DIR/shardload/loader.sock, else /tmp/shardload-UID/loader.sock."""
    path = os.environ.get("SHARDLOAD_SOCKET")
    if path:
        return path
    run = os.environ.get("XDG_RUNTIME_DIR")
    if run:
        return os.path.join(run, "shardload", "loader.sock")
    return os.path.join(tempfile.gettempdir(), f"shardload-{os.getuid()}", "loader.sock")


def _env_int(name: str, default: int) -> int:
    v = os.environ.get(name)
    return int(v) if v else default


# Struct format characters for NumPy descrs, used without NumPy (memoryview.cast).
_FORMATS: Dict[str, str] = {
    "|b1": "?", "|i1": "b", "<i2": "h", "<i4": "i", "<i8": "q", "|u1": "B",
    "<u2": "H", "<u4": "I", "<u8": "Q", "<f2": "e", "<f4": "f", "<f8": "d",
}


def _numpy() -> Optional[ModuleType]:
    try:
        import numpy
    except ImportError:
        return None
    return numpy


_NOT_WRITABLE = "The given NumPy array is not writable"

# Whether torch still has to be kept from warning about read-only arrays: it warns
# once per process, and the warning filter costs more than the rest of a batch's
# tensors, so the client stops filtering once torch has warned and then stayed quiet.
_quiet: Dict[str, bool] = {"warned": False, "done": False}


class _NoWritableWarning:
    """Around torch.from_numpy of read-only arrays: without torch's warning (batch
    tensors are documented as not to be written)."""

    def __enter__(self) -> _NoWritableWarning:
        if _quiet["done"]:
            return self
        self._cw = warnings.catch_warnings(record=True)
        self._seen = self._cw.__enter__()
        warnings.filterwarnings("always", message=_NOT_WRITABLE)
        return self

    def __exit__(self, *exc: Any) -> Literal[False]:
        if _quiet["done"]:
            return False
        self._cw.__exit__(*exc)
        mine = [w for w in self._seen if str(w.message).startswith(_NOT_WRITABLE)]
        for w in self._seen:  # warnings of other origins go on as they came
            if w not in mine:
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno, source=w.source)
        if mine:
            _quiet["warned"] = True
        elif _quiet["warned"]:
            _quiet["done"] = True
        return False


def _from_numpy(torch: Any, arr: Any) -> Any:
    with _NoWritableWarning():
        return torch.from_numpy(arr)


def _torch_ok(arr: numpy.ndarray[Any, numpy.dtype[Any]]) -> bool:
    # PyTorch has no uint16/32/64 tensors: those columns stay numpy arrays.
    return arr.dtype.kind != "u" or arr.dtype.itemsize == 1


class Ragged:
    """A variable-length column: ``len(r)`` rows, row i is ``data[offsets[i]:offsets[i+1]]``.

    ``data`` is a uint8 array (a memoryview without NumPy) and ``offsets`` an int64
    array of rows+1 entries. Rows are zero-copy, read-only views that stay valid and
    unchanged while referenced (see the module docstring); ``tolist()`` copies them out
    as bytes (str for text columns).
    """

    __slots__ = ("data", "offsets", "kind")

    data: Any      # a uint8 numpy array or torch tensor, or a memoryview
    offsets: Any   # an int64 numpy array or torch tensor, or a memoryview of format "q"
    kind: str      # the field's kind: raw, npy, text, json

    def __init__(self, data: Any, offsets: Any, kind: str) -> None:
        self.data = data
        self.offsets = offsets
        self.kind = kind

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i: int) -> Any:
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"row {i} of a column of {n}")
        return self.data[int(self.offsets[i]):int(self.offsets[i + 1])]

    def __iter__(self) -> Iterator[Any]:
        for i in range(len(self)):
            yield self[i]

    def tolist(self) -> Union[List[bytes], List[str]]:
        rows = [bytes(_host_bytes(self[i])) for i in range(len(self))]
        if self.kind in ("text", "json"):
            return [r.decode("utf-8") for r in rows]
        return rows

    def copy(self) -> Ragged:
        """A Ragged that owns its data (of the same array type)."""
        return Ragged(_copy_array(self.data), _copy_array(self.offsets), self.kind)


def _host_bytes(row: Any) -> Any:
    if hasattr(row, "numpy") and not isinstance(row, memoryview):
        return row.numpy()  # a torch tensor
    return row


def _copy_array(a: Any) -> Any:
    if hasattr(a, "clone"):  # a torch tensor
        return a.clone()
    if isinstance(a, memoryview):
        return memoryview(a.tobytes()).cast(a.format, a.shape)  # type: ignore[arg-type]
    return a.copy()  # numpy


class Batch:
    """One batch: columns by field name (``batch["jpg"]``), ``keys`` (the samples'
    keys), ``epoch``, ``seq``, ``padded`` (rows repeating earlier samples to keep
    every rank's batch count when samples were skipped) and ``state`` (the position
    after this batch, as Client.state_dict() gives it once the batch was yielded).

    Columns are read-only views into a shared slab, handed out until the batch is
    released: by ``release()``, or when the iterator takes the next batch (unless
    iterating with ``auto_release=False``). After the release, ``b[name]``,
    ``items()``, ``to_dict()``, ``to_torch()``, ``columns`` and ``copy()`` raise
    ShardloadError; ``keys`` stays. The arrays and tensors taken from the batch before
    its release stay valid and unchanged as long as they are referenced: the client
    copies the batch out of the slab ("detaches" it) when they outlive a step, and
    gives the slab back without a copy when they do not. Do not write into them (torch
    tensors cannot be made read-only: no in-place ops on batch tensors).

    ``copy()`` returns a batch that owns its data; ``to_torch(copy=False)`` the columns
    as torch tensors.
    """

    def __init__(self, client: Optional[Client], msg: Message, columns: Dict[str, Column], keys: Any,
                 state: Optional[State] = None) -> None:
        self._client = client
        self._slab: int = msg["slab"]
        self.epoch: int = msg["epoch"]
        self.seq: int = msg["seq"]
        self.state = state  # the position after this batch (see Client.state_dict)
        self.rows: int = msg["rows"]
        self.padded: int = msg.get("padded", 0)
        self._used: Optional[int] = msg.get("used")
        self._columns: Optional[Dict[str, Column]] = columns
        self._names = list(columns)
        self._keys: Any = keys  # the key column (a Ragged), then its list of str
        self._owned = client is None
        self._mark = 0  # the client's step count when the release was deferred
        self.released = False

    def _data(self) -> Dict[str, Column]:
        if self._columns is None:
            raise ShardloadError(
                f"batch {self.seq} of epoch {self.epoch} was released: its columns are no longer "
                "handed out. Keep the arrays or tensors themselves (they stay valid and unchanged), "
                "or call copy() before the batch is released; keys stay available")
        return self._columns

    @property
    def columns(self) -> Dict[str, Column]:
        """The columns by name (a dict); raises ShardloadError after the release."""
        return self._data()

    @property
    def keys(self) -> List[str]:
        """The samples' keys, in row order (a list of str); available after the release."""
        if isinstance(self._keys, Ragged):
            self._keys = self._keys.tolist()
        return cast(List[str], self._keys)

    def __getitem__(self, name: str) -> Column:
        return self._data()[name]

    def __contains__(self, name: object) -> bool:
        return name in self._names

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def items(self) -> ItemsView[str, Column]:
        return self._data().items()

    def to_dict(self) -> Dict[str, Any]:
        """The columns as a dict, plus "__key__": the keys."""
        d: Dict[str, Any] = dict(self._data())
        d["__key__"] = self.keys
        return d

    def to_torch(self, copy: bool = False) -> Dict[str, Any]:
        """The columns as torch tensors (a dict, plus "__key__": the keys), whatever the
        client's output. Ragged columns are Ragged of tensors; numpy columns of types
        torch lacks (uint16/32/64) stay numpy arrays. Without copy, the tensors are
        zero-copy views (read them, never write them); with copy=True, owned clones."""
        import torch
        np = _numpy()
        out: Dict[str, Any] = {}
        for name, col in self._data().items():
            if isinstance(col, Ragged):
                r = Ragged(_as_tensor(torch, np, col.data), _as_tensor(torch, np, col.offsets), col.kind)
                out[name] = r.copy() if copy else r
            else:
                t = _as_tensor(torch, np, col)
                out[name] = _copy_array(t) if copy else t
        out["__key__"] = list(self.keys)
        return out

    def copy(self) -> Batch:
        """A copy that owns its memory, needs no release and stays usable."""
        cols: Dict[str, Column] = {}
        for name, col in self._data().items():
            cols[name] = col.copy() if isinstance(col, Ragged) else _copy_array(col)
        return Batch(None, {"slab": -1, "epoch": self.epoch, "seq": self.seq, "rows": self.rows,
                            "padded": self.padded}, cols, list(self.keys),
                     None if self.state is None else self.state.copy())

    def release(self) -> None:
        """Hand the slab back to the server (see the class docstring); idempotent. A
        copy() needs no release: this does nothing to it."""
        if self.released or self._owned:
            return
        if self._client is not None:
            self._client._release_batch(self)
        else:
            self._drop()

    def _drop(self) -> None:
        """Forget the columns; keep the keys (copied out of the slab)."""
        if isinstance(self._keys, Ragged):
            self._keys = self._keys.copy()
        self._columns = None
        self.released = True


def _as_tensor(torch: Any, np: Any, x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return x
    if isinstance(x, memoryview):
        x = np.asarray(x)
    if not _torch_ok(x):
        return x
    return _from_numpy(torch, x)


def _parse_device(device: Any) -> Union[int, str, None]:
    """A CUDA ordinal, "current" (the current device), or None (not a CUDA device)."""
    if device is None:
        return None
    if isinstance(device, bool):
        raise ValueError(f"device {device!r}: want a CUDA ordinal, 'cuda:N' or a torch.device")
    if isinstance(device, int):
        if device < 0:
            raise ValueError(f"device {device}: a CUDA ordinal is >= 0")
        return device
    if isinstance(device, str):
        scheme, _, idx = device.partition(":")
        if scheme != "cuda":
            return None
        if not idx:
            return "current"
        if not idx.isdigit():
            raise ValueError(f"device {device!r}: want 'cuda:N'")
        return int(idx)
    kind = getattr(device, "type", None)
    if kind is None:
        raise ValueError(f"device {device!r}: want a CUDA ordinal, 'cuda:N' or a torch.device")
    if kind != "cuda":
        return None
    return "current" if device.index is None else device.index


def _gpu_pci(device: Union[int, str, None]) -> Optional[str]:
    """The PCI address of the trainer's GPU when it can be known without initialising
    CUDA: torch must be imported and CUDA initialised already. None otherwise."""
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None) if torch is not None else None
    if cuda is None:
        return None
    try:
        if not cuda.is_initialized():  # (is_available() may itself initialise the driver)
            return None
        if device is None or device == "current":
            device = cuda.current_device()
        p = cuda.get_device_properties(device)
        bus, dev = getattr(p, "pci_bus_id", None), getattr(p, "pci_device_id", None)
        if bus is None or dev is None:
            return None
        return "%04x:%02x:%02x.0" % (getattr(p, "pci_domain_id", 0) or 0, bus, dev)
    except Exception:  # a query that fails only loses a placement hint
        return None


def _torch_distributed() -> Any:
    """torch.distributed when a world of more than one rank is initialised (torch
    already imported), else None."""
    if "torch" not in sys.modules:
        return None
    try:
        import torch.distributed as dist
    except ImportError:
        return None
    if not dist.is_available() or not dist.is_initialized():
        return None
    if dist.get_world_size() <= 1:
        return None
    return dist


# Counts the Clients this process created with the order check on: the store keys of
# one check are the same on every rank when every rank creates its clients alike.
_order_checks = itertools.count()


def _show(v: Any) -> str:
    return v if isinstance(v, str) else json.dumps(v)


def check_state(state: Mapping[str, Any]) -> State:
    """A copy of state, a position that Client.state_dict() returned, as a plain dict
    of its five members: epoch, order, samples, runs, batches (ints and strings).
    Raises ValueError for anything else (a checkpoint's other members are not copied)."""
    if not hasattr(state, "keys") or not hasattr(state, "__getitem__"):
        raise ValueError(f"a shardload state is a dict such as Client.state_dict() returns, not {type(state).__name__}")
    out: Dict[str, Any] = {}
    for name, kind in _STATE_MEMBERS:
        if name not in state:
            raise ValueError(f"a shardload state has the members {', '.join(n for n, _ in _STATE_MEMBERS)}; "
                             f"this one has no {name!r} (members: {', '.join(map(str, state.keys()))})")
        v = state[name]
        if kind is int:
            if isinstance(v, bool) or not hasattr(v, "__index__"):
                raise ValueError(f"shardload state: {name} {v!r} is not an int")
            v = int(v.__index__())
        elif not isinstance(v, str):
            raise ValueError(f"shardload state: {name} {v!r} is not a string")
        out[name] = v
    if out["epoch"] < 0:
        raise ValueError(f"shardload state: epoch {out['epoch']} < 0")
    return cast(State, out)


def _state_of(msg: Message, what: str) -> Optional[State]:
    """The state a server message carries, None when it carries none."""
    st = msg.get("state")
    if st is None:
        return None
    try:
        return check_state(st)
    except ValueError as e:
        raise ProtocolError(f"the server's {what} carries a state this client cannot read: {e}") from None


def _epoch_start(epoch: int, state: Optional[State]) -> State:
    """The state at the start of epoch, under the order of state (a state of any epoch
    of the same dataset and settings; None when unknown)."""
    order, samples = ("", 0) if state is None else (state["order"], state["samples"])
    return {"epoch": epoch, "order": order, "samples": samples, "runs": "", "batches": 0}


def _order_difference(rank: int, mine: Dict[str, Any], other_rank: int, other: Dict[str, Any]) -> str:
    """The message for two ranks whose orders differ; rank is the one that is not 0."""
    s, o = mine.get("settings") or {}, other.get("settings") or {}
    names = list(o) + [k for k in s if k not in o]
    diffs = [f"{k} {_show(s.get(k))} (rank {rank}) vs {_show(o.get(k))} (rank {other_rank})"
             for k in names if s.get(k) != o.get(k)]
    if not diffs:
        diffs = [f"job fingerprint {_job(mine)} (rank {rank}) vs {_job(other)} "
                 f"(rank {other_rank}) with the same settings (are the servers of different versions?)"]
    return (f"rank {rank}'s shardload server reads another order than rank {other_rank}'s: "
            + ", ".join(diffs) + "; every rank's server must run with the same settings")


def _store_has(store: Any, key: str) -> bool:
    check = getattr(store, "check", None)  # not in every torch version's stores
    if check is not None:
        return bool(check([key]))
    from datetime import timedelta
    try:
        store.wait([key], timedelta(milliseconds=10))
        return True
    except Exception:
        return False


def _job(order: Dict[str, Any]) -> Any:
    """The digest of every setting of an order, which the ranks of a job compare: the
    server's "job" (protocol 4; its "fingerprint" names the order of the samples alone),
    else its "fingerprint"."""
    return order.get("job") or order.get("fingerprint")


def _order_verdict(orders: List[Dict[str, Any]], rank: int) -> str:
    """What rank reports of every rank's order: its own difference from rank 0's, else
    the first rank's that differs ("" when all agree)."""
    zero = orders[0]
    if rank != 0 and _job(orders[rank]) != _job(zero):
        return _order_difference(rank, orders[rank], 0, zero)
    for r in range(1, len(orders)):
        if _job(orders[r]) != _job(zero):
            return _order_difference(r, orders[r], 0, zero)
    return ""


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
    order (``order``: the server's ``fingerprint`` of the order of the samples, which
    is also ``state_dict()["order"]``; ``job``, a digest of every setting; and the
    ``settings``). When $SHARDLOAD_EXPECT_ORDER is set, the fingerprint must equal it. When
    torch.distributed is initialised with more than one rank, the ranks compare their
    orders through its store (every rank creates its clients in the same order) and
    each raises OrderMismatch naming the settings that differ; a rank that does not
    report within ``check_timeout`` seconds makes the others raise Timeout. Without
    either, nothing is checked.

    The server must run as this process's user or as root, or as one of
    ``trust_uids`` (default: $SHARDLOAD_TRUST_UIDS, comma-separated uids): the client
    reads the server's uid from the socket (SO_PEERCRED) before it says anything, and
    raises UntrustedServer otherwise, so that another user's process that took the
    socket's place gets no hello.

    Iterating over the client yields the batches of its current epoch; ``epoch(n)``
    starts epoch n on the same slabs, at any time (an epoch left early is abandoned).

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
                 image_layout: Optional[str] = None) -> None:
        self.socket_path = socket_path or default_socket()
        self.rank = _env_int("RANK", 0) if rank is None else rank
        self.world = _env_int("WORLD_SIZE", 1) if world is None else world
        self.local_rank = _env_int("LOCAL_RANK", 0) if local_rank is None else local_rank
        np = _numpy()
        if output is None:
            output = "numpy" if np is not None else "memoryview"
        if output not in ("numpy", "torch", "memoryview"):
            raise ValueError(f"output {output!r}: want numpy, torch or memoryview")
        if output in ("numpy", "torch") and np is None:
            raise ImportError(f"output={output!r} needs numpy")
        self._np = np
        self._torch: Optional[ModuleType] = None
        if output == "torch":
            import torch
            self._torch = torch
        self.output: Output = output
        self.timeout = timeout
        self.device = device
        ordinal = _parse_device(device)
        self._pid = os.getpid()
        self._maps: List[mmap.mmap] = []    # per slab: the mmap object the batch in that slab uses
        self._sizes: List[int] = []   # per slab: its size as mapped (slabs grow)
        self._addrs: List[int] = []   # per slab: its address
        self._pads: List[int] = []    # per slab: the slab's offset in its mmap object
        self._fds: List[int] = []     # per slab: the memfd (for a fresh mapping after a detach)
        self._used: List[Optional[int]] = []    # per slab: bytes the latest batch in it occupies
        self._held: Dict[int, Batch] = {}    # slab -> Batch handed out and not released
        self._pending: List[Batch] = []  # released batches whose views were still referenced
        self._takes = 0    # batches taken (the clock of deferred releases)
        self._gen = 0      # bumped by epoch() and close(): older generators stop
        self._draining: Optional[int] = None  # an abandoned epoch whose end has not been read
        self._slab_hooks: List[SlabHook] = []  # objects told when a slab's mapping changes
        self._epoch_open = False
        self._sock: Optional[socket.socket] = None
        self.closed = False
        self.stats: Stats = {"released": 0, "deferred": 0, "detached": 0, "detached_bytes": 0,
                             "detach_seconds": 0.0, "wait_seconds": 0.0, "backpressure_seconds": 0.0}
        self.last_epoch: Optional[EpochEnd] = None
        self._grew = False
        self.order: Optional[Dict[str, Any]] = None
        self.placement: Optional[Dict[str, Any]] = None
        self._state: Optional[State] = None          # the position after the last batch yielded
        self._pending_state: Optional[State] = None  # load_state_dict's, for the next epoch started
        if state is not None:
            state = check_state(state)
            if epoch not in (0, state["epoch"]):
                raise ValueError(f"epoch {epoch} with a state of epoch {state['epoch']}: a state resumes its own "
                                 "epoch (pass epoch=0 or leave it out)")
            epoch = state["epoch"]
        hello: Message = {
            "type": "hello", "version": PROTOCOL_VERSION, "rank": self.rank, "world": self.world,
            "local_rank": self.local_rank, "seed": seed, "epoch": epoch, "batch_size": batch_size,
            "drop_last": drop_last, "client": CLIENT_NAME,
        }
        if fields:
            hello["fields"] = list(fields)
        if urls:
            hello["urls"] = list(urls)
        if image_layout is None:
            image_layout = "chw" if output == "torch" else "hwc"
        if image_layout not in ("chw", "hwc"):
            raise ValueError(f"image_layout {image_layout!r}: want 'chw' or 'hwc'")
        hello["image_layout"] = image_layout
        for name, value in (("allow_estimate", allow_estimate), ("count_first", count_first),
                            ("slab_bytes", slab_bytes), ("slabs", slabs), ("shuffle", shuffle),
                            ("shuffle_buffer", shuffle_buffer), ("shuffle_bytes", shuffle_bytes),
                            ("open_shards", open_shards), ("read_gap", read_gap)):
            if value is None or value is False and name in ("allow_estimate", "count_first"):
                continue
            if name != "shuffle" and not isinstance(value, bool) and (not isinstance(value, int) or value < 0):
                raise ValueError(f"{name}={value!r}: want a non-negative int")
            hello[name] = value
        if state is not None:
            hello["state"] = state
        pci = _gpu_pci(ordinal) if (device is None or ordinal is not None) else None
        if pci:
            hello["gpu_pci"] = pci
        visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
        if visible and len(visible) <= 1024 and all(c.isascii() and (c.isalnum() or c in ",-/ ") for c in visible):
            # Without gpu_pci, the server maps local_rank through it to a GPU.
            hello["cuda_visible_devices"] = visible
        fds: List[int] = []
        try:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        except OSError as e:
            raise ShardloadError(f"creating a unix socket: {e}") from None
        try:
            sock.settimeout(timeout)
            self._connect(sock)
            self._check_peer(sock, trust_uids)
            self._sock = sock
            self._send(hello)
            try:
                msg, fds, flags, _ = socket.recv_fds(sock, MAX_MESSAGE + 1, _MAX_FDS)
            except OSError as e:
                raise self._os_error(e, "waiting for the server's ready") from None
        except BaseException:
            for fd in fds:
                os.close(fd)
            sock.close()
            self._sock = None
            self.closed = True
            raise
        try:
            if flags & getattr(socket, "MSG_CTRUNC", 0):
                raise ProtocolError("the slab descriptors were cut short (MSG_CTRUNC)")
            ready = self._decode(msg)
            if ready.get("type") != "ready":
                raise ProtocolError(f"expected a ready message, got {ready.get('type')!r}")
            if ready.get("version") != PROTOCOL_VERSION:
                raise ProtocolError(f"the server speaks protocol version {ready.get('version')}, "
                                    f"this client version {PROTOCOL_VERSION}")
            self._fds, fds = list(fds), []  # closed by close() from here on
            try:
                self._ready(ready)
            except (KeyError, TypeError, ValueError) as e:
                raise ProtocolError(f"a ready message this client cannot read ({type(e).__name__}: {e}): "
                                    f"{msg[:200]!r}") from None
            if check_order:
                self._check_order(check_timeout)
        except BaseException:
            for fd in fds:
                os.close(fd)
            self.close()
            raise

    def _ready(self, ready: Message) -> None:
        if len(self._fds) != ready["slabs"]:
            raise ProtocolError(f"the server announced {ready['slabs']} slabs but passed {len(self._fds)} descriptors")
        self.slab_bytes: int = int(ready["slab_bytes"])
        for fd in self._fds:
            mm, addr, pad = _mem.map_fd(fd, self.slab_bytes)
            self._maps.append(mm)
            self._addrs.append(addr)
            self._pads.append(pad)
            self._sizes.append(self.slab_bytes)
            self._used.append(None)
            del mm
        # What sys.getrefcount says of a slab's mmap that nothing but this client
        # references; any view of a batch in it (and views of those views, which keep
        # their base alive) adds to it.
        self._base_refs = self._refs(0) if self._maps else 0
        self.session: int = ready["session"]
        self.fields: List[Dict[str, Any]] = ready["fields"]
        self.batches_per_epoch: int = ready["batches"]
        # A whole epoch's batches for this rank (an older server says only those left).
        self.epoch_batches: int = int(ready.get("epoch_batches", ready["batches"]))
        # The counts are estimates (no index): a job of one rank may get another
        # number of batches; every rank of a larger one gets batches_per_epoch.
        self.counts_estimated = bool(ready.get("estimated", False))
        self.samples_per_epoch: int = ready["samples"]
        self.current_epoch: int = ready["epoch"]
        self.order = ready.get("order")
        self.placement = ready.get("placement")
        self._state = _state_of(ready, "ready")
        self.last_end: Optional[Message] = None
        self._epoch_open = True

    # -- connection and messages --

    def _connect(self, sock: socket.socket) -> None:
        path = self.socket_path
        try:
            sock.connect(path)
        except FileNotFoundError:
            raise NoServer(f"no shardload server at {path}: there is no socket (start one with "
                           "'shardload serve', or set SHARDLOAD_SOCKET)") from None
        except ConnectionRefusedError:
            raise NoServer(f"no shardload server at {path}: nothing listens on the socket (the server "
                           "exited or was killed; start it again)") from None
        except PermissionError:
            raise PermissionDenied(f"no permission to connect to {path}: the server accepts its own user "
                                   "(and those given by --allow-uid)") from None
        except OSError as e:
            raise self._os_error(e, f"connecting to {path}") from None

    def _check_peer(self, sock: socket.socket, trust_uids: Optional[Iterable[int]]) -> None:
        """Refuse a server that runs as a user not trusted (see the class doc)."""
        if trust_uids is None:
            env = os.environ.get("SHARDLOAD_TRUST_UIDS", "")
            try:
                trust_uids = [int(u) for u in env.split(",") if u.strip()]
            except ValueError:
                raise ShardloadError(f"SHARDLOAD_TRUST_UIDS={env!r}: want comma-separated uids") from None
        try:
            creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        except OSError as e:
            raise self._os_error(e, "reading the server's credentials") from None
        pid, uid, _ = struct.unpack("3i", creds)
        trusted = {os.getuid(), 0, *trust_uids}
        if uid not in trusted:
            raise UntrustedServer(
                f"the server at {self.socket_path} runs as uid {uid} (pid {pid}), not as this user "
                f"(uid {os.getuid()}) or root: refusing to talk to it (another user may have taken "
                "the socket's place); pass trust_uids=[...] or set SHARDLOAD_TRUST_UIDS to trust it")

    def _os_error(self, e: OSError, doing: str) -> ShardloadError:
        """The client's error for an OSError of the socket."""
        if isinstance(e, (socket.timeout, TimeoutError)):
            return Timeout(f"no answer from the shardload server at {self.socket_path} within "
                           f"{self.timeout}s while {doing}")
        if isinstance(e, (ConnectionResetError, BrokenPipeError, ConnectionAbortedError)):
            return ServerGone(f"the shardload server at {self.socket_path} closed the connection "
                              f"(it stopped or crashed) while {doing}: {e}")
        return ShardloadError(f"{doing}: {e}")

    def _send(self, obj: Message) -> None:
        if self._sock is None:
            raise ShardloadError("the client is closed")
        try:
            self._sock.send(json.dumps(obj).encode())
        except OSError as e:
            if isinstance(e, (ConnectionResetError, BrokenPipeError)):
                self._last_word()
            raise self._os_error(e, f"sending {obj.get('type')}") from None

    def _last_word(self) -> None:
        """Raise the error message the server sent before it closed, if it sent one."""
        assert self._sock is not None  # _send's, which calls this
        try:
            self._sock.setblocking(False)
            while True:
                msg = self._sock.recv(MAX_MESSAGE + 1)
                if not msg:
                    return
                try:
                    obj = json.loads(msg)
                except ValueError:
                    continue
                if obj.get("type") == "error":
                    raise ServerError(obj.get("code", ""), obj.get("message", ""))
        except OSError:
            return

    def _decode(self, msg: bytes) -> Message:
        if not msg:
            raise ServerGone(f"the shardload server at {self.socket_path} closed the connection "
                             "(it stopped or crashed)")
        if len(msg) > MAX_MESSAGE:
            raise ProtocolError(f"message longer than {MAX_MESSAGE} bytes")
        try:
            obj = json.loads(msg)
        except ValueError as e:
            raise ProtocolError(f"unreadable message from the server: {e}") from None
        if not isinstance(obj, dict):
            raise ProtocolError(f"a message that is not a JSON object: {msg[:80]!r}")
        if obj.get("type") == "error":
            raise ServerError(obj.get("code", ""), obj.get("message", ""))
        return obj

    def _recv(self) -> Message:
        if self._sock is None:
            raise ShardloadError("the client is closed")
        try:
            msg = self._sock.recv(MAX_MESSAGE + 1)
        except OSError as e:
            raise self._os_error(e, "waiting for a message") from None
        return self._decode(msg)

    # -- the order check --

    def _check_order(self, timeout: float) -> None:
        k = next(_order_checks)
        order = self.order if isinstance(self.order, dict) else {}
        fp = order.get("fingerprint")
        want = os.environ.get("SHARDLOAD_EXPECT_ORDER")
        if want and fp != want:
            raise OrderMismatch(
                f"the shardload server at {self.socket_path} reads order {fp} but SHARDLOAD_EXPECT_ORDER "
                f"is {want}: its settings are {json.dumps(order.get('settings'))}")
        dist = _torch_distributed()
        if dist is None:
            return
        mine = {"fingerprint": fp, "job": order.get("job"), "settings": order.get("settings")}
        try:
            msg = self._compare_orders(dist, k, mine, timeout)
        except ShardloadError:
            raise
        except Exception as e:  # the store's errors differ between torch versions
            raise ShardloadError(f"comparing the ranks' shardload orders through torch.distributed: {e}") from None
        if msg:
            raise OrderMismatch(msg)

    def _compare_orders(self, dist: Any, k: int, mine: Dict[str, Any], timeout: float) -> str:
        """The mismatch this rank reports ("" for none). Every rank puts its order in
        the default store; rank 0 compares them all and puts its verdict there; the
        other ranks read rank 0's order and the verdict, so that every rank fails when
        any differs."""
        from datetime import timedelta
        rank, world = dist.get_rank(), dist.get_world_size()
        wait = timedelta(seconds=timeout)
        try:
            from torch.distributed import distributed_c10d as c10d
            store = c10d._get_default_store()  # type: ignore[no-untyped-call]
        except (ImportError, AttributeError):
            store = None
        if store is None:
            # No default store: every rank gathers every rank's order (gloo).
            group = dist.new_group(backend="gloo", timeout=wait)
            orders: List[Any] = [None] * world
            try:
                dist.all_gather_object(orders, mine, group=group)
            except RuntimeError as e:
                raise Timeout(f"gathering the ranks' shardload orders within {timeout}s (check_timeout) "
                              f"failed: {e}") from None
            return _order_verdict(orders, rank)
        key = f"shardload/order/{k}/"
        store.set(key + str(rank), json.dumps(mine))
        if rank == 0:
            keys = [key + str(r) for r in range(world)]
            try:
                store.wait(keys, wait)
            except Exception:  # the store's timeout error type differs between torch versions
                missing = [str(r) for r in range(world) if not _store_has(store, key + str(r))]
                text = (f"rank(s) {', '.join(missing)} did not report their shardload order within "
                        f"{timeout}s (check_timeout): did every rank create its shardload client, "
                        "with the order check on?")
                store.set(key + "verdict", json.dumps({"timeout": text}))
                raise Timeout(text) from None
            verdict = _order_verdict([json.loads(store.get(x)) for x in keys], 0)
            store.set(key + "verdict", json.dumps({"mismatch": verdict}))
            # The store lives in this process: keep it until every rank has read.
            try:
                store.wait([key + f"seen/{r}" for r in range(1, world)], wait)
            except Exception:
                pass
            return verdict
        try:
            store.wait([key + "0", key + "verdict"], wait)
        except Exception:
            raise Timeout(f"rank 0 did not compare the ranks' shardload orders within {timeout}s "
                          "(check_timeout): did it create its shardload client, with the order check on?") from None
        zero: Dict[str, Any] = json.loads(store.get(key + "0"))
        told: Dict[str, str] = json.loads(store.get(key + "verdict"))
        store.set(key + f"seen/{rank}", "1")
        if "timeout" in told:
            raise Timeout(told["timeout"])
        if _job(zero) != _job(mine):
            return _order_difference(rank, mine, 0, zero)
        return told.get("mismatch", "")

    # -- slabs and their lifetime --

    def _refs(self, i: int) -> int:
        return sys.getrefcount(self._maps[i])

    def _referenced(self, i: int) -> bool:
        """Whether anything besides this client references slab i's mapping: a view of
        the batch in it, or a view derived from one (which keeps its base alive)."""
        return self._refs(i) > self._base_refs

    def _detach(self, i: int, used: Optional[int], fresh: bool = True) -> None:
        """Copy the batch in slab i into private memory at the slab's address (its views
        keep working), and map the slab afresh for the next batch."""
        t0 = time.perf_counter()
        addr, size = self._addrs[i], self._sizes[i]
        used = size if used is None else used
        for h in self._slab_hooks:
            h.slab_unmapping(i, addr, size)
        _mem.detach(addr, size, used)
        if fresh:
            # The old mmap object now owns the private copy: the views keep it alive.
            self._maps[i], self._addrs[i], self._pads[i] = _mem.map_fd(self._fds[i], size)
            for h in self._slab_hooks:
                h.slab_mapped(i, self._addrs[i], size)
        self.stats["detached"] += 1
        self.stats["detached_bytes"] += used
        self.stats["detach_seconds"] += time.perf_counter() - t0

    def _send_release(self, b: Batch) -> None:
        self._send({"type": "release", "slab": b._slab, "seq": b.seq, "epoch": b.epoch,
                    "wait": round(self.stats["wait_seconds"], 6)})
        self.stats["released"] += 1

    def _release_batch(self, b: Batch) -> None:
        """Batch.release: give the slab back now if nothing references the batch's
        views, else once they are gone or copied (see _settle)."""
        if b.released:
            return
        b._drop()
        if self._held.get(b._slab) is b:
            del self._held[b._slab]
        if self.closed or os.getpid() != self._pid:
            return
        if self._referenced(b._slab):
            b._mark = self._takes
            self._pending.append(b)
            self.stats["deferred"] += 1
        else:
            self._send_release(b)

    def _settle(self, force: bool = False, which: Optional[Callable[[Batch], bool]] = None) -> None:
        """Hand back the deferred batches: those deferred before the latest batch was
        taken (all of them with force; only those which(batch) accepts, if given): free
        ones as they are, the others after a detach."""
        for b in list(self._pending):
            if which is not None and not which(b):
                continue
            if not force and b._mark >= self._takes:
                continue
            self._pending.remove(b)
            if self._referenced(b._slab):
                self._detach(b._slab, b._used)
            self._send_release(b)

    def _batch(self, msg: Message) -> Batch:
        try:
            return self._batch_of(msg)
        except (KeyError, TypeError, ValueError) as e:
            raise ProtocolError(f"a batch message this client cannot read ({type(e).__name__}: {e})") from None

    def _grow(self, i: int, size: int) -> None:
        """Map slab i again at size bytes: the server grew it for a larger batch. The
        slab holds no batch of this client (it was released, so nothing references its
        mapping, or it was copied out and mapped afresh)."""
        if self._referenced(i):
            self._detach(i, self._used[i])  # never expected; keeps the views valid if it happens
        for h in self._slab_hooks:
            h.slab_unmapping(i, self._addrs[i], self._sizes[i])
        old = self._maps[i]
        self._maps[i], self._addrs[i], self._pads[i] = _mem.map_fd(self._fds[i], size)
        self._sizes[i] = size
        try:
            old.close()
        except BufferError:
            pass
        for h in self._slab_hooks:
            h.slab_mapped(i, self._addrs[i], size)
        if not self._grew:
            self._grew = True
            warnings.warn(ShardloadWarning(
                f"shardload: a batch did not fit the slabs of {self.slab_bytes} bytes: the server grew them "
                f"(to {size} bytes so far); pass slab_bytes= to size them up front"), stacklevel=4)

    def _batch_of(self, msg: Message) -> Batch:
        i = msg["slab"]
        if not 0 <= i < len(self._maps):
            raise ProtocolError(f"batch in slab {i} of {len(self._maps)}")
        size = int(msg.get("slab_bytes", 0) or self._sizes[i])
        if size > self._sizes[i]:
            self._grow(i, size)
        if "backpressure" in msg:
            self.stats["backpressure_seconds"] = float(msg["backpressure"])
        pad = self._pads[i]
        ro = memoryview(self._maps[i])[pad:pad + self._sizes[i]].toreadonly()
        rows = msg["rows"]
        cols: Dict[str, Column] = {}
        keys = None
        if self._torch is not None:
            with _NoWritableWarning():
                for col in msg["columns"]:
                    if col["name"] == "__key__":
                        keys = self._view(ro, col, rows, key=True)
                    else:
                        cols[col["name"]] = self._view(ro, col, rows)
        else:
            for col in msg["columns"]:
                if col["name"] == "__key__":
                    keys = self._view(ro, col, rows, key=True)
                else:
                    cols[col["name"]] = self._view(ro, col, rows)
        b = Batch(self, msg, cols, keys, _state_of(msg, "batch"))
        self._held[i] = b
        self._used[i] = b._used
        return b

    def _view(self, ro: memoryview, col: Dict[str, Any], rows: int, key: bool = False) -> Column:
        off, length = col["offset"], col["length"]
        np = self._np
        torch = None if key else self._torch
        if col["ragged"]:
            o = col["offsets_offset"]
            if np is not None:
                data = np.frombuffer(ro, np.uint8, length, off)
                offsets = np.frombuffer(ro, "<i8", rows + 1, o)
                if torch is not None:
                    data, offsets = torch.from_numpy(data), torch.from_numpy(offsets)
            else:
                data = ro[off:off + length]
                offsets = ro[o:o + 8 * (rows + 1)].cast("q")
            return Ragged(data, offsets, col["kind"])
        shape = tuple(col["shape"])
        if np is not None:
            dt = np.dtype(col["dtype"])
            arr = np.frombuffer(ro, dt, length // dt.itemsize if dt.itemsize else 0, off).reshape(shape)
            if torch is not None and _torch_ok(arr):
                return torch.from_numpy(arr)
            return arr
        fmt = _FORMATS.get(col["dtype"])
        view = ro[off:off + length]
        return view.cast(fmt, shape) if fmt else view

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
                self._settle()
                if self._draining is not None:
                    self._drain()
                if not self._epoch_open:
                    return
                if self._pending and len(self._held) + len(self._pending) >= len(self._maps):
                    self._settle(force=True)  # the server has no slab left to fill
                t0 = time.perf_counter()
                msg = self._recv()
                self.stats["wait_seconds"] += time.perf_counter() - t0
                t = msg.get("type")
                if t == "end":
                    if msg.get("epoch") != self.current_epoch:
                        raise ProtocolError(f"end of epoch {msg.get('epoch')} while reading epoch {self.current_epoch}")
                    self._epoch_open = False
                    self._ended(msg)
                    end = _state_of(msg, "end")
                    if end is not None:
                        self._state = _epoch_start(end["epoch"] + 1, end)
                    return
                if t != "batch":
                    raise ProtocolError(f"unexpected message {t!r} during an epoch")
                if msg.get("epoch") != self.current_epoch:
                    raise ProtocolError(f"batch of epoch {msg.get('epoch')} while reading epoch {self.current_epoch}")
                b = self._batch(msg)
                self._takes += 1
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
        return self.batches()

    def _ended(self, msg: Message) -> None:
        """Note an epoch's end message (last_end, last_epoch), and warn when an epoch
        planned from estimated counts left samples out or repeated some."""
        self.last_end = msg
        e: EpochEnd = {
            "epoch": int(msg.get("epoch", 0)), "batches": int(msg.get("batches", 0)),
            "samples": int(msg.get("samples", 0)), "padded": int(msg.get("padded", 0)),
            "left_out": int(msg.get("trimmed", 0)), "skipped": int(msg.get("skipped", 0)),
            "estimated": bool(msg.get("estimated", False)), "abandoned": bool(msg.get("abandoned", False)),
        }
        self.last_epoch = e
        if e["estimated"] and not e["abandoned"] and (e["padded"] or e["left_out"]):
            warnings.warn(ShardloadWarning(
                f"shardload: epoch {e['epoch']} of rank {self.rank} was planned from sample counts estimated "
                f"from the shards' sizes (no index): {e['left_out']} samples were left out and {e['padded']} "
                f"rows repeat other samples; for exact epochs write an index once (shardload index --output "
                f"DIR/ URL...) or pass count_first=True"), stacklevel=3)

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
        self._settle(force=True, which=lambda b: not keep(b))
        msg: Message = {"type": "epoch", "epoch": n}
        if state is not None:
            msg["state"] = state
        self._send(msg)
        self._pending_state = None
        self._state = state if state is not None else _epoch_start(n, self._state)
        self.current_epoch = n
        self._epoch_open = True
        self._draining = old if abandon else None
        return self.batches(auto_release)

    def _drain(self) -> None:
        """Read up to the end of the epoch being abandoned, dropping its batches."""
        e = self._draining
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
        self._ended(msg)
        if not msg.get("abandoned"):
            # The epoch had ended before the server read the epoch message: it gave
            # back nothing, and the batches dropped here are this client's to release.
            for m in late:
                self._send({"type": "release", "slab": m["slab"], "seq": m["seq"], "epoch": e})
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
            for fd in self._fds:
                os.close(fd)  # this process's copies of the descriptors
            self._maps, self._addrs, self._pads, self._fds, self._held, self._pending = [], [], [], [], {}, []
            self._sizes = []
            return
        if self._sock is not None:
            try:
                self._sock.send(json.dumps({"type": "bye"}).encode())
            except OSError:
                pass
            self._sock.close()
            self._sock = None
        for b in list(self._held.values()) + self._pending:
            b._drop()
        self._held, self._pending = {}, []
        for i in range(len(self._maps)):
            if self._referenced(i):
                try:
                    self._detach(i, self._used[i], fresh=False)
                except OSError:
                    pass  # the mapping stays as it is, valid while referenced
            else:
                for h in self._slab_hooks:
                    h.slab_unmapping(i, self._addrs[i], self._sizes[i])
                try:
                    self._maps[i].close()
                except BufferError:
                    pass
        self._maps, self._addrs, self._pads, self._sizes = [], [], [], []
        for fd in self._fds:
            os.close(fd)
        self._fds = []

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
        return [(a, n) for a, n in zip(self._addrs, self._sizes)]

    def add_slab_hook(self, hook: SlabHook) -> None:
        """Tell hook when a slab's mapping changes: hook.slab_unmapping(i, addr, size)
        before the memory at addr stops being slab i's (a detach, or close), and
        hook.slab_mapped(i, addr, size) when slab i is mapped afresh at addr."""
        self._slab_hooks.append(hook)


def connect(socket_path: Optional[str] = None, **kwargs: Any) -> Client:
    """Connect to a shardload server; see Client."""
    return Client(socket_path, **kwargs)
