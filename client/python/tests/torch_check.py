"""Reads a shardload server through the PyTorch adapters and prints one JSON line per
batch, for the integration tests:

    torch_check.py dataset SOCKET EPOCHS BATCH_SIZE FIELD...
        ShardloadDataset in a DataLoader(batch_size=None, num_workers=0), epochs 0..EPOCHS-1
    torch_check.py prefetch SOCKET EPOCHS BATCH_SIZE FIELD...
        CudaPrefetcher (on the GPU when there is one, else its host fallback)

Each line: {"epoch", "keys", "columns": {name: sha256 of the column's bytes}, "device"}.
RANK and WORLD_SIZE come from the environment, as torchrun sets them.
"""

import hashlib
import json
import os
import struct
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402

import shardload  # noqa: E402
from shardload.pytorch import CudaPrefetcher, ShardloadDataset  # noqa: E402


def digest(col):
    h = hashlib.sha256()
    if isinstance(col, shardload.Ragged):
        for row in col:
            b = row.numpy().tobytes() if isinstance(row, torch.Tensor) else bytes(row)
            h.update(struct.pack("<Q", len(b)))
            h.update(b)
    else:
        h.update(col.cpu().numpy().tobytes())
    return h.hexdigest()


def emit(epoch, batch):
    cols = {k: digest(v) for k, v in batch.items() if k != "__key__"}
    devices = sorted({str(v.device) for v in batch.values() if isinstance(v, torch.Tensor)})
    print(json.dumps({"epoch": epoch, "keys": batch["__key__"], "columns": cols, "device": devices}), flush=True)


def main():
    mode, socket_path, epochs, batch_size = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    fields = sys.argv[5:]
    if mode == "dataset":
        ds = ShardloadDataset(socket_path=socket_path, batch_size=batch_size, fields=fields, seed=1)
        loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=0)
        for epoch in range(epochs):
            for batch in loader:
                emit(epoch, batch)
        ds.close()
    elif mode == "prefetch":
        with shardload.Client(socket_path, batch_size=batch_size, fields=fields, seed=1, output="torch") as c:
            p = CudaPrefetcher(c)
            print(json.dumps({"cuda": p.cuda, "registered": p.registered}), flush=True)
            for epoch in range(epochs):
                for batch in (p if epoch == 0 else p.epoch(epoch)):
                    emit(epoch, batch)
    else:
        sys.exit(f"unknown mode {mode}")


if __name__ == "__main__":
    main()
