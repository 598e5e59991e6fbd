#!/usr/bin/env python3
"""Train a small model on batches from ``shardload serve``, checkpointing the loader's
position with the model, and resuming from it after a restart.

One process, or one per rank under torchrun (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR
and MASTER_PORT from its environment; torch.distributed is initialised when
WORLD_SIZE > 1, and gradients are averaged with DistributedDataParallel). Every rank
connects to the shardload server of its node ($SHARDLOAD_SOCKET or --socket), which
reads its slice of each epoch; the client checks that every rank's server reads the
same order. CPU by default: no GPU is needed.

    shardload gen --preset tokens --shards 8 --compression zstd /data/tok
    shardload index --output /data/tok/ '/data/tok/train-{000000..000007}.tar.zst'
    shardload serve '/data/tok/train-{000000..000007}.tar.zst' &
    torchrun --redirects 1 --tee 1 --nproc_per_node 2 examples/train.py --epochs 2 --checkpoint /tmp/ckpt.pt

Inputs (--input): "tokens" reads the tokens preset of ``shardload gen`` (2048 int32
token ids as .npy and a cls label) into an EmbeddingBag + MLP; "bytes" reads any
dataset with a "jpg" and a "cls" member (``make demo``'s, whose jpg members are random
bytes) as a 256-bin byte histogram per sample into an MLP. The labels of the
synthetic datasets are random: the loss falls only as the model memorises them.

With --checkpoint PATH, rank 0 saves the model, the optimiser and the loader's state
(the client's state_dict(), the same on every rank at the same step) every
--checkpoint-every steps and at the end, and a restarted job resumes from PATH: the
batches after the checkpoint are those the job would have read had it not stopped,
with the same or another world size (index the dataset first: see the client's
README, "Checkpoint and resume").

At the end each rank prints one JSON line: rank, world, samples, batches, steps,
loss_first, loss_last, resumed_from (the step the run resumed at, or null) and, with
--report-keys, the keys of the samples it trained on, in order.
"""

import argparse
import datetime
import json
import math
import os
import signal
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

try:
    import shardload
except ImportError:  # running from a checkout without the client installed
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "client", "python"))
    import shardload

CLASSES = 1000  # shardload gen's cls labels are 0..999
VOCAB = 50257   # and its token ids below this

INPUTS = {
    "tokens": ["tokens=npy:npy:int32:2048", "label=cls:int"],
    "bytes": ["jpg", "label=cls:int"],
}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--socket", help="the server's socket (default: $SHARDLOAD_SOCKET, else the server's default path)")
    p.add_argument("--input", choices=sorted(INPUTS), default="tokens", help="what the samples hold (default tokens)")
    p.add_argument("--epochs", type=int, default=1, help="epochs to train (counting those before a resume)")
    p.add_argument("--steps", type=int, default=0, help="stop after this many steps in all (0: no limit)")
    p.add_argument("--batch-size", type=int, default=32, help="samples per batch and rank")
    p.add_argument("--seed", type=int, default=0, help="seed of the loader's order and of the model's weights")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--device", default="cpu", help="cpu (default), cuda (each rank on GPU LOCAL_RANK) or auto")
    p.add_argument("--checkpoint", help="checkpoint file: resumed from when it exists, written by rank 0")
    p.add_argument("--checkpoint-every", type=int, default=50, help="steps between checkpoints (default 50)")
    p.add_argument("--crash-after-step", type=int, default=0,
                   help="rehearse a failure: after the checkpoint of this step, every rank kills itself (SIGKILL)")
    p.add_argument("--report-keys", action="store_true", help="list the keys trained on in the JSON line")
    p.add_argument("--timeout", type=float, default=300, help="seconds to wait for the server at most")
    p.add_argument("--connect-timeout", type=float, default=0,
                   help="seconds to keep trying while no server listens on the socket (a node's server restarting)")
    return p.parse_args(argv)


class TokenModel(torch.nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.embed = torch.nn.EmbeddingBag(VOCAB, 32, mode="mean")
        self.mlp = torch.nn.Sequential(torch.nn.Linear(32, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, CLASSES))

    def forward(self, tokens):
        return self.mlp(self.embed(tokens))


class ByteModel(torch.nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.mlp = torch.nn.Sequential(torch.nn.Linear(256, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, CLASSES))

    def forward(self, hist):
        return self.mlp(hist)


def features(kind, batch, device):
    """The model's input and the labels of a batch, on device. The batch's tensors are
    read-only views into the server's shared slab: nothing here writes into them."""
    labels = batch["label"].to(device)
    if kind == "tokens":
        return batch["tokens"].to(device=device, dtype=torch.int64), labels
    # A ragged column: one uint8 tensor of every row's bytes, and rows+1 offsets.
    jpg = batch["jpg"]
    data, offsets = jpg.data.to(torch.int64), jpg.offsets
    lengths = offsets[1:] - offsets[:-1]
    rows = torch.repeat_interleave(torch.arange(len(lengths)), lengths)
    hist = torch.bincount(rows * 256 + data, minlength=len(lengths) * 256).view(len(lengths), 256)
    hist = hist.to(torch.float32) / lengths.clamp(min=1).unsqueeze(1).to(torch.float32)
    return hist.to(device), labels


def save(path, obj):
    """Write a checkpoint whole or not at all."""
    tmp = f"{path}.tmp.{os.getpid()}"
    torch.save(obj, tmp)
    os.replace(tmp, path)


def connect(args, **kwargs):
    """A client of the node's server, trying again while none listens (its pod being
    restarted, say) for up to --connect-timeout seconds."""
    deadline = time.monotonic() + args.connect_timeout
    while True:
        try:
            return shardload.Client(args.socket, **kwargs)
        except shardload.NoServer:
            if time.monotonic() >= deadline:
                raise
            time.sleep(1)


def main(argv=None):
    args = parse_args(argv)
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))

    device = torch.device("cpu")
    if args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available()):
        torch.cuda.set_device(local_rank)  # before the client: it names this GPU to the server
        device = torch.device("cuda", local_rank)
    if world > 1:
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", timeout=datetime.timedelta(seconds=args.timeout))

    torch.manual_seed(args.seed)  # the same initial weights on every rank
    model = (TokenModel if args.input == "tokens" else ByteModel)(args.hidden).to(device)
    optim = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)

    step, state, resumed_from = 0, None, None
    if args.checkpoint and os.path.exists(args.checkpoint):
        ckpt = torch.load(args.checkpoint, map_location="cpu")
        model.load_state_dict(ckpt["model"])
        optim.load_state_dict(ckpt["optim"])
        step, state, resumed_from = ckpt["step"], ckpt["data"], ckpt["step"]
    ddp = torch.nn.parallel.DistributedDataParallel(model) if world > 1 else model

    samples = batches = 0
    loss_first = loss_last = None
    keys = []
    t0 = time.perf_counter()

    saved = [step]  # the step of the last checkpoint written

    def checkpoint(client):
        saved[0] = step
        if rank == 0:
            save(args.checkpoint, {"model": model.state_dict(), "optim": optim.state_dict(),
                                   "data": client.state_dict(), "step": step})
        if world > 1:
            dist.barrier()  # every rank goes on (or stops) only once the file is whole
        if rank == 0:
            print(json.dumps({"checkpoint": args.checkpoint, "step": step}), flush=True)

    # rank, world and local rank come from the same environment variables.
    with connect(args, seed=args.seed, batch_size=args.batch_size, fields=INPUTS[args.input],
                 output="torch", state=state, timeout=args.timeout) as client:
        epoch = client.current_epoch
        epoch_batches = client.batches()
        done = args.steps > 0 and step >= args.steps
        while epoch < args.epochs and not done:
            for batch in epoch_batches:
                x, y = features(args.input, batch, device)
                loss = F.cross_entropy(ddp(x), y)
                optim.zero_grad(set_to_none=True)
                loss.backward()
                optim.step()
                step += 1
                batches += 1
                real = batch.rows - batch.padded  # padding rows repeat samples already read
                samples += real
                loss_last = loss.item()
                if loss_first is None:
                    loss_first = loss_last
                if args.report_keys:
                    keys.extend(batch.keys[:real])
                if args.checkpoint and (step % args.checkpoint_every == 0 or step == args.crash_after_step):
                    checkpoint(client)
                if step == args.crash_after_step:
                    sys.stdout.flush()
                    os.kill(os.getpid(), signal.SIGKILL)
                if args.steps > 0 and step >= args.steps:
                    done = True
                    break
            else:
                epoch += 1
                if epoch < args.epochs:
                    epoch_batches = client.epoch(epoch)
        if args.checkpoint and saved[0] != step:
            checkpoint(client)

    seconds = time.perf_counter() - t0
    out = {"rank": rank, "world": world, "samples": samples, "batches": batches, "steps": step,
           "loss_first": loss_first, "loss_last": loss_last, "resumed_from": resumed_from,
           "seconds": round(seconds, 3), "samples_per_sec": round(samples / seconds, 1) if seconds > 0 else None}
    if args.report_keys:
        out["keys"] = keys
    print(json.dumps(out), flush=True)
    if loss_last is not None and not math.isfinite(loss_last):
        return 1
    if world > 1:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
