"""The client's errors (every one a ShardloadError) and its warning."""

from __future__ import annotations


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
