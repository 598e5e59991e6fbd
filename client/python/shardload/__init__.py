"""Python client of the shardload loader process.

    import shardload
    with shardload.Client(fields=["jpg", "label=cls:int"], batch_size=32) as c:
        for batch in c:                 # zero-copy views into shared, page-locked slabs
            labels = batch["label"]     # numpy int64 array [32]
            images = batch["jpg"]       # Ragged: images[i] is the i-th jpg's bytes
            keys = batch.keys           # list of str

The core needs only the standard library; numpy and torch are used when installed.
See shardload.pytorch for a torch IterableDataset and a CUDA prefetcher.
"""

from .client import (
    CLIENT_NAME,
    MAX_MESSAGE,
    PROTOCOL_VERSION,
    Batch,
    Client,
    NoServer,
    OrderMismatch,
    PermissionDenied,
    ProtocolError,
    Ragged,
    ServerError,
    ServerGone,
    ShardloadError,
    Timeout,
    connect,
    default_socket,
)

__all__ = [
    "CLIENT_NAME", "MAX_MESSAGE", "PROTOCOL_VERSION", "Batch", "Client", "NoServer", "OrderMismatch",
    "PermissionDenied", "ProtocolError", "Ragged", "ServerError", "ServerGone", "ShardloadError",
    "Timeout", "connect", "default_socket",
]
__version__ = "0.2.0"
