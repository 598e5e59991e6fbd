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
slab back without a copy when nothing of the batch is referenced a step later, and
copies the batch out of the slab when something still is. Never write into batch data
(torch tensors cannot be made read-only: no in-place ops on them); copy() or
to_torch(copy=True) give owned data. Details: shardload.client.

The core needs only the standard library; numpy and torch are used when installed.
See shardload.pytorch for a torch IterableDataset and a CUDA prefetcher.

The package is typed (PEP 561: it ships py.typed). Columns are typed Any (numpy
arrays, torch tensors, memoryviews or Ragged, as the client's output and the field
decide); State is the TypedDict that state_dict() returns.
"""

from .client import (
    CLIENT_NAME,
    MAX_MESSAGE,
    PROTOCOL_VERSION,
    Batch,
    Client,
    EpochEnd,
    NoServer,
    OrderMismatch,
    PermissionDenied,
    ProtocolError,
    Ragged,
    ServerError,
    ServerGone,
    ShardloadError,
    ShardloadWarning,
    State,
    Timeout,
    UntrustedServer,
    check_state,
    connect,
    default_socket,
)

__all__ = [
    "CLIENT_NAME", "MAX_MESSAGE", "PROTOCOL_VERSION", "Batch", "Client", "EpochEnd", "NoServer", "OrderMismatch",
    "PermissionDenied", "ProtocolError", "Ragged", "ServerError", "ServerGone", "ShardloadError",
    "ShardloadWarning", "State", "Timeout", "UntrustedServer", "check_state", "connect", "default_socket",
]
__version__ = "0.4.0"
