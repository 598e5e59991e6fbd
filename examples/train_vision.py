#!/usr/bin/env python3
"""Train an image classifier (torchvision's ResNet-18, or a small CNN without
torchvision) on JPEG shards through ``shardload serve``, the PyTorch way: a
ShardloadDataset in a DataLoader, the loader's position checkpointed with the model,
the optimiser and the learning-rate schedule, and resumed from after a restart.

One process, or one per rank under torchrun (RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR and MASTER_PORT from its environment; DistributedDataParallel over gloo,
or NCCL on GPUs). The server decodes, crops and normalises the images
(RandomResizedCrop + flip + ImageNet's mean and std, as torchvision's transforms
would) into float32 [batch, 3, H, W] tensors in shared memory: no DataLoader workers,
no decoding in Python.

    python3 bench/make_image_shards.py /data/img --shards 8 --samples-per-shard 500
    shardload index --output /data/img/ '/data/img/images-{000000..000007}.tar'
    shardload serve '/data/img/images-{000000..000007}.tar' &
    torchrun --redirects 1 --tee 1 --nproc_per_node 2 examples/train_vision.py \\
        --epochs 2 --checkpoint /tmp/vision.pt

(--redirects 1 --tee 1 lets Debian's torchrun of PyTorch 1.13 start on Python 3.11
and later, and changes nothing elsewhere: each rank's lines come prefixed with
[default<rank>]:.)

The samples are WebDataset's: a .jpg (any size) and a .cls label (0..--classes-1).
len(loader) is the batches each rank gets per epoch (the same on every rank), which
sizes the learning-rate schedule. With --checkpoint PATH, rank 0 saves everything
every --checkpoint-every steps and at the end, and a restarted job (the same or
another world size: the loader's state is elastic) resumes from PATH, reading the
batches the job would have read had it not stopped. --crash-after-step N rehearses
a failure: every rank kills itself after the checkpoint of step N.

At the end each rank prints one JSON line: rank, world, model, samples, batches,
steps, loss_first, loss_last, resumed_from (the step resumed at, or null),
batches_per_epoch (len of the loader) and, with --report-keys, the keys trained on.
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
from shardload.pytorch import ShardloadDataset  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--socket", help="the server's socket (default: $SHARDLOAD_SOCKET, else the server's default path)")
    p.add_argument("--epochs", type=int, default=1, help="epochs to train (counting those before a resume)")
    p.add_argument("--batch-size", type=int, default=32, help="samples per batch and rank")
    p.add_argument("--image-size", type=int, default=224, help="the crop's side (default 224)")
    p.add_argument("--classes", type=int, default=1000, help="labels are 0 to this minus 1 (default 1000)")
    p.add_argument("--model", choices=["auto", "resnet18", "small"], default="auto",
                   help="resnet18 (torchvision), small (a 3-layer CNN), auto: resnet18 when torchvision is there")
    p.add_argument("--seed", type=int, default=0, help="seed of the loader's order and augmentation, and of the weights")
    p.add_argument("--lr", type=float, default=0.1, help="peak learning rate of the one-cycle schedule")
    p.add_argument("--device", default="cpu", help="cpu (default), cuda (each rank on GPU LOCAL_RANK) or auto")
    p.add_argument("--checkpoint", help="checkpoint file: resumed from when it exists, written by rank 0")
    p.add_argument("--checkpoint-every", type=int, default=100, help="steps between checkpoints (default 100)")
    p.add_argument("--crash-after-step", type=int, default=0,
                   help="rehearse a failure: after the checkpoint of this step, every rank kills itself (SIGKILL)")
    p.add_argument("--report-keys", action="store_true", help="list the keys trained on in the JSON line")
    p.add_argument("--timeout", type=float, default=300, help="seconds to wait for the server at most")
    return p.parse_args(argv)


class SmallCNN(torch.nn.Module):
    """Three conv layers and a linear head: for machines without torchvision."""

    def __init__(self, classes):
        super().__init__()
        self.body = torch.nn.Sequential(
            torch.nn.Conv2d(3, 16, 3, stride=2, padding=1), torch.nn.ReLU(),
            torch.nn.Conv2d(16, 32, 3, stride=2, padding=1), torch.nn.ReLU(),
            torch.nn.Conv2d(32, 64, 3, stride=2, padding=1), torch.nn.ReLU(),
            torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten())
        self.head = torch.nn.Linear(64, classes)

    def forward(self, x):
        return self.head(self.body(x))


def make_model(name, classes):
    if name in ("auto", "resnet18"):
        try:
            import torchvision
            return "resnet18", torchvision.models.resnet18(num_classes=classes)
        except ImportError:
            if name == "resnet18":
                raise
    return "small", SmallCNN(classes)


def save(path, obj):
    """Write a checkpoint whole or not at all."""
    tmp = f"{path}.tmp.{os.getpid()}"
    torch.save(obj, tmp)
    os.replace(tmp, path)


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
    name, model = make_model(args.model, args.classes)
    model = model.to(device)
    ddp = torch.nn.parallel.DistributedDataParallel(model) if world > 1 else model

    s = args.image_size
    ds = ShardloadDataset(socket_path=args.socket, batch_size=args.batch_size, seed=args.seed, timeout=args.timeout,
                          fields=[f"img=jpg:image:float32:3x{s}x{s}:random-crop,flip,imagenet", "label=cls"])
    loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=0)

    step, resumed_from, ckpt = 0, None, None
    if args.checkpoint and os.path.exists(args.checkpoint):
        ckpt = torch.load(args.checkpoint, map_location="cpu")
        model.load_state_dict(ckpt["model"])
        ds.load_state_dict(ckpt["data"])
        step, resumed_from = ckpt["step"], ckpt["step"]
    per_epoch = len(loader)  # the batches every rank gets in an epoch
    optim = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=1e-4)
    sched = torch.optim.lr_scheduler.OneCycleLR(optim, max_lr=args.lr, total_steps=max(per_epoch * args.epochs, 1))
    if ckpt is not None:
        optim.load_state_dict(ckpt["optim"])
        sched.load_state_dict(ckpt["sched"])

    def checkpoint():
        if rank == 0:
            save(args.checkpoint, {"model": model.state_dict(), "optim": optim.state_dict(), "sched": sched.state_dict(),
                                   "data": ds.state_dict(), "step": step})
        if world > 1:
            dist.barrier()  # every rank goes on (or stops) only once the file is whole
        if rank == 0:
            print(json.dumps({"checkpoint": args.checkpoint, "step": step}), flush=True)

    samples = batches = 0
    loss_first = loss_last = None
    keys = []
    saved = step
    t0 = time.perf_counter()
    model.train()
    first_epoch = ds.state_dict()["epoch"]  # the epoch a loaded state is in
    for _ in range(first_epoch, args.epochs):
        for batch in loader:
            x = batch["img"].to(device, non_blocking=True)   # [B, 3, S, S] float32, normalised
            y = batch["label"].to(device, non_blocking=True)
            loss = F.cross_entropy(ddp(x), y)
            optim.zero_grad(set_to_none=True)
            loss.backward()
            optim.step()
            if sched.last_epoch + 1 < sched.total_steps:
                sched.step()
            step += 1
            batches += 1
            samples += len(y)
            loss_last = loss.item()
            if loss_first is None:
                loss_first = loss_last
            if args.report_keys:
                keys.extend(batch["__key__"])
            if args.checkpoint and (step % args.checkpoint_every == 0 or step == args.crash_after_step):
                checkpoint()
                saved = step
            if step == args.crash_after_step:
                sys.stdout.flush()
                os.kill(os.getpid(), signal.SIGKILL)
    if args.checkpoint and saved != step:
        checkpoint()
    ds.close()

    seconds = time.perf_counter() - t0
    out = {"rank": rank, "world": world, "model": name, "samples": samples, "batches": batches, "steps": step,
           "loss_first": loss_first, "loss_last": loss_last, "resumed_from": resumed_from,
           "batches_per_epoch": per_epoch, "seconds": round(seconds, 3)}
    if args.report_keys:
        out["keys"] = keys
    print(json.dumps(out), flush=True)
    if world > 1:
        dist.destroy_process_group()
    if loss_last is not None and not math.isfinite(loss_last):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
