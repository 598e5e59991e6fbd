"""One trainer rank reading epochs from its node's `shardload serve`, for the compose
demo and the multi-node test (integration/multinode_docker_test.go). Rank, world and
local rank come from RANK, WORLD_SIZE and LOCAL_RANK, the socket from
SHARDLOAD_SOCKET, as torchrun and the images set them.

    rank.py --epochs N [--batch-size B] [--seed S] [--field SPEC ...]
            [--pause E:K ...] [--results DIR] [--quiet] [--reconnect-timeout SECONDS]

It reads epochs 0 to N-1 and prints one JSON line per event on stdout:
{"event": "ready", ...} per connection, {"event": "batch", "epoch", "seq", "keys",
"state"} per batch, {"event": "end", "epoch", "batches", "samples"} per epoch, and
{"event": "done", "samples"} at the end (--quiet: no batch lines).

When the server goes away (killed, or stopped: ServerGone, or a ServerError
"shutdown") the rank does what a
trainer restarted from its checkpoint does: it prints {"event": "gone", "state"},
connects again (waiting up to --reconnect-timeout seconds for a server to listen)
with the last state_dict() it saw, and goes on from the batch after it.

--pause E:K stops after K batches of epoch E (K "end": after the epoch's end, before
the next), prints {"event": "paused", "epoch", "batches"} (or "end": true) and reads
one line from stdin before going on: the test's moment for a fault. With --results
DIR the keys of
each epoch go to DIR/rank-R.json at the end (the compose demo's check.py reads them).
Errors: {"event": "error", "error": CLASS, "message": TEXT} and exit status 3.
"""

import argparse
import json
import os
import sys
import time

import shardload


def emit(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


class Rank:
    def __init__(self, a):
        self.a = a
        self.pauses = set()
        for p in a.pause:
            e, _, k = p.partition(":")
            self.pauses.add((int(e), k if k == "end" else int(k)))
        self.client = None
        self.state = None  # the position to resume from after a lost server
        self.keys = {}     # epoch -> keys read, in order

    def pause(self, epoch, k):
        if (epoch, k) in self.pauses:
            self.pauses.discard((epoch, k))
            emit({"event": "paused", "epoch": epoch, **({"end": True} if k == "end" else {"batches": k})})
            if not sys.stdin.readline():
                raise SystemExit("rank.py: stdin closed while paused")

    def connect(self, epoch):
        """A client at self.state (or at the start of epoch), waiting for a server
        to listen for up to --reconnect-timeout seconds."""
        deadline = time.monotonic() + self.a.reconnect_timeout
        while True:
            try:
                kw = {"state": self.state} if self.state is not None else {"epoch": epoch}
                c = shardload.Client(seed=self.a.seed, batch_size=self.a.batch_size, fields=self.a.field or None,
                                     timeout=self.a.timeout, **kw)
                break
            except (shardload.NoServer, shardload.ServerGone) as e:
                if time.monotonic() > deadline:
                    raise shardload.Timeout(f"no server at {shardload.default_socket()} for "
                                            f"{self.a.reconnect_timeout}s: {e}") from None
                time.sleep(0.2)  # a poll of the socket, bounded by the deadline above
        emit({"event": "ready", "rank": c.rank, "world": c.world, "session": c.session, "epoch": c.current_epoch,
              "batches": c.batches_per_epoch, "epoch_batches": c.epoch_batches,
              "samples": c.order["settings"]["samples"], "order": c.order["fingerprint"], "resumed": self.state})
        return c

    def read_epoch(self, epoch, first):
        """Read epoch from the current client: its own epoch when first (the one it
        was opened at), else by starting it."""
        batches = self.client if first else self.client.epoch(epoch)
        for b in batches:
            keys = list(b.keys)
            self.keys.setdefault(epoch, []).extend(keys)
            state = self.client.state_dict()
            if not self.a.quiet:
                emit({"event": "batch", "epoch": b.epoch, "seq": b.seq, "keys": keys, "state": state})
            self.pause(epoch, b.seq + 1)
        emit({"event": "end", "epoch": epoch, "batches": self.client.last_end.get("batches"),
              "samples": len(self.keys.get(epoch, []))})

    def run(self):
        epoch = 0
        first = True
        while epoch < self.a.epochs:
            try:
                if self.client is None:
                    self.client = self.connect(epoch)
                    first = True
                self.read_epoch(epoch, first)
                first = False
                self.pause(epoch, "end")
                epoch += 1
            except (shardload.ServerGone, shardload.ServerError) as e:
                # A server that stops cleanly (SIGTERM) says "shutdown"; any other
                # error it reports is the job's to fail on.
                if isinstance(e, shardload.ServerError) and e.code != "shutdown":
                    raise
                self.state = self.client.state_dict()
                emit({"event": "gone", "epoch": epoch, "message": str(e), "state": self.state})
                try:
                    self.client.close()
                except (shardload.ShardloadError, OSError):
                    pass
                self.client = None
                epoch = self.state["epoch"]
        if self.client is not None:
            self.client.close()
        total = sum(len(k) for k in self.keys.values())
        if self.a.results:
            rank = int(os.environ.get("RANK", "0"))
            path = os.path.join(self.a.results, f"rank-{rank}.json")
            with open(path + ".tmp", "w") as f:
                json.dump({"rank": rank, "world": int(os.environ.get("WORLD_SIZE", "1")),
                           "epochs": {str(e): k for e, k in self.keys.items()}}, f)
            os.replace(path + ".tmp", path)
        emit({"event": "done", "samples": total})


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--field", action="append", default=[])
    p.add_argument("--pause", action="append", default=[])
    p.add_argument("--results")
    p.add_argument("--quiet", action="store_true")
    p.add_argument("--timeout", type=float, default=120)
    p.add_argument("--reconnect-timeout", type=float, default=120)
    a = p.parse_args()
    try:
        Rank(a).run()
    except shardload.ShardloadError as e:
        emit({"event": "error", "error": type(e).__name__, "message": str(e)})
        sys.exit(3)


if __name__ == "__main__":
    main()
