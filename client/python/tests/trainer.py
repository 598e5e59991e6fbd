"""A trainer stand-in for the integration tests: reads batches from a shardload server
with the client and prints one JSON line per batch (keys and a digest of every column),
so that a test can compare them with what the Go library yields.

    trainer.py --socket PATH [--rank R --world W --seed S --epoch E --epochs N
               --batch-size B --field SPEC ... --url URL ... --output numpy|torch|memoryview]
               [--pause-after K]

With --pause-after K it prints {"paused": K} after K batches, holding the K-th batch,
and waits for a line on stdin before going on. Errors are printed as one JSON line
{"error": CLASS, "code": CODE, "message": TEXT} with exit status 3.
"""

import argparse
import hashlib
import json
import os
import struct
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import shardload  # noqa: E402


def column_digest(col):
    h = hashlib.sha256()
    if isinstance(col, shardload.Ragged):
        for row in col:
            b = bytes(row.numpy() if hasattr(row, "numpy") and not isinstance(row, memoryview) else row)
            h.update(struct.pack("<Q", len(b)))
            h.update(b)
    elif hasattr(col, "numpy") and not hasattr(col, "tobytes"):
        h.update(col.numpy().tobytes())  # a torch tensor
    else:
        h.update(col.tobytes())
    return h.hexdigest()


def emit(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--socket")
    p.add_argument("--rank", type=int)
    p.add_argument("--world", type=int)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--epoch", type=int, default=0)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--field", action="append", default=[])
    p.add_argument("--url", action="append", default=[])
    p.add_argument("--output", default="numpy")
    p.add_argument("--pause-after", type=int, default=0)
    a = p.parse_args()
    try:
        c = shardload.Client(a.socket, rank=a.rank, world=a.world, seed=a.seed, epoch=a.epoch,
                             batch_size=a.batch_size, fields=a.field or None, urls=a.url or None,
                             output=a.output)
        emit({"ready": {"batches": c.batches_per_epoch, "samples": c.samples_per_epoch,
                        "fields": c.fields, "slabs": len(c.slab_addresses())}})
        n = 0
        for e in range(a.epoch, a.epoch + a.epochs):
            batches = c.batches() if e == a.epoch else c.epoch(e)
            for b in batches:
                emit({"epoch": b.epoch, "seq": b.seq, "rows": b.rows, "padded": b.padded, "keys": b.keys,
                      "columns": {name: column_digest(col) for name, col in b.items()}})
                n += 1
                if n == a.pause_after:
                    emit({"paused": n})
                    sys.stdin.readline()
            emit({"end": c.last_end})
        c.close()
    except shardload.ShardloadError as e:
        emit({"error": type(e).__name__, "code": getattr(e, "code", ""), "message": str(e)})
        sys.exit(3)


if __name__ == "__main__":
    main()
