#!/usr/bin/env python3
"""One trainer rank of the soak test (scripts/soak.sh): reads epochs from a shardload
server for ever, and survives being killed, and its server being killed.

    soak_trainer.py --socket PATH --rank R --world W --log FILE [--batch-size B] [--step-ms MS] [--allow-estimate]

Every batch it takes is appended to FILE as one JSON line {"epoch", "seq", "keys",
"state"}, written with one write: the batch's keys and the state after it together.
When it starts it resumes from the state of the last whole line of FILE (a line cut by
a kill is ignored), so that a rank killed at any point goes on exactly where its log
says it was. When its server goes away it reconnects, with the same state, until one
answers. Counting the keys of each epoch in the logs of all ranks tells whether any
sample was lost or read twice.
"""

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "client", "python"))

import shardload  # noqa: E402


def last_state(path):
    state = None
    try:
        with open(path, "rb") as f:
            for line in f:
                if not line.endswith(b"\n"):
                    break  # cut by a kill
                try:
                    state = json.loads(line)["state"]
                except (ValueError, KeyError):
                    break
    except FileNotFoundError:
        pass
    return state


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--socket", required=True)
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world", type=int, required=True)
    p.add_argument("--log", required=True)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--step-ms", type=float, default=5)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--allow-estimate", action="store_true", help="read a dataset without an index (approximate epochs)")
    args = p.parse_args()
    state = last_state(args.log)
    fd = os.open(args.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    if state is not None:
        # A line cut by the kill that stopped the last run: end it, so that the next
        # line starts on its own (the reader skips the cut one).
        if os.path.getsize(args.log) and open(args.log, "rb").read()[-1:] != b"\n":
            os.write(fd, b"\n")
    while True:
        try:
            c = shardload.Client(args.socket, rank=args.rank, world=args.world, batch_size=args.batch_size,
                                 seed=args.seed, fields=["cls:int"], check_order=False, timeout=120, state=state,
                                 allow_estimate=args.allow_estimate)
        except (shardload.NoServer, shardload.ServerGone, shardload.Timeout):
            time.sleep(0.2)
            continue
        try:
            with c:
                it = c.batches()
                while True:
                    for b in it:
                        line = {"epoch": b.epoch, "seq": b.seq, "keys": b.keys[:b.rows - b.padded], "state": b.state}
                        os.write(fd, (json.dumps(line) + "\n").encode())
                        state = b.state
                        time.sleep(args.step_ms / 1000)
                    state = c.state_dict()  # the next epoch's start
                    it = c.epoch(state["epoch"])
        except (shardload.ServerGone, shardload.NoServer, shardload.Timeout):
            time.sleep(0.2)  # the server restarts: resume from the last state
        except shardload.ServerError as e:
            if e.code == "shutdown":
                time.sleep(0.2)
                continue
            raise


if __name__ == "__main__":
    main()
