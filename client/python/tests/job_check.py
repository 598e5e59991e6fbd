"""Checks of what a training job gets on the default path, for the integration tests
(integration/job_test.go). Each mode prints one JSON object on stdout.

    job_check.py epoch SOCKET RANK WORLD [allow]   one epoch's keys, or the error before the first
                                                   batch; with allow, allow_estimate=True and the
                                                   warnings raised
    job_check.py batches SOCKET BATCH FIELD...     one whole epoch of these fields: batches, rows,
                                                   each column's shape and dtype, warnings
    job_check.py torch SOCKET BATCH                len() of ShardloadDataset and of its DataLoader,
                                                   the batches an epoch yields, the order values
    job_check.py vision SOCKET FIELD SHARD...      float32 CHW batches against torchvision's
                                                   Resize+CenterCrop+ToTensor+Normalize of the same
                                                   JPEGs: the largest difference
    job_check.py wait SOCKET STEP_MS BATCHES       a trainer that steps STEP_MS per batch: the share of
                                                   its time it waited, and the server's backpressure
    job_check.py churn SOCKET N                    N connections closed at once or after one batch
    job_check.py stall SOCKET                      reads two batches, says so, and holds them until killed
"""

import io
import json
import os
import sys
import tarfile
import time
import warnings

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import shardload  # noqa: E402


def emit(**obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def epoch(sock, rank, world, allow):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            c = shardload.Client(sock, rank=rank, world=world, batch_size=8, seed=3, fields=["cls:int"],
                                 allow_estimate=allow, check_order=False, timeout=120)
        except shardload.ShardloadError as e:
            emit(error=type(e).__name__, message=str(e), batches=0)
            return
        keys, batches = [], 0
        with c:
            try:
                for b in c:
                    batches += 1
                    keys.extend(b.keys[:b.rows - b.padded])
            except shardload.ShardloadError as e:
                emit(error=type(e).__name__, message=str(e), batches=batches, keys=keys)
                return
            last = c.last_epoch
        emit(keys=keys, batches=batches, planned=c.batches_per_epoch, estimated=c.counts_estimated,
             last_epoch=last, warnings=[str(w.message) for w in caught if issubclass(w.category, shardload.ShardloadWarning)])


def batches(sock, batch, fields):
    try:
        _batches(sock, batch, fields)
    except shardload.ShardloadError as e:
        emit(error=type(e).__name__, message=str(e), batches=0)


def _batches(sock, batch, fields):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        n, rows, shapes = 0, 0, {}
        with shardload.Client(sock, batch_size=batch, seed=1, fields=fields, output="torch", timeout=300) as c:
            for b in c:
                n += 1
                rows += b.rows
                if n == 1:  # the first batch's columns
                    for name, col in b.items():
                        if isinstance(col, shardload.Ragged):
                            shapes[name] = ["ragged", len(col)]
                        else:
                            shapes[name] = [list(col.shape), str(col.dtype)]
            emit(batches=n, rows=rows, planned=c.batches_per_epoch, shapes=shapes, slab_bytes=c.slab_bytes,
                 largest_slab=max(n for _, n in c.slab_addresses()),
                 warnings=[str(w.message) for w in caught if issubclass(w.category, shardload.ShardloadWarning)])


def torch_conventions(sock, batch):
    import torch
    from shardload.pytorch import ShardloadDataset
    ds = ShardloadDataset(socket_path=sock, batch_size=batch, seed=2, fields=["cls:int"])
    n_ds = len(ds)
    dl = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=0)
    n_dl = len(dl)
    got = sum(1 for _ in dl)
    again = sum(1 for _ in dl)  # the next epoch, on the same connection
    state = ds.state_dict()
    order = ds._client.order
    emit(len_dataset=n_ds, len_dataloader=n_dl, epoch_batches=got, second_epoch=again,
         state_order=state["order"], fingerprint=order["fingerprint"], job=order.get("job"))
    ds.close()


def vision(sock, field, shards):
    import numpy as np
    import torch
    from PIL import Image
    from torchvision import transforms
    tf = transforms.Compose([transforms.Resize(224), transforms.CenterCrop(224), transforms.ToTensor(),
                             transforms.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])])
    refs = {}
    for p in shards:
        with tarfile.open(p) as tf_:
            for m in tf_.getmembers():
                if m.name.endswith(".jpg"):
                    img = Image.open(io.BytesIO(tf_.extractfile(m).read())).convert("RGB")
                    refs[m.name[:-len(".jpg")]] = tf(img)
    worst, n, shape, dtype = 0.0, 0, None, None
    with shardload.Client(sock, batch_size=32, seed=1, fields=[field], output="torch", timeout=300) as c:
        for b in c:
            x = b["img"]
            shape, dtype = list(x.shape), str(x.dtype)
            for i, k in enumerate(b.keys):
                ref = refs[k]
                worst = max(worst, float((x[i].float() - ref).abs().max()))
                n += 1
    # ToTensor's 1/255 in the normalised space of the channel with the smallest std.
    emit(images=n, references=len(refs), shape=shape, dtype=dtype, max_abs_diff=worst,
         bound=float(1 / 255 / min(0.229, 0.224, 0.225)))


def wait(sock, step_ms, nbatches):
    """The share of the trainer's time spent waiting for batches after its first (the
    first batch's latency, a connection's and a plan's, is not the loader keeping up)."""
    step = step_ms / 1000
    n = 0
    with shardload.Client(sock, batch_size=8, seed=1, timeout=120) as c:
        it = iter(c)
        while n < nbatches:
            try:
                b = next(it)
            except StopIteration:
                it = c.epoch(c.current_epoch + 1)
                continue
            n += 1
            if n == 1:
                t0, w0 = time.perf_counter(), c.stats["wait_seconds"]
            time.sleep(step)  # the trainer's step
        total = time.perf_counter() - t0
        waited = c.stats["wait_seconds"] - w0
        emit(batches=n, seconds=total, wait=waited, wait_fraction=waited / total,
             backpressure=c.stats["backpressure_seconds"], session=c.session)


def churn(sock, n):
    done = 0
    for i in range(n):
        with shardload.Client(sock, batch_size=8, seed=100 + i, fields=["cls:int"], check_order=False, timeout=120) as c:
            if i % 2:
                next(iter(c))
        done += 1
    emit(connections=done)


def stall(sock):
    c = shardload.Client(sock, batch_size=8, seed=7, fields=["cls:int"], check_order=False, timeout=120)
    it = c.batches(auto_release=False)
    held = [next(it), next(it)]
    emit(stalled=len(held))
    time.sleep(3600)


def main():
    mode, sock = sys.argv[1], sys.argv[2]
    args = sys.argv[3:]
    if mode == "epoch":
        epoch(sock, int(args[0]), int(args[1]), len(args) > 2 and args[2] == "allow")
    elif mode == "batches":
        batches(sock, int(args[0]), args[1:])
    elif mode == "torch":
        torch_conventions(sock, int(args[0]))
    elif mode == "vision":
        vision(sock, args[0], args[1:])
    elif mode == "wait":
        wait(sock, float(args[0]), int(args[1]))
    elif mode == "churn":
        churn(sock, int(args[0]))
    elif mode == "stall":
        stall(sock)
    else:
        sys.exit(f"unknown mode {mode}")


if __name__ == "__main__":
    main()
