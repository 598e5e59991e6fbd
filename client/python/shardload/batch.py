"""Batches: the column views of a batch message over its slab's bytes (batch_views),
Batch and Ragged.

Every view of a batch is made from an export of the batch's own memoryview of its
slab (``_export``): a numpy array, a torch tensor or a memoryview, and every view
derived from one (a slice, a Ragged row, a tensor of an array), holds that export
until it dies. The memoryview's ``release()`` therefore succeeds exactly when no view
of the batch is alive; shardload.slabs relies on it to decide whether a slab goes
back as it is or after a copy.
"""

from __future__ import annotations

import pickle
import warnings
from types import ModuleType
from typing import (TYPE_CHECKING, Any, Callable, Dict, ItemsView, Iterable, Iterator, List, Literal, Optional,
                    Tuple, Union, cast)

from .errors import ShardloadError
from .messages import BatchMessage, ColumnInfo, State

if TYPE_CHECKING:  # optional at run time
    import numpy

# What Client's output may be.
Output = Literal["numpy", "torch", "memoryview"]

# A column of a batch: a numpy array, a torch tensor or a memoryview (by the client's
# output), or a Ragged of those for variable-length fields. Typed Any: which one comes
# is decided at run time.
Column = Any


class Columns(Dict[str, Any]):
    """A batch's columns by name (a dict), as to_dict() and to_torch() return them and
    ShardloadDataset yields them: a name that is not a column raises a KeyError that
    lists the names that are (``no column 'lable'; columns: jpg, label, __key__``)."""

    def __missing__(self, name: Any) -> Any:
        raise KeyError(no_column(name, self))


def no_column(name: Any, names: Iterable[str]) -> str:
    """The message of a KeyError for a name that is not one of a batch's columns."""
    return f"no column {name!r}; columns: {', '.join(names)}"


# Struct format characters for NumPy descrs, used without NumPy (memoryview.cast).
_FORMATS: Dict[str, str] = {
    "|b1": "?", "|i1": "b", "<i2": "h", "<i4": "i", "<i8": "q", "|u1": "B",
    "<u2": "H", "<u4": "I", "<u8": "Q", "<f2": "e", "<f4": "f", "<f8": "d",
}


def numpy_module() -> Optional[ModuleType]:
    """numpy, or None when it is not installed."""
    try:
        import numpy
    except ImportError:
        return None
    return numpy


def output_modules(output: Optional[str]) -> Tuple[Output, Optional[ModuleType], Optional[ModuleType]]:
    """Client's output (default: "numpy" with NumPy installed, else "memoryview"), and
    the numpy and torch modules it uses (None: not used). Raises ValueError for
    another output, ImportError when its modules are missing."""
    np = numpy_module()
    if output is None:
        output = "numpy" if np is not None else "memoryview"
    if output not in ("numpy", "torch", "memoryview"):
        raise ValueError(f"output {output!r}: want numpy, torch or memoryview")
    if output in ("numpy", "torch") and np is None:
        raise ImportError(f"output={output!r} needs numpy")
    torch: Optional[ModuleType] = None
    if output == "torch":
        import torch
    return cast(Output, output), np, torch


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


def _export(buf: memoryview) -> memoryview:
    """A read-only memoryview of buf's bytes that holds an export of buf itself (one
    more in buf's export count) for as long as it, or any view derived from it, lives.

    Slicing buf, memoryview(buf) and np.asarray(buf) register with buf's underlying
    buffer, not with buf, and np.frombuffer and torch.frombuffer let go of the export
    they take at once: a view made that way would not keep buf.release() from
    succeeding. pickle.PickleBuffer takes a real export of buf, and the memoryview of
    it holds one for its lifetime (the PickleBuffer itself is dropped at once)."""
    return memoryview(pickle.PickleBuffer(buf))


def _view(buf: memoryview, col: ColumnInfo, rows: int, np: Any, torch: Any) -> Column:
    """One column's view over buf (see the module docstring)."""
    off, length = col["offset"], col["length"]
    own = _export(buf)  # this column's export of buf: every view below derives from it
    if col["ragged"]:
        o = col["offsets_offset"]
        if np is not None:
            data = np.frombuffer(own, np.uint8, length, off)
            offsets = np.frombuffer(own, "<i8", rows + 1, o)
            if torch is not None:
                data, offsets = torch.from_numpy(data), torch.from_numpy(offsets)
        else:
            data = own[off:off + length]
            offsets = own[o:o + 8 * (rows + 1)].cast("q")
        return Ragged(data, offsets, col["kind"])
    shape = tuple(col["shape"])
    if np is not None:
        dt = np.dtype(col["dtype"])
        arr = np.frombuffer(own, dt, length // dt.itemsize if dt.itemsize else 0, off).reshape(shape)
        if torch is not None and _torch_ok(arr):
            return torch.from_numpy(arr)
        return arr
    fmt = _FORMATS.get(col["dtype"])
    view = own[off:off + length]
    return view.cast(fmt, shape) if fmt else view


def batch_views(buf: memoryview, columns: List[ColumnInfo], rows: int, np: Optional[ModuleType],
                torch: Optional[ModuleType]) -> Tuple[Dict[str, Column], Optional[Ragged]]:
    """The columns of a batch (by name) and its key column, as zero-copy read-only
    views into buf: the batch's own memoryview of its slab (a read-only memoryview of
    a slab's bytes). numpy arrays with np, torch tensors with torch too (the key
    column, and columns of types torch lacks, stay numpy), memoryviews without np.
    Every view holds an export of buf (see the module docstring). Raises KeyError,
    TypeError or ValueError for columns it cannot read."""
    cols: Dict[str, Column] = {}
    keys: Optional[Ragged] = None
    if torch is not None:
        with _NoWritableWarning():
            for col in columns:
                if col["name"] == "__key__":
                    keys = _view(buf, col, rows, np, None)
                else:
                    cols[col["name"]] = _view(buf, col, rows, np, torch)
    else:
        for col in columns:
            if col["name"] == "__key__":
                keys = _view(buf, col, rows, np, None)
            else:
                cols[col["name"]] = _view(buf, col, rows, np, None)
    return cols, keys


class Ragged:
    """A variable-length column: ``len(r)`` rows, row i is ``data[offsets[i]:offsets[i+1]]``.

    ``data`` is a uint8 array (a memoryview without NumPy) and ``offsets`` an int64
    array of rows+1 entries. Rows are zero-copy, read-only views that stay valid and
    unchanged while referenced (see Batch); ``tolist()`` copies them out as bytes (str
    for text columns).
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


def _as_tensor(torch: Any, np: Any, x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return x
    if isinstance(x, memoryview):
        x = np.asarray(x)  # its base shares x's buffer, and so its export
    if not _torch_ok(x):
        return x
    return _from_numpy(torch, x)


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
    gives the slab back without a copy when they do not (see shardload.slabs). Do not
    write into them (torch tensors cannot be made read-only: no in-place ops on batch
    tensors).

    ``copy()`` returns a batch that owns its data; ``to_torch(copy=False)`` the columns
    as torch tensors.
    """

    def __init__(self, release: Optional[Callable[[Batch], None]], msg: BatchMessage, columns: Dict[str, Column],
                 keys: Any, state: Optional[State] = None, buf: Optional[memoryview] = None) -> None:
        # What release() calls with the batch: the client's, which gives its slab back
        # (see shardload.slabs); None for a batch that owns its data (copy()).
        self._release = release
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
        # The batch's own memoryview of its slab, which every view of it holds an
        # export of; shardload.slabs releases it, or leaves it to the views over a
        # private copy, and then sets it to None.
        self._buf = buf
        self._owned = release is None
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
        elif self._keys is None:
            self._keys = []  # packed rows: no samples, no keys
        return cast(List[str], self._keys)

    def __getitem__(self, name: str) -> Column:
        cols = self._data()
        try:
            return cols[name]
        except KeyError:
            raise KeyError(no_column(name, cols)) from None

    def __contains__(self, name: object) -> bool:
        return name in self._names

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def items(self) -> ItemsView[str, Column]:
        return self._data().items()

    def to_dict(self) -> Columns:
        """The columns as a dict (a Columns), plus "__key__": the keys."""
        d = Columns(self._data())
        d["__key__"] = self.keys
        return d

    def to_torch(self, copy: bool = False) -> Columns:
        """The columns as torch tensors (a dict, a Columns, plus "__key__": the keys), whatever the
        client's output. Ragged columns are Ragged of tensors; numpy columns of types
        torch lacks (uint16/32/64) stay numpy arrays. Without copy, the tensors are
        zero-copy views (read them, never write them); with copy=True, owned clones."""
        import torch
        np = numpy_module()
        out = Columns()
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
        msg: BatchMessage = {"type": "batch", "slab": -1, "epoch": self.epoch, "seq": self.seq, "rows": self.rows,
                             "padded": self.padded, "used": 0, "columns": []}
        return Batch(None, msg, cols, list(self.keys), None if self.state is None else self.state.copy())

    def release(self) -> None:
        """Hand the slab back to the server (see the class docstring); idempotent. A
        copy() needs no release: this does nothing to it."""
        if self.released or self._owned:
            return
        if self._release is not None:
            self._release(self)
        else:
            self._drop()

    def _drop(self) -> None:
        """Forget the columns; keep the keys (copied out of the slab)."""
        if isinstance(self._keys, Ragged):
            self._keys = self._keys.copy()
        self._columns = None
        self.released = True
