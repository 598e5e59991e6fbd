"""The trainer protocol, version 4 (docs/protocol.md), as this client speaks it.

Each message is one packet of a unix SOCK_SEQPACKET socket: a UTF-8 JSON object of at
most MAX_MESSAGE bytes with a string member "type"; the ready message carries the
slabs' memfds (SCM_RIGHTS, see shardload.transport). This module encodes and decodes
the packets and builds the small messages (release, epoch, bye), and names the whole
protocol in one place: the messages as TypedDicts and the constants
(shardload.messages), the hello built from Client's arguments (shardload.hello) and
the states that messages carry (shardload.state) are re-exported here.
client/python/tests/wire_check.py checks the types and hello_message against
wire/testdata/messages.json.

The module needs only the standard library.
"""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any, Mapping, Optional

from .errors import ProtocolError, ServerError, ServerGone
from .hello import BATCHINGS, SETTINGS, hello_message, stream_specs
from .messages import (BYE, CLIENT_NAME, MAX_FDS, MAX_MESSAGE, MESSAGES, PROTOCOL_VERSION, BatchMessage, ByeMessage,
                       ColumnInfo, EndMessage, EpochEnd, EpochMessage, ErrorMessage, FieldInfo, HelloMessage, Message,
                       OrderInfo, OrderSettings, Placement, ReadyMessage, ReleaseMessage, State, StreamEnd,
                       StreamSpec)
from .state import check_state, epoch_end, epoch_start, state_of

__all__ = [
    "BATCHINGS", "BYE", "CLIENT_NAME", "MAX_FDS", "MAX_MESSAGE", "MESSAGES", "PROTOCOL_VERSION", "SETTINGS",
    "BatchMessage", "ByeMessage", "ColumnInfo", "EndMessage", "EpochEnd", "EpochMessage", "ErrorMessage",
    "FieldInfo", "HelloMessage", "Message", "OrderInfo", "OrderSettings", "Placement", "ReadyMessage",
    "ReleaseMessage", "State", "StreamEnd", "StreamSpec", "check_state", "decode", "default_socket", "encode",
    "epoch_end", "epoch_message", "epoch_start", "hello_message", "release_message", "state_of", "stream_specs",
]


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
