"""A distributed training job for the checkpoint-and-resume integration test
(integration/resume_test.go): one rank of a torch.distributed world (gloo; MASTER_ADDR,
MASTER_PORT, RANK and WORLD_SIZE from the environment) that trains a tiny model with
DistributedDataParallel on batches from ShardloadDataset in a DataLoader.

    resume_trainer.py --socket PATH --dir DIR --epochs N --batch-size B --seed S
                      [--field SPEC ...] [--checkpoint-step K] [--hang-after H] [--resume]

Every batch trained on is appended to DIR/keys-RANK.jsonl as {"run", "epoch", "step",
"keys"}, flushed before the next step. At step K rank 0 saves DIR/checkpoint.pt with
torch.save({"model", "optim", "data": ds.state_dict(), "step"}); after a barrier each
rank prints {"checkpoint": K, "state": its own ds.state_dict(), "types": ...}. At step H
a rank prints {"hanging": H} and waits for stdin to close (the test kills it there or
before). With --resume, every rank loads DIR/checkpoint.pt (rank 0's) and goes on from
there. At each epoch's end it prints {"epoch_end": E, "steps": ...}; at the end
{"done": true, "params": [...]} (the model's parameters as floats). Errors are printed
as {"error": CLASS, "message": TEXT} with exit status 3.
"""

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import shardload  # noqa: E402
from shardload.pytorch import ShardloadDataset  # noqa: E402


def emit(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


STATE_MEMBERS = {"epoch": int, "order": str, "samples": int, "runs": str, "batches": int}


def state_types(st):
    """"ok" when st is a plain dict of the five members, ints and strings; else what is
    wrong."""
    if type(st) is not dict or set(st) != set(STATE_MEMBERS):
        return f"not a dict of {sorted(STATE_MEMBERS)}: {st!r}"
    for k, kind in STATE_MEMBERS.items():
        if type(st[k]) is not kind:
            return f"{k} is {type(st[k]).__name__}, want {kind.__name__}"
    return "ok"


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--socket", required=True)
    p.add_argument("--dir", required=True)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--field", action="append", default=[])
    p.add_argument("--checkpoint-step", type=int, default=0)
    p.add_argument("--hang-after", type=int, default=0)
    p.add_argument("--resume", action="store_true")
    p.add_argument("--run", default="run")
    a = p.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(2, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    optim = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)
    ds = ShardloadDataset(socket_path=a.socket, batch_size=a.batch_size, seed=a.seed,
                          fields=a.field or None, timeout=120)
    loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=0)
    ckpt_path = os.path.join(a.dir, "checkpoint.pt")

    step, first = 0, 0
    if a.resume:
        ckpt = torch.load(ckpt_path)
        model.load_state_dict(ckpt["model"])
        optim.load_state_dict(ckpt["optim"])
        ds.load_state_dict(ckpt["data"])
        step = ckpt["step"]
        first = ckpt["data"]["epoch"]
        emit({"resumed": step, "state": ckpt["data"], "types": state_types(ckpt["data"])})

    log = open(os.path.join(a.dir, f"keys-{rank}.jsonl"), "a")
    try:
        for epoch in range(first, a.epochs):
            ds.set_epoch(epoch)  # keeps a loaded state of this epoch
            for batch in loader:
                step += 1
                label = batch["label"].to(torch.float32)
                x = torch.stack([label / 10.0, (label % 3).to(torch.float32)], dim=1)
                y = ((label % 7) / 7.0).unsqueeze(1)
                optim.zero_grad()
                loss = torch.nn.functional.mse_loss(ddp(x), y)
                loss.backward()
                optim.step()
                log.write(json.dumps({"run": a.run, "epoch": epoch, "step": step, "keys": batch["__key__"]}) + "\n")
                log.flush()
                if step == a.checkpoint_step:
                    st = ds.state_dict()
                    if rank == 0:
                        tmp = ckpt_path + ".tmp"
                        torch.save({"model": model.state_dict(), "optim": optim.state_dict(), "data": st,
                                    "step": step}, tmp)
                        os.replace(tmp, ckpt_path)
                    dist.barrier()  # rank 0's checkpoint is on disk
                    emit({"checkpoint": step, "state": st, "types": state_types(st)})
                if step == a.hang_after:
                    emit({"hanging": step})
                    sys.stdin.read()  # until the test kills this process
            emit({"epoch_end": epoch, "steps": step, "state": ds.state_dict()})
        log.close()
        emit({"done": True, "steps": step,
              "params": [v for t in model.state_dict().values() for v in t.flatten().tolist()]})
        ds.close()
        dist.destroy_process_group()
    except shardload.ShardloadError as e:
        emit({"error": type(e).__name__, "message": str(e)})
        sys.exit(3)


if __name__ == "__main__":
    main()
