"""The client's socket (docs/protocol.md, Transport): connecting to the server and
checking who runs it, the hello/ready exchange that passes the slabs' descriptors,
sending and receiving messages, and the goodbye, with the socket's errors as the
client's. The rest of the package never touches the socket itself."""

from __future__ import annotations

import os
import socket
import struct
from typing import Any, Iterable, List, Mapping, Optional, Tuple, cast

from .errors import (NoServer, PermissionDenied, ProtocolError, ServerGone, ShardloadError, Timeout,
                     UntrustedServer)
from .messages import BYE, MAX_FDS, MAX_MESSAGE, PROTOCOL_VERSION, Message, ReadyMessage
from .protocol import decode, encode


def os_error(e: OSError, doing: str, server: str, timeout: Optional[float]) -> ShardloadError:
    """The client's error for an OSError of the socket to the server at server."""
    if isinstance(e, (socket.timeout, TimeoutError)):
        return Timeout(f"no answer from the shardload server at {server} within {timeout}s while {doing}")
    if isinstance(e, (ConnectionResetError, BrokenPipeError, ConnectionAbortedError)):
        return ServerGone(f"the shardload server at {server} closed the connection "
                          f"(it stopped or crashed) while {doing}: {e}")
    return ShardloadError(f"{doing}: {e}")


def connect(path: str, timeout: Optional[float], trust_uids: Optional[Iterable[int]]) -> socket.socket:
    """A socket connected to the server at path, which runs as a user trusted (this
    process's, root, or one of trust_uids, default $SHARDLOAD_TRUST_UIDS): checked
    before anything is said to it."""
    try:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    except OSError as e:
        raise ShardloadError(f"creating a unix socket: {e}") from None
    try:
        sock.settimeout(timeout)
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
            raise os_error(e, f"connecting to {path}", path, timeout) from None
        _check_peer(sock, path, timeout, trust_uids)
    except BaseException:
        sock.close()
        raise
    return sock


def _check_peer(sock: socket.socket, path: str, timeout: Optional[float],
                trust_uids: Optional[Iterable[int]]) -> None:
    """Refuse a server that runs as a user not trusted (see connect)."""
    if trust_uids is None:
        env = os.environ.get("SHARDLOAD_TRUST_UIDS", "")
        try:
            trust_uids = [int(u) for u in env.split(",") if u.strip()]
        except ValueError:
            raise ShardloadError(f"SHARDLOAD_TRUST_UIDS={env!r}: want comma-separated uids") from None
    try:
        creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except OSError as e:
        raise os_error(e, "reading the server's credentials", path, timeout) from None
    pid, uid, _ = struct.unpack("3i", creds)
    trusted = {os.getuid(), 0, *trust_uids}
    if uid not in trusted:
        raise UntrustedServer(
            f"the server at {path} runs as uid {uid} (pid {pid}), not as this user "
            f"(uid {os.getuid()}) or root: refusing to talk to it (another user may have taken "
            "the socket's place); pass trust_uids=[...] or set SHARDLOAD_TRUST_UIDS to trust it")


def send(sock: socket.socket, msg: Mapping[str, Any], server: str, timeout: Optional[float]) -> None:
    """Send msg; when the server has closed the connection, raise the error it said
    before (ServerError), if it said one."""
    try:
        sock.send(encode(msg))
    except OSError as e:
        if isinstance(e, (ConnectionResetError, BrokenPipeError)):
            _last_word(sock, server)
        raise os_error(e, f"sending {msg.get('type')}", server, timeout) from None


def _last_word(sock: socket.socket, server: str) -> None:
    """Raise the error message the server sent before it closed, if it sent one."""
    try:
        sock.setblocking(False)
        while True:
            packet = sock.recv(MAX_MESSAGE + 1)
            if not packet:
                return
            try:
                decode(packet, server)  # raises ServerError for an error message
            except ProtocolError:
                continue
    except OSError:
        return


def recv(sock: socket.socket, server: str, timeout: Optional[float]) -> Message:
    """The next message from the server (see protocol.decode)."""
    try:
        packet = sock.recv(MAX_MESSAGE + 1)
    except OSError as e:
        raise os_error(e, "waiting for a message", server, timeout) from None
    return decode(packet, server)


def recv_with_fds(sock: socket.socket) -> Tuple[bytes, List[int], bool]:
    """A packet, the descriptors that came with it (SCM_RIGHTS: the caller's to
    close), and whether the kernel cut them short (MSG_CTRUNC: the caller raises
    ProtocolError). Raises OSError as the socket does."""
    packet, fds, flags, _ = socket.recv_fds(sock, MAX_MESSAGE + 1, MAX_FDS)
    return packet, list(fds), bool(flags & getattr(socket, "MSG_CTRUNC", 0))


def hello_exchange(sock: socket.socket, hello: Mapping[str, Any], server: str,
                   timeout: Optional[float]) -> Tuple[bytes, List[int], bool]:
    """Send the hello and receive the ready's packet, the slabs' descriptors (the
    caller's to close) and whether they were cut short (see read_ready)."""
    send(sock, hello, server, timeout)
    try:
        return recv_with_fds(sock)
    except OSError as e:
        raise os_error(e, "waiting for the server's ready", server, timeout) from None


def open_session(path: str, hello: Mapping[str, Any], timeout: Optional[float],
                 trust_uids: Optional[Iterable[int]]) -> Tuple[socket.socket, bytes, List[int], bool]:
    """Connect to the server at path (see connect) and exchange the hello for the
    ready: the socket, the ready's packet, the slabs' descriptors and whether they
    were cut short (see hello_exchange). On an error nothing is left open."""
    sock = connect(path, timeout, trust_uids)
    try:
        packet, fds, cut = hello_exchange(sock, hello, path, timeout)
    except BaseException:
        sock.close()
        raise
    return sock, packet, fds, cut


def read_ready(packet: bytes, cut: bool, server: str) -> ReadyMessage:
    """The ready message in packet; ProtocolError for descriptors cut short, another
    message or another protocol version."""
    if cut:
        raise ProtocolError("the slab descriptors were cut short (MSG_CTRUNC)")
    ready = decode(packet, server)
    if ready.get("type") != "ready":
        raise ProtocolError(f"expected a ready message, got {ready.get('type')!r}")
    if ready.get("version") != PROTOCOL_VERSION:
        raise ProtocolError(f"the server speaks protocol version {ready.get('version')}, "
                            f"this client version {PROTOCOL_VERSION}")
    return cast(ReadyMessage, ready)


def bye(sock: socket.socket) -> None:
    """Say goodbye (when the server still listens) and close the socket."""
    try:
        sock.send(encode(BYE))
    except OSError:
        pass
    sock.close()
