"""Checks of packed token rows through a server, for the integration tests
(integration/pack_test.go). Each mode prints one JSON object on stdout.

    pack_check.py read SOCKET SPEC      one rank's packed epoch (or its first n batches) through
                                        Client(output="torch"): SPEC is a JSON object with pack, epoch,
                                        rank, world, batch, state (a state_dict to resume from), n (0:
                                        the whole epoch). Checks every batch's columns (dtypes, shapes,
                                        cu_seqlens where position_ids are 0, max_seqlen the longest
                                        segment) and prints its rows that are not pad, the state_dict()
                                        after them and len(ShardloadDataset).
    pack_check.py dataset SOCKET SPEC   the same epoch through ShardloadDataset and a DataLoader
                                        (batch_size=None): prints its rows.
"""

import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402

import shardload  # noqa: E402
from shardload.pytorch import ShardloadDataset  # noqa: E402


def emit(**obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def check(cols, batch, seq, where, ids_dtype=torch.int64):
    ids, pos, cu, ms = cols["input_ids"], cols["position_ids"], cols["cu_seqlens"], cols["max_seqlen"]
    for name, t, dt in (("input_ids", ids, ids_dtype), ("position_ids", pos, torch.int64),
                        ("cu_seqlens", cu, torch.int32), ("max_seqlen", ms, torch.int32)):
        if not isinstance(t, torch.Tensor) or t.dtype != dt:
            raise SystemExit(f"{where}: {name} is {type(t).__name__} {getattr(t, 'dtype', None)}, want a {dt} tensor")
    if tuple(ids.shape) != (batch, seq) or tuple(pos.shape) != (batch, seq) or tuple(ms.shape) != (1,):
        raise SystemExit(f"{where}: shapes {tuple(ids.shape)} {tuple(pos.shape)} {tuple(ms.shape)}")
    starts = (pos.flatten() == 0).nonzero().flatten().to(torch.int32)
    want = torch.cat([starts, torch.tensor([batch * seq], dtype=torch.int32)])
    if not torch.equal(cu, want):
        raise SystemExit(f"{where}: cu_seqlens {cu.tolist()} but position_ids are 0 at {starts.tolist()}")
    if int(ms[0]) != int((cu[1:] - cu[:-1]).max()):
        raise SystemExit(f"{where}: max_seqlen {int(ms[0])}, longest segment {int((cu[1:] - cu[:-1]).max())}")


def read(sock, spec):
    seq = int(spec["pack"].split(":")[1])
    batch, n = spec.get("batch", 4), spec.get("n", 0)
    rows = []
    kw = dict(rank=spec.get("rank", 0), world=spec.get("world", 1), seed=spec.get("seed", 3), epoch=spec.get("epoch", 0),
              batch_size=batch, pack=spec["pack"], state=spec.get("state"), check_order=False, timeout=120)
    with shardload.Client(sock, output="torch", **kw) as c:
        batches = 0
        for b in c:
            ids_dtype = torch.int32 if "ids=int32" in spec["pack"].split(":") else torch.int64
            check(b.columns, batch, seq, f"batch {b.seq}", ids_dtype)
            if b.keys != []:
                raise SystemExit(f"batch {b.seq}: keys {b.keys[:3]} for packed rows")
            rows.extend(b["input_ids"][:b.rows - b.padded].tolist())
            batches += 1
            if n and batches == n:
                break
        emit(rows=rows, batches=batches, state=c.state_dict(), length=len(ShardloadDataset(sock, **kw)))


def dataset(sock, spec):
    seq = int(spec["pack"].split(":")[1])
    batch = spec.get("batch", 4)
    ds = ShardloadDataset(sock, rank=spec.get("rank", 0), world=spec.get("world", 1), seed=spec.get("seed", 3),
                          epoch=spec.get("epoch", 0), batch_size=batch, pack=spec["pack"], check_order=False,
                          timeout=120)
    rows = []
    for i, b in enumerate(torch.utils.data.DataLoader(ds, batch_size=None)):
        check(b, batch, seq, f"dataset batch {i}")
        rows.extend(b["input_ids"].tolist())  # pad rows too: the dataset hands the batch whole
    emit(rows=rows, length=len(ds))


if __name__ == "__main__":
    mode, sock, spec = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    {"read": read, "dataset": dataset}[mode](sock, spec)
