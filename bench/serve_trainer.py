"""A PyTorch training-loop stand-in fed by `shardload serve` through the Python client:
it takes each batch as torch tensors and holds it for a fixed step time, then reports
samples/s, MB/s and the trainer's wait share as one JSON object, in the same terms as
`shardload bench --json` and bench/dataloader_baseline.py.

    serve_trainer.py --socket PATH --batch-size 32 --field SPEC... [--epochs 1]
                     [--batches N] [--step-time SECONDS] [--json]

Besides the run, it measures the client's own cost per batch (client_overhead_us):
decoding a batch message, building the zero-copy tensors of every column and sending
the release, replayed 2000 times on the last batch message without the socket
(median; no waiting for the server in it).
"""

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "client", "python"))

import shardload  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--socket", required=True)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--field", action="append", default=[])
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batches", type=int, default=0)
    p.add_argument("--step-time", type=float, default=0.0)
    p.add_argument("--output", default="torch")
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    if a.output == "torch":
        import torch  # noqa: F401  (imported before the clock starts)

    t_start = time.perf_counter()
    c = shardload.Client(a.socket, batch_size=a.batch_size, fields=a.field or None, seed=0, output=a.output)
    samples = batches = nbytes = 0
    first = None
    wait = 0.0
    last_msg = None
    done = False
    # Wrap the message reader to keep the last batch message for the overhead replay.
    recv = c._recv

    def keep():
        nonlocal last_msg
        m = recv()
        if m.get("type") == "batch":
            last_msg = m
        return m

    c._recv = keep
    for e in range(a.epochs):
        it = iter(c) if e == 0 else c.epoch(e)
        while True:
            t0 = time.perf_counter()
            try:
                b = next(it)
            except StopIteration:
                break
            t1 = time.perf_counter()
            if first is None:
                first = t1 - t_start
            else:
                wait += t1 - t0
            batches += 1
            samples += b.rows - b.padded
            nbytes += sum(col["length"] for col in last_msg["columns"])
            if a.step_time > 0:
                time.sleep(a.step_time)
            if a.batches and batches >= a.batches:
                done = True
                break
        if done:
            break
    seconds = time.perf_counter() - t_start
    trainer = batches * a.step_time
    # Let go of the last batch (a run cut short by --batches still holds it), so that
    # its slab is released, not kept for the views of a batch still referenced.
    b = None
    it.close()

    overhead = None
    if last_msg is not None:
        # The replay builds views into the real slabs; the release goes to a socket
        # pair nobody reads (the server must not see releases of slabs it gave back).
        import socket as _socket
        s1, s2 = _socket.socketpair(_socket.AF_UNIX, _socket.SOCK_SEQPACKET)
        s2.settimeout(10)  # a release that never comes is a bug, not a wait
        sock = c._sock
        c._sock = s1
        raw = json.dumps(last_msg).encode()
        times = []
        for i in range(2000):
            t0 = time.perf_counter()
            b = c._batch(json.loads(raw))
            b.release()
            times.append(time.perf_counter() - t0)
            s2.recv(65536)
        c._sock = sock
        s1.close()
        s2.close()
        overhead = statistics.median(times) * 1e6
    c.close()
    res = {
        "samples": samples, "batches": batches, "bytes_out": nbytes, "seconds": seconds,
        "samples_per_sec": samples / seconds if seconds else 0,
        "mb_per_sec": nbytes / 1e6 / seconds if seconds else 0,
        "first_batch_seconds": first, "step_seconds": a.step_time,
        "wait_fraction": wait / (wait + trainer) if (wait + trainer) > 0 else 1.0,
        "client_overhead_us": overhead,
    }
    if a.json:
        print(json.dumps(res))
    else:
        for k, v in res.items():
            print(f"{k}: {v}")


if __name__ == "__main__":
    main()
