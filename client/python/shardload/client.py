"""The trainer side of the shardload loader process (protocol: docs/protocol.md).

Only the standard library is needed; with NumPy installed, columns are zero-copy
numpy arrays, and with PyTorch, zero-copy tensors.
"""

import json
import mmap
import os
import socket
import tempfile

PROTOCOL_VERSION = 1
MAX_MESSAGE = 64 << 10
_MAX_FDS = 253
CLIENT_NAME = "shardload-python/0.1.0"


class ShardloadError(Exception):
    """Base class of the client's errors."""


class ServerError(ShardloadError):
    """The server ended the session and said why (``code`` and ``message``)."""

    def __init__(self, code, message):
        super().__init__(f"shardload server: {message} ({code})")
        self.code = code
        self.message = message


class ServerGone(ShardloadError):
    """The server closed the connection without a word: it stopped or crashed."""


class ProtocolError(ShardloadError):
    """The server sent something this client cannot read."""


def default_socket():
    """The socket path ``shardload serve`` uses by default: $SHARDLOAD_SOCKET, else
    $XDG_RUNTIME_DIR/shardload/loader.sock, else /tmp/shardload-UID/loader.sock."""
    path = os.environ.get("SHARDLOAD_SOCKET")
    if path:
        return path
    run = os.environ.get("XDG_RUNTIME_DIR")
    if run:
        return os.path.join(run, "shardload", "loader.sock")
    return os.path.join(tempfile.gettempdir(), f"shardload-{os.getuid()}", "loader.sock")


def _env_int(name, default):
    v = os.environ.get(name)
    return int(v) if v not in (None, "") else default


# Struct format characters for NumPy descrs, used without NumPy (memoryview.cast).
_FORMATS = {
    "|b1": "?", "|i1": "b", "<i2": "h", "<i4": "i", "<i8": "q", "|u1": "B",
    "<u2": "H", "<u4": "I", "<u8": "Q", "<f2": "e", "<f4": "f", "<f8": "d",
}


def _numpy():
    try:
        import numpy
    except ImportError:
        return None
    return numpy


class Ragged:
    """A variable-length column: ``len(r)`` rows, row i is ``data[offsets[i]:offsets[i+1]]``.

    ``data`` is a uint8 array (a memoryview without NumPy) and ``offsets`` an int64
    array of rows+1 entries. Rows are zero-copy views, valid until the batch is
    released; ``tolist()`` copies them out as bytes (str for text columns).
    """

    __slots__ = ("data", "offsets", "kind")

    def __init__(self, data, offsets, kind):
        self.data = data
        self.offsets = offsets
        self.kind = kind

    def __len__(self):
        return len(self.offsets) - 1

    def __getitem__(self, i):
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"row {i} of a column of {n}")
        return self.data[int(self.offsets[i]):int(self.offsets[i + 1])]

    def __iter__(self):
        for i in range(len(self)):
            yield self[i]

    def tolist(self):
        rows = [bytes(self[i]) for i in range(len(self))]
        if self.kind in ("text", "json"):
            return [r.decode("utf-8") for r in rows]
        return rows

    def copy(self):
        """A Ragged that owns its data (of the same array type)."""
        return Ragged(_copy_array(self.data), _copy_array(self.offsets), self.kind)


def _copy_array(a):
    if hasattr(a, "clone"):  # a torch tensor
        return a.clone()
    if isinstance(a, memoryview):
        return memoryview(a.tobytes()).cast(a.format, a.shape)
    return a.copy()  # numpy


class Batch:
    """One batch: columns by field name (``batch["jpg"]``), ``keys`` (the samples'
    keys), ``epoch``, ``seq`` and ``padded`` (rows repeating earlier samples to keep
    every rank's batch count when samples were skipped).

    Columns are views into a shared slab: valid until ``release()``, which the
    iterator calls when the next batch is asked for (unless iterating with
    ``auto_release=False``). ``copy()`` returns a batch that owns its data.
    """

    def __init__(self, client, msg, columns, keys):
        self._client = client
        self._slab = msg["slab"]
        self.epoch = msg["epoch"]
        self.seq = msg["seq"]
        self.rows = msg["rows"]
        self.padded = msg.get("padded", 0)
        self.columns = columns
        self._keys = keys
        self.released = False

    @property
    def keys(self):
        """The samples' keys, in row order (a list of str)."""
        if isinstance(self._keys, Ragged):
            self._keys = self._keys.tolist()
        return self._keys

    def __getitem__(self, name):
        return self.columns[name]

    def __contains__(self, name):
        return name in self.columns

    def __iter__(self):
        return iter(self.columns)

    def items(self):
        return self.columns.items()

    def to_dict(self):
        """The columns as a dict, plus "__key__": the keys."""
        d = dict(self.columns)
        d["__key__"] = self.keys
        return d

    def copy(self):
        """A copy that owns its memory and needs no release."""
        cols = {}
        for name, col in self.columns.items():
            cols[name] = col.copy() if isinstance(col, Ragged) else _copy_array(col)
        b = Batch(None, {"slab": -1, "epoch": self.epoch, "seq": self.seq, "rows": self.rows,
                         "padded": self.padded}, cols, list(self.keys))
        b.released = True
        return b

    def release(self):
        """Hand the slab back to the server; idempotent."""
        if self.released:
            return
        if isinstance(self._keys, Ragged):
            self._keys = self._keys.copy()  # the keys outlive the slab's reuse
        self.released = True
        if self._client is not None:
            self._client._release(self._slab, self.seq)


class Client:
    """A connection to ``shardload serve``: one trainer rank's pipeline.

    Settings default to what torchrun sets: rank from $RANK, world from $WORLD_SIZE,
    local rank from $LOCAL_RANK; the socket from $SHARDLOAD_SOCKET (see
    default_socket). ``fields`` are field specs as ``shardload bench --field`` takes
    them (e.g. ``["jpg", "label=cls:int", "tokens=npy:npy:int32:2048"]``); without
    them the server's fields are used. ``urls`` names the shards (the server must
    allow them); without them the server's dataset is read. ``output`` is
    "numpy" (default when NumPy is installed), "torch" or "memoryview".

    Iterating over the client yields the batches of its current epoch; ``epoch(n)``
    starts epoch n on the same slabs.
    """

    def __init__(self, socket_path=None, *, rank=None, world=None, local_rank=None,
                 seed=0, epoch=0, batch_size=32, fields=None, urls=None,
                 drop_last=False, output=None, timeout=None):
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
        self._torch = None
        if output == "torch":
            import torch
            self._torch = torch
        self.output = output
        self._maps = []
        self._sock = None
        self._pending = None  # the batch auto-released on the next step
        self._epoch_open = False
        self.closed = False
        hello = {
            "type": "hello", "version": PROTOCOL_VERSION, "rank": self.rank, "world": self.world,
            "local_rank": self.local_rank, "seed": seed, "epoch": epoch, "batch_size": batch_size,
            "drop_last": drop_last, "client": CLIENT_NAME,
        }
        if fields:
            hello["fields"] = list(fields)
        if urls:
            hello["urls"] = list(urls)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            sock.settimeout(timeout)
            try:
                sock.connect(self.socket_path)
            except FileNotFoundError:
                raise ShardloadError(f"no shardload server at {self.socket_path} (start one with "
                                     "'shardload serve', or set SHARDLOAD_SOCKET)") from None
            except PermissionError:
                raise ShardloadError(f"no permission to connect to {self.socket_path}: the server "
                                     "accepts its own user (and those given by --allow-uid)") from None
            self._sock = sock
            self._send(hello)
            msg, fds, flags, _ = socket.recv_fds(sock, MAX_MESSAGE + 1, _MAX_FDS)
        except BaseException:
            sock.close()
            self._sock = None
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
            if len(fds) != ready["slabs"]:
                raise ProtocolError(f"the server announced {ready['slabs']} slabs but passed {len(fds)} descriptors")
            self.slab_bytes = ready["slab_bytes"]
            for fd in fds:
                self._maps.append(mmap.mmap(fd, self.slab_bytes, flags=mmap.MAP_SHARED,
                                            prot=mmap.PROT_READ | mmap.PROT_WRITE))
        except BaseException:
            self.close()
            raise
        finally:
            for fd in fds:
                os.close(fd)
        self.session = ready["session"]
        self.fields = ready["fields"]
        self.batches_per_epoch = ready["batches"]
        self.samples_per_epoch = ready["samples"]
        self.current_epoch = ready["epoch"]
        self.last_end = None
        self._epoch_open = True

    # -- messages --

    def _send(self, obj):
        try:
            self._sock.send(json.dumps(obj).encode())
        except (BrokenPipeError, ConnectionResetError) as e:
            self._last_word()
            raise ServerGone(f"the shardload server at {self.socket_path} closed the connection "
                             f"(it stopped or crashed): {e}") from None

    def _last_word(self):
        """Raise the error message the server sent before it closed, if it sent one."""
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
        except (BlockingIOError, OSError):
            return

    def _decode(self, msg):
        if not msg:
            raise ServerGone(f"the shardload server at {self.socket_path} closed the connection "
                             "(it stopped or crashed)")
        if len(msg) > MAX_MESSAGE:
            raise ProtocolError(f"message longer than {MAX_MESSAGE} bytes")
        try:
            obj = json.loads(msg)
        except ValueError as e:
            raise ProtocolError(f"unreadable message from the server: {e}") from None
        if obj.get("type") == "error":
            raise ServerError(obj.get("code", ""), obj.get("message", ""))
        return obj

    def _recv(self):
        try:
            msg = self._sock.recv(MAX_MESSAGE + 1)
        except ConnectionResetError as e:
            raise ServerGone(f"the shardload server at {self.socket_path} reset the connection: {e}") from None
        return self._decode(msg)

    def _release(self, slab, seq):
        if self._sock is not None:
            self._send({"type": "release", "slab": slab, "seq": seq})

    # -- batches --

    def _view(self, mm, col, rows, key=False):
        off, length = col["offset"], col["length"]
        np = self._np
        if col["ragged"]:
            if np is not None:
                data = np.ndarray((length,), dtype=np.uint8, buffer=mm, offset=off)
                offsets = np.ndarray((rows + 1,), dtype="<i8", buffer=mm, offset=col["offsets_offset"])
                if self._torch is not None and not key:
                    data = self._torch.from_numpy(data)
                    offsets = self._torch.from_numpy(offsets)
            else:
                data = memoryview(mm)[off:off + length]
                o = col["offsets_offset"]
                offsets = memoryview(mm)[o:o + 8 * (rows + 1)].cast("q")
            return Ragged(data, offsets, col["kind"])
        shape = tuple(col["shape"])
        if np is not None:
            arr = np.ndarray(shape, dtype=np.dtype(col["dtype"]), buffer=mm, offset=off)
            # PyTorch has no uint16/32/64 tensors: those columns stay numpy arrays.
            if self._torch is not None and (arr.dtype.kind != "u" or arr.dtype.itemsize == 1):
                return self._torch.from_numpy(arr)
            return arr
        fmt = _FORMATS.get(col["dtype"])
        view = memoryview(mm)[off:off + length]
        return view.cast(fmt, shape) if fmt else view

    def _batch(self, msg):
        mm = self._maps[msg["slab"]]
        rows = msg["rows"]
        cols = {}
        keys = None
        for col in msg["columns"]:
            if col["name"] == "__key__":
                keys = self._view(mm, col, rows, key=True)
            else:
                cols[col["name"]] = self._view(mm, col, rows)
        return Batch(self, msg, cols, keys)

    def batches(self, auto_release=True):
        """Yield the batches of the current epoch. With auto_release, each batch is
        released when the next is asked for (and the last when the epoch ends);
        otherwise the caller releases each (the slabs are few: hold too many and the
        server waits)."""
        if self.closed:
            raise ShardloadError("client closed")
        if not self._epoch_open:
            raise ShardloadError(f"epoch {self.current_epoch} was read already: call epoch(n) for another")
        try:
            while True:
                msg = self._recv()
                t = msg.get("type")
                if t == "end":
                    self._epoch_open = False
                    self.last_end = msg
                    return
                if t != "batch":
                    raise ProtocolError(f"unexpected message {t!r} during an epoch")
                b = self._batch(msg)
                if auto_release:
                    self._pending = b
                yield b
                if auto_release:
                    b.release()
                    self._pending = None
        finally:
            if auto_release and self._pending is not None and not self.closed:
                try:
                    self._pending.release()
                except ShardloadError:
                    pass
                self._pending = None

    def __iter__(self):
        return self.batches()

    def epoch(self, n, auto_release=True):
        """Start epoch n (after the current one was read to its end) and yield its batches."""
        if self._epoch_open:
            raise ShardloadError(f"epoch {self.current_epoch} is still being read")
        self._send({"type": "epoch", "epoch": n})
        self.current_epoch = n
        self._epoch_open = True
        return self.batches(auto_release)

    def close(self):
        """Say goodbye and unmap the slabs; batches still in use keep their slab mapped
        until they are gone. Idempotent."""
        if self.closed:
            return
        self.closed = True
        if self._sock is not None:
            try:
                self._sock.send(json.dumps({"type": "bye"}).encode())
            except OSError:
                pass
            self._sock.close()
            self._sock = None
        for mm in self._maps:
            try:
                mm.close()
            except BufferError:
                pass  # views still exist; the mapping goes with them
        self._maps = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def slab_addresses(self):
        """(address, size) of each mapped slab, e.g. to register them with CUDA."""
        import ctypes
        out = []
        for mm in self._maps:
            buf = (ctypes.c_char * self.slab_bytes).from_buffer(mm)
            out.append((ctypes.addressof(buf), self.slab_bytes))
            del buf
        return out


def connect(socket_path=None, **kwargs):
    """Connect to a shardload server; see Client."""
    return Client(socket_path, **kwargs)
