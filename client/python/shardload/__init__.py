"""Python client of the shardload loader process.

    import shardload
    with shardload.Client(fields=["jpg", "label=cls:int"], batch_size=32) as c:
        for batch in c:                 # zero-copy views into shared, page-locked slabs
            labels = batch["label"]     # numpy int64 array [32], read-only
            images = batch["jpg"]       # Ragged: images[i] is the i-th jpg's bytes
            keys = batch.keys           # list of str

Batch lifetime: a batch is released when the next is taken; after that the Batch
hands out no columns (b["x"] raises ShardloadError; b.keys stays), but the arrays and
tensors taken from it stay valid and unchanged while referenced: the client gives the
slab back without a copy when no view of the batch is alive a step later, and copies
the batch out of the slab when one still is (every view holds an export of the
batch's own memoryview of its slab: see shardload.slabs). Never write into batch data
(torch tensors cannot be made read-only: no in-place ops on them); copy() or
to_torch(copy=True) give owned data.

The core needs only the standard library; numpy and torch are used when installed.
See shardload.pytorch for a torch IterableDataset and a CUDA prefetcher.

The package is typed (PEP 561: it ships py.typed). Columns are typed Any (numpy
arrays, torch tensors, memoryviews or Ragged, as the client's output and the field
decide); State is the TypedDict that state_dict() returns, and shardload.protocol
(from shardload.messages) has every message of the protocol as a TypedDict.

Modules: client (Client), batch (Batch, Ragged, the column views), slabs (the slabs'
mappings and lifetime), messages (the messages as TypedDicts, the constants), hello
(the hello from Client's arguments, the settings a trainer may give), state (states
and epochs' ends), protocol (encoding and decoding; names all of the protocol's),
transport (the socket), order (the order check across ranks), device (the trainer's
GPU), errors, pytorch (a torch IterableDataset and a CUDA prefetcher).
"""

from .batch import Batch, Ragged
from .client import Client, connect
from .errors import (NoServer, OrderMismatch, PermissionDenied, ProtocolError, ServerError, ServerGone,
                     ShardloadError, ShardloadWarning, Timeout, UntrustedServer)
from .messages import CLIENT_NAME, MAX_MESSAGE, PROTOCOL_VERSION, EpochEnd, State
from .protocol import default_socket
from .state import check_state

__all__ = [
    "CLIENT_NAME", "MAX_MESSAGE", "PROTOCOL_VERSION", "Batch", "Client", "EpochEnd", "NoServer", "OrderMismatch",
    "PermissionDenied", "ProtocolError", "Ragged", "ServerError", "ServerGone", "ShardloadError",
    "ShardloadWarning", "State", "Timeout", "UntrustedServer", "check_state", "connect", "default_socket",
]
__version__ = "0.4.0"
