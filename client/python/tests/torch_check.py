"""Reads a shardload server through the PyTorch adapters and prints one JSON line per
batch, for the integration tests:

    torch_check.py dataset SOCKET EPOCHS BATCH_SIZE FIELD...
        ShardloadDataset in a DataLoader(batch_size=None, num_workers=0), epochs 0..EPOCHS-1
    torch_check.py prefetch SOCKET EPOCHS BATCH_SIZE FIELD...
        CudaPrefetcher (on the GPU when there is one, else its host fallback)

Each line: {"epoch", "keys", "columns": {name: sha256 of the column's bytes}, "device"}.

    torch_check.py batching SOCKET BATCH_SIZE FIELD...
        ShardloadDataset in DataLoaders that batch again (the default batch_size=1,
        batch_size=4, a worker process) and in one that does not (batch_size=None);
        default_collate of two of its batches; a column name that is not one. One line
        per case: {"case", "error", "message"} or {"case", "batches", "shape"}.
    torch_check.py len SOCKET BATCH_SIZE FIELD...
        len() of a ShardloadDataset and of its DataLoader against the batches an epoch
        yields, twice, and the client's account of the epoch: one line.
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


def case_line(case, f):
    """Run f and print what it did: its result (a dict), or its error."""
    try:
        out = f()
    except Exception as e:  # the case's error is what is checked
        print(json.dumps({"case": case, "error": type(e).__name__, "message": str(e)}), flush=True)
        return
    print(json.dumps(dict(out, case=case)), flush=True)


def first_batch(loader):
    n, shape = 0, None
    for b in loader:
        if shape is None:
            shape = list(b["label"].shape)
        n += 1
    return {"batches": n, "shape": shape}


def batching(socket_path, batch_size, fields):
    from torch.utils.data import DataLoader
    ds = ShardloadDataset(socket_path=socket_path, batch_size=batch_size, fields=fields, seed=1)
    case_line("default", lambda: first_batch(DataLoader(ds)))
    case_line("batch_size=4", lambda: first_batch(DataLoader(ds, batch_size=4)))
    case_line("worker", lambda: first_batch(DataLoader(ds, num_workers=1)))
    case_line("none", lambda: first_batch(DataLoader(ds, batch_size=None)))
    it = iter(ds)
    b = next(it)
    case_line("collate", lambda: {"collated": str(torch.utils.data.default_collate([b, b]))[:100]})
    case_line("missing", lambda: {"got": str(b["lable"])})
    it.close()
    ds.close()
    with shardload.Client(socket_path, batch_size=batch_size, fields=fields, seed=1) as c:
        cit = iter(c)
        cb = next(cit)  # held by cit's generator until it moves on
        case_line("client missing", lambda: {"got": str(cb["lable"])})
        cit.close()


def lengths(socket_path, batch_size, fields):
    from torch.utils.data import DataLoader
    ds = ShardloadDataset(socket_path=socket_path, batch_size=batch_size, fields=fields, seed=1)
    loader = DataLoader(ds, batch_size=None)
    out = {"len_dataset": len(ds), "len_loader": len(loader), "epochs": []}
    for _ in range(2):
        keys, rows, n = [], 0, 0
        for b in loader:
            n += 1
            keys.extend(b["__key__"])
            rows += len(b["__key__"])
        c = ds._client
        end = dict(c.last_epoch) if c is not None and c.last_epoch is not None else {}
        out["epochs"].append({"batches": n, "end_batches": end.get("batches"), "rows": rows, "distinct": len(set(keys)),
                              "padded": end.get("padded"), "left_out": end.get("left_out"),
                              "estimated": end.get("estimated"), "len_after": len(ds)})
    ds.close()
    print(json.dumps(out), flush=True)


def main():
    mode, socket_path = sys.argv[1], sys.argv[2]
    if mode == "batching":
        batching(socket_path, int(sys.argv[3]), sys.argv[4:])
        return
    if mode == "len":
        lengths(socket_path, int(sys.argv[3]), sys.argv[4:])
        return
    epochs, batch_size = int(sys.argv[3]), int(sys.argv[4])
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
