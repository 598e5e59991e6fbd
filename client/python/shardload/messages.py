"""The messages of the trainer protocol, version 4 (docs/protocol.md), and its
constants: the TypedDicts below are the messages with their members (those a sender
may leave out are NotRequired), as wire/messages.go writes and reads them;
wire/testdata/messages.json has one of each with every member set, and
client/python/tests/wire_check.py checks these types against it.

The module needs only the standard library and imports nothing of the package. It
has no ``from __future__ import annotations``: the TypedDicts' members are real types
at run time, so that ``__required_keys__`` and ``typing.get_type_hints`` describe the
messages.
"""

import sys
from typing import TYPE_CHECKING, Any, Dict, List, Literal

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


class State(TypedDict):
    """A position in the loader's order (the Go library's shardload.State), as
    Client.state_dict() returns it: a plain dict of ints and strings."""

    epoch: int
    order: str
    samples: int
    runs: str
    batches: int
    rows: NotRequired[int]  # a packed epoch's position: the rows all ranks yielded


class HelloMessage(TypedDict):
    """The client's first message. The settings (shardload.hello.SETTINGS) are members
    of the hello itself; a false allow_estimate or count_first is left out."""

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
    ranks_per_node: NotRequired[int]
    node_affinity: NotRequired[bool]
    streams: NotRequired[List["StreamSpec"]]
    epoch_samples: NotRequired[int]
    batching: NotRequired[str]
    pack: NotRequired[str]
    epoch_tokens: NotRequired[int]


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
    tokens: NotRequired[int]
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


# Any message as decode() returns it: a JSON object, read as one of the TypedDicts
# once its type is known.
Message = Dict[str, Any]

# The messages by type.
MESSAGES: Dict[str, Any] = {
    "hello": HelloMessage, "ready": ReadyMessage, "batch": BatchMessage, "release": ReleaseMessage,
    "end": EndMessage, "epoch": EpochMessage, "bye": ByeMessage, "error": ErrorMessage,
}

BYE: ByeMessage = {"type": "bye"}
