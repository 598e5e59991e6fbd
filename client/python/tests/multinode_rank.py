"""One trainer rank of a multi-node job, for integration/multinode_test.go: started
as torchrun starts a rank (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT in
the environment, its node's server at $SHARDLOAD_SOCKET), it joins a gloo process
group, so that the client compares its order with every other rank's through
torch.distributed's store, and reads with clients that take rank, world, local rank
and socket from the environment alone.

    multinode_rank.py --seed S --batch-size B --epochs N [--field SPEC ...]

Two clients, one after the other: "full" (drop_last False) reads epochs 0 to N-1,
"drop_last" (drop_last True) reads epoch 0. Each prints one JSON line: the client's
rank, world, local rank and pid, the ready message's figures and order, and for each
batch its epoch, seq, rows, padding and keys, and each epoch's end. An error is
printed as one JSON line {"error": CLASS, "message": TEXT} with exit status 3.
"""

import argparse
import datetime
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import shardload  # noqa: E402


def emit(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def read(name, epochs, **kw):
    c = shardload.Client(check_timeout=180, **kw)
    out = {"client": name, "rank": c.rank, "world": c.world, "local_rank": c.local_rank, "pid": os.getpid(),
           "session": c.session, "batches_per_epoch": c.batches_per_epoch, "samples_per_epoch": c.samples_per_epoch,
           "estimated": c.counts_estimated, "order": c.order, "batches": [], "ends": []}
    for e in range(epochs):
        for b in (c if e == 0 else c.epoch(e)):
            out["batches"].append({"epoch": b.epoch, "seq": b.seq, "rows": b.rows, "padded": b.padded,
                                   "keys": list(b.keys)})
        out["ends"].append(c.last_end)
    c.close()
    emit(out)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--batch-size", type=int, required=True)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--field", action="append", default=[])
    a = p.parse_args()
    import torch.distributed as td
    td.init_process_group("gloo", timeout=datetime.timedelta(seconds=180))
    try:
        common = dict(seed=a.seed, batch_size=a.batch_size, fields=a.field or None)
        read("full", a.epochs, drop_last=False, **common)
        read("drop_last", 1, drop_last=True, **common)
    except shardload.ShardloadError as e:
        emit({"error": type(e).__name__, "message": str(e)})
        sys.stdout.flush()
        os._exit(3)  # the peers time out in their order check or barrier, and say so
    # An orderly end: a rank that exits while a peer's gloo connections are still
    # open can abort in gloo's threads.
    td.barrier()
    td.destroy_process_group()


if __name__ == "__main__":
    main()
