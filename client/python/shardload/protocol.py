"""The trainer protocol, version 4 (docs/protocol.md), as this client speaks it.

Each message is one packet of a unix SOCK_SEQPACKET socket: a UTF-8 JSON object of at
most MAX_MESSAGE bytes with a string member "type"; the ready message carries the
slabs' memfds (SCM_RIGHTS). The TypedDicts below are the messages with their members
(those a sender may leave out are NotRequired), as wire/messages.go writes and reads
them; wire/testdata/messages.json has one of each with every member set, and
client/python/tests/wire_check.py checks these types and hello_message against it.

The module needs only the standard library. It has no ``from __future__ import
annotations``: the TypedDicts' members are real types at run time, so that
``__required_keys__`` and ``typing.get_type_hints`` describe the messages.
"""

import json
import os
import socket
import sys
import tempfile
from typing import TYPE_CHECKING, Any, Dict, Iterable, List, Literal, Mapping, Optional, Tuple, cast

from .errors import ProtocolError, ServerError, ServerGone

if sys.version_info >= (3, 11):
    from typing import NotRequired, TypedDict
elif TYPE_CHECKING:
    from typing_extensions import NotRequired, TypedDict
else:  # Python 3.9 and 3.10: typing_extensions when installed
    try:
        from typing_extensions import NotRequired, TypedDict
    except ImportError:
        from typing import TypedDict

        class _NotRequired:
            """NotRequired[T] is T: the messages' types stay usable, but their
            __required_keys__ then name every member."""

            def __getitem__(self, tp: Any) -> Any:
                return tp

        NotRequired = _NotRequired()

PROTOCOL_VERSION = 4
MAX_MESSAGE = 64 << 10
MAX_FDS = 253  # the most descriptors one SCM_RIGHTS message carries on Linux
CLIENT_NAME = "shardload-python/0.4.0"

# The settings (version 4) a hello may carry as members of its own, each overriding
# the server's: the Client's (and hello_message's) keyword arguments of those names.
SETTINGS: Tuple[str, ...] = ("allow_estimate", "count_first", "slab_bytes", "slabs", "shuffle",
                             "shuffle_buffer", "shuffle_bytes", "open_shards", "read_gap")


class State(TypedDict):
    """A position in the loader's order (the Go library's shardload.State), as
    Client.state_dict() returns it: a plain dict of ints and strings."""

    epoch: int
    order: str
    samples: int
    runs: str
    batches: int


class HelloMessage(TypedDict):
    """The client's first message. The settings (SETTINGS) are members of the hello
    itself; a false allow_estimate or count_first is left out."""

    type: Literal["hello"]
    version: int
    rank: int
    world: int
    local_rank: int
    seed: int
    epoch: int
    batch_size: int
    drop_last: bool
    fields: NotRequired[List[str]]
    urls: NotRequired[List[str]]
    client: NotRequired[str]
    gpu_pci: NotRequired[str]
    cuda_visible_devices: NotRequired[str]
    state: NotRequired[State]
    image_layout: NotRequired[str]
    allow_estimate: NotRequired[bool]
    count_first: NotRequired[bool]
    slab_bytes: NotRequired[int]
    slabs: NotRequired[int]
    shuffle: NotRequired[bool]
    shuffle_buffer: NotRequired[int]
    shuffle_bytes: NotRequired[int]
    open_shards: NotRequired[int]
    read_gap: NotRequired[int]
    streams: NotRequired[List["StreamSpec"]]
    epoch_samples: NotRequired[int]
    batching: NotRequired[str]


class StreamSpec(TypedDict):
    """One stream of a mix, as the hello carries it: its URLs or patterns, and its
    weight (share of each epoch), or repeat (times its samples per epoch) or choose
    (samples per epoch)."""

    urls: List[str]
    weight: NotRequired[float]
    repeat: NotRequired[float]
    choose: NotRequired[int]


class StreamEnd(TypedDict):
    """What an epoch read of one stream of a mix: samples, bytes read, samples
    skipped."""

    samples: int
    bytes: int
    skipped: int


class FieldInfo(TypedDict):
    """A field the session decodes (the ready's fields)."""

    name: str
    ext: str
    kind: str
    dtype: NotRequired[str]
    shape: NotRequired[List[int]]


class OrderSettings(TypedDict):
    """The settings that decide an epoch's order and rank split."""

    dataset: str
    shards: int
    samples: int
    seed: int
    epoch: int
    world: int
    batch_size: int
    drop_last: bool
    shuffle: bool
    lanes: int
    window: int
    runs: str
    split: NotRequired[str]
    mix: NotRequired[str]


class OrderInfo(TypedDict):
    """The order of the session's first epoch (Client.order): fingerprint is the order
    of the samples (a state's order), job a digest of every setting."""

    fingerprint: str
    job: NotRequired[str]
    settings: OrderSettings


class Placement(TypedDict):
    """Where the session's pipeline runs (Client.placement)."""

    gpu: int
    pci: str
    node: int
    cpus: str
    reason: str


class ReadyMessage(TypedDict):
    """The answer to a hello; the slabs' memfds travel with it."""

    type: Literal["ready"]
    version: int
    session: int
    slabs: int
    slab_bytes: int
    fields: List[FieldInfo]
    epoch: int
    batches: int
    samples: int
    estimated: NotRequired[bool]
    shards: int
    order: OrderInfo
    placement: Placement
    state: NotRequired[State]
    epoch_batches: NotRequired[int]


class ColumnInfo(TypedDict):
    """One column of a batch: where it lies in the slab (see batch.batch_views)."""

    name: str
    kind: str
    dtype: str
    shape: List[int]
    offset: int
    length: int
    ragged: bool
    offsets_offset: int


class BatchMessage(TypedDict):
    """A batch is ready in a slab."""

    type: Literal["batch"]
    epoch: int
    seq: int
    slab: int
    rows: int
    padded: int
    used: int
    columns: List[ColumnInfo]
    state: NotRequired[State]
    slab_bytes: NotRequired[int]
    backpressure: NotRequired[float]


class ReleaseMessage(TypedDict):
    """The client hands a slab back."""

    type: Literal["release"]
    slab: int
    seq: int
    epoch: int
    wait: NotRequired[float]


class EndMessage(TypedDict):
    """An epoch's end: after its last batch, or early when the trainer abandoned it."""

    type: Literal["end"]
    epoch: int
    batches: int
    samples: int
    skipped: int
    padded: int
    abandoned: bool
    trimmed: NotRequired[int]
    estimated: NotRequired[bool]
    streams: NotRequired[List[StreamEnd]]
    state: NotRequired[State]


class EpochMessage(TypedDict):
    """The client asks for another epoch (abandoning the current one if not ended)."""

    type: Literal["epoch"]
    epoch: int
    state: NotRequired[State]


class ByeMessage(TypedDict):
    """The client's goodbye."""

    type: Literal["bye"]


class ErrorMessage(TypedDict):
    """Why the server ends the session."""

    type: Literal["error"]
    code: str
    message: str


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
    streams: List[StreamEnd]


def epoch_end(msg: EndMessage) -> EpochEnd:
    """What an end message says of its epoch, members left out read as zero."""
    return {
        "epoch": int(msg.get("epoch", 0)), "batches": int(msg.get("batches", 0)),
        "samples": int(msg.get("samples", 0)), "padded": int(msg.get("padded", 0)),
        "left_out": int(msg.get("trimmed", 0)), "skipped": int(msg.get("skipped", 0)),
        "estimated": bool(msg.get("estimated", False)), "abandoned": bool(msg.get("abandoned", False)),
        "streams": [{"samples": int(s.get("samples", 0)), "bytes": int(s.get("bytes", 0)),
                     "skipped": int(s.get("skipped", 0))} for s in msg.get("streams") or []],
    }


# Any message as decode() returns it: a JSON object, read as one of the TypedDicts
# once its type is known.
Message = Dict[str, Any]

# The messages by type.
MESSAGES: Dict[str, Any] = {
    "hello": HelloMessage, "ready": ReadyMessage, "batch": BatchMessage, "release": ReleaseMessage,
    "end": EndMessage, "epoch": EpochMessage, "bye": ByeMessage, "error": ErrorMessage,
}

BYE: ByeMessage = {"type": "bye"}


def hello_message(*, rank: int, world: int, local_rank: int, seed: int, epoch: int, batch_size: int,
                  drop_last: bool, fields: Optional[Iterable[str]] = None, urls: Optional[Iterable[str]] = None,
                  image_layout: str = "hwc", state: Optional[State] = None, gpu_pci: Optional[str] = None,
                  cuda_visible_devices: Optional[str] = None, allow_estimate: bool = False,
                  count_first: bool = False, slab_bytes: Optional[int] = None, slabs: Optional[int] = None,
                  shuffle: Optional[bool] = None, shuffle_buffer: Optional[int] = None,
                  shuffle_bytes: Optional[int] = None, open_shards: Optional[int] = None,
                  read_gap: Optional[int] = None, streams: Optional[Iterable[Mapping[str, Any]]] = None,
                  epoch_samples: Optional[int] = None, batching: Optional[str] = None) -> HelloMessage:
    """The hello for the Client's settings (a pure function: Client passes its
    arguments, the GPU's PCI address it found and $CUDA_VISIBLE_DEVICES). Settings left
    None, and a false allow_estimate or count_first, are left out: the server's hold.
    cuda_visible_devices is sent when it is a list the server takes. Raises ValueError
    for an image_layout other than "chw" and "hwc", and for a setting that is not a
    non-negative int, and for streams that are not a list of {"urls": ..., "weight" or
    "repeat" or "choose": ...}."""
    hello: Message = {
        "type": "hello", "version": PROTOCOL_VERSION, "rank": rank, "world": world,
        "local_rank": local_rank, "seed": seed, "epoch": epoch, "batch_size": batch_size,
        "drop_last": drop_last, "client": CLIENT_NAME,
    }
    if fields:
        hello["fields"] = list(fields)
    if urls:
        hello["urls"] = list(urls)
    if image_layout not in ("chw", "hwc"):
        raise ValueError(f"image_layout {image_layout!r}: want 'chw' or 'hwc'")
    hello["image_layout"] = image_layout
    settings = {"allow_estimate": allow_estimate, "count_first": count_first, "slab_bytes": slab_bytes,
                "slabs": slabs, "shuffle": shuffle, "shuffle_buffer": shuffle_buffer,
                "shuffle_bytes": shuffle_bytes, "open_shards": open_shards, "read_gap": read_gap}
    for name in SETTINGS:
        value = settings[name]
        if value is None or value is False and name in ("allow_estimate", "count_first"):
            continue
        if name != "shuffle" and not isinstance(value, bool) and (not isinstance(value, int) or value < 0):
            raise ValueError(f"{name}={value!r}: want a non-negative int")
        hello[name] = value
    if urls and streams:
        raise ValueError("urls and streams: give one or the other")
    if streams is not None:
        hello["streams"] = stream_specs(streams)
    if epoch_samples is not None:
        if isinstance(epoch_samples, bool) or not isinstance(epoch_samples, int) or epoch_samples < 0:
            raise ValueError(f"epoch_samples={epoch_samples!r}: want a non-negative int")
        hello["epoch_samples"] = epoch_samples
    if batching is not None:
        if batching not in BATCHINGS:
            raise ValueError(f"batching={batching!r}: want one of {', '.join(BATCHINGS)}")
        hello["batching"] = batching
    if state is not None:
        hello["state"] = state
    if gpu_pci:
        hello["gpu_pci"] = gpu_pci
    visible = cuda_visible_devices or ""
    if visible and len(visible) <= 1024 and all(c.isascii() and (c.isalnum() or c in ",-/ ") for c in visible):
        # Without gpu_pci, the server maps local_rank through it to a GPU.
        hello["cuda_visible_devices"] = visible
    return cast(HelloMessage, hello)


BATCHINGS: Tuple[str, ...] = ("random", "stratified", "per_stream")


def stream_specs(streams: Iterable[Mapping[str, Any]]) -> List[StreamSpec]:
    """The hello's streams for a mix given as dicts: "urls" (a pattern or a list of
    them) and at most one of "weight", "repeat" and "choose". Raises ValueError for
    anything else."""
    out: List[StreamSpec] = []
    for i, st in enumerate(streams):
        if not isinstance(st, Mapping):
            raise ValueError(f"stream {i}: {st!r} is not a dict with urls and a weight")
        unknown = set(st) - {"urls", "weight", "repeat", "choose"}
        if unknown:
            raise ValueError(f"stream {i}: unknown keys {sorted(unknown)} (urls, weight, repeat, choose)")
        urls = st.get("urls")
        if isinstance(urls, str):
            urls = [urls]
        if not urls or not all(isinstance(u, str) and u for u in urls):
            raise ValueError(f"stream {i}: urls {urls!r}: want a pattern or a list of them")
        spec: StreamSpec = {"urls": list(urls)}
        given = [k for k in ("weight", "repeat", "choose") if st.get(k) is not None]
        if len(given) > 1:
            raise ValueError(f"stream {i}: {' and '.join(given)}: give one of weight, repeat and choose")
        for k in given:
            v = st[k]
            ok = isinstance(v, int) if k == "choose" else isinstance(v, (int, float))
            if isinstance(v, bool) or not ok or not v > 0 or v != v or v == float("inf"):
                raise ValueError(f"stream {i}: {k}={v!r}: want a positive {'int' if k == 'choose' else 'number'}")
            spec[k] = v  # type: ignore[literal-required]
        out.append(spec)
    if not out:
        raise ValueError("streams: none given")
    return out


def release_message(slab: int, seq: int, epoch: int, wait: Optional[float] = None) -> ReleaseMessage:
    """The release of a batch; wait is the seconds the trainer has waited for batches
    so far (left out for a batch the client drops unseen)."""
    msg: ReleaseMessage = {"type": "release", "slab": slab, "seq": seq, "epoch": epoch}
    if wait is not None:
        msg["wait"] = round(wait, 6)
    return msg


def epoch_message(epoch: int, state: Optional[State] = None) -> EpochMessage:
    """The request for epoch, starting at state when given."""
    msg: EpochMessage = {"type": "epoch", "epoch": epoch}
    if state is not None:
        msg["state"] = state
    return msg


def encode(msg: Mapping[str, Any]) -> bytes:
    """A message's packet."""
    return json.dumps(msg).encode()


def decode(packet: bytes, server: str) -> Message:
    """The message in a packet from the server at the socket path server. Raises
    ServerGone for the empty packet of a closed connection, ServerError for an error
    message, ProtocolError for anything that is not a JSON object of at most
    MAX_MESSAGE bytes."""
    if not packet:
        raise ServerGone(f"the shardload server at {server} closed the connection (it stopped or crashed)")
    if len(packet) > MAX_MESSAGE:
        raise ProtocolError(f"message longer than {MAX_MESSAGE} bytes")
    try:
        obj = json.loads(packet)
    except ValueError as e:
        raise ProtocolError(f"unreadable message from the server: {e}") from None
    if not isinstance(obj, dict):
        raise ProtocolError(f"a message that is not a JSON object: {packet[:80]!r}")
    if obj.get("type") == "error":
        raise ServerError(obj.get("code", ""), obj.get("message", ""))
    return obj


def recv_with_fds(sock: socket.socket) -> Tuple[bytes, List[int], bool]:
    """A packet, the descriptors that came with it (SCM_RIGHTS: the caller's to
    close), and whether the kernel cut them short (MSG_CTRUNC: the caller raises
    ProtocolError). Raises OSError as the socket does."""
    packet, fds, flags, _ = socket.recv_fds(sock, MAX_MESSAGE + 1, MAX_FDS)
    return packet, list(fds), bool(flags & getattr(socket, "MSG_CTRUNC", 0))


# The members of a state and their types.
_STATE_MEMBERS: Tuple[Tuple[str, type], ...] = (
    ("epoch", int), ("order", str), ("samples", int), ("runs", str), ("batches", int))


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


def state_of(msg: Mapping[str, Any], what: str) -> Optional[State]:
    """The state a server message carries, None when it carries none."""
    st = msg.get("state")
    if st is None:
        return None
    try:
        return check_state(st)
    except ValueError as e:
        raise ProtocolError(f"the server's {what} carries a state this client cannot read: {e}") from None


def epoch_start(epoch: int, state: Optional[State]) -> State:
    """The state at the start of epoch, under the order of state (a state of any epoch
    of the same dataset and settings; None when unknown)."""
    order, samples = ("", 0) if state is None else (state["order"], state["samples"])
    return {"epoch": epoch, "order": order, "samples": samples, "runs": "", "batches": 0}


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
