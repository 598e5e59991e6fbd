"""Checks of mixed epochs through a server, for the integration tests
(integration/mix_test.go). Each mode prints one JSON object on stdout.

    mix_check.py read SOCKET SPEC   one rank's epoch (or its first N batches) of the mix SPEC, a JSON
                                    object: streams (none: the server's), epoch_samples, batching, epoch, rank, world,
                                    batch, state (a state_dict to resume from) and n (batches to read,
                                    0: the whole epoch). Prints each batch's keys, the state_dict()
                                    after them and, after a whole epoch, last_epoch.
    mix_check.py dataset SOCKET SPEC  the same through ShardloadDataset, epoch_samples=math.inf: the
                                    first N batches, crossing epochs without an end.
"""

import json
import math
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import shardload  # noqa: E402


def emit(**obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def read(sock, spec):
    n = spec.get("n", 0)
    batches = []
    with shardload.Client(sock, rank=spec.get("rank", 0), world=spec.get("world", 1), seed=spec.get("seed", 4),
                          epoch=spec.get("epoch", 0), batch_size=spec.get("batch", 16), fields=["cls:int"],
                          streams=spec.get("streams"), epoch_samples=spec.get("epoch_samples"),
                          batching=spec.get("batching"), state=spec.get("state"), check_order=False,
                          timeout=120) as c:
        for b in c:
            batches.append(list(b.keys[:b.rows - b.padded]))
            if n and len(batches) == n:
                break
        emit(batches=batches, state=c.state_dict(), last_epoch=c.last_epoch if not n else None,
             fingerprint=c.order["fingerprint"])


def dataset(sock, spec):
    from shardload.pytorch import ShardloadDataset
    ds = ShardloadDataset(socket_path=sock, seed=spec.get("seed", 4), batch_size=spec.get("batch", 16),
                          fields=["cls:int"], streams=spec["streams"], epoch_samples=math.inf)
    try:
        len(ds)
        has_len = True
    except TypeError:
        has_len = False
    batches, states = [], []
    for b in ds:
        batches.append(list(b["__key__"]) if "__key__" in b else [])
        states.append(ds.state_dict())
        if len(batches) == spec["n"]:
            break
    ds.close()
    emit(batches=len(batches), epochs=sorted({s["epoch"] for s in states}), has_len=has_len)


if __name__ == "__main__":
    mode, sock, spec = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    {"read": read, "dataset": dataset}[mode](sock, spec)
