#!/usr/bin/env python3
"""Train a tiny GPT on packed token rows from ``shardload serve``: documents of every
length packed online into rows of SEQ_LEN tokens, attention kept inside each document
by a block-diagonal causal mask built from the batch's cu_seqlens, positions from its
position_ids; the loader's position checkpointed with the model and the optimiser, and
resumed from on the same or another number of ranks.

One process, or one per rank under torchrun (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR
and MASTER_PORT from its environment; torch.distributed is initialised when
WORLD_SIZE > 1, gloo on CPU, and gradients are averaged by DistributedDataParallel).
Every rank connects to the shardload server of its node ($SHARDLOAD_SOCKET or
--socket) and asks it for packed rows (--pack, FIELD:SEQ_LEN[:eos=ID][:pad=ID]). CPU
by default: no GPU is needed.

    shardload gen --preset docs --shards 8 --samples 200 /data/docs
    shardload index --output /data/docs/ '/data/docs/train-{000000..000007}.tar'
    shardload serve '/data/docs/train-{000000..000007}.tar' &
    torchrun --redirects 1 --tee 1 --nproc_per_node 2 examples/train_gpt.py --checkpoint /tmp/gpt.pt

The default --pack, tokens.npy:128:eos=1:pad=0, reads the docs preset of ``shardload
gen`` (uint16 ids in 2..1023: 0 and 1 are left for pad and eos); a Megatron-LM
dataset (``shardload serve s3://corpus/web.idx``) is --pack tokens:SEQ_LEN:eos=ID with
--vocab above its largest id.

Each batch holds input_ids and position_ids [B, SEQ_LEN] (int64), cu_seqlens (int32:
the start of every segment over the flattened B*SEQ_LEN tokens, then B*SEQ_LEN) and
max_seqlen; its last ``padded`` rows are all pad. A segment is a document's part in
one row (a document longer than the rest of a row continues in the next one, and its
part there is a segment of its own). A token attends to the tokens of its segment up
to itself and to nothing else, and the loss predicts each token from those before it
in its segment: never across a document's end, never a pad token.

With --checkpoint PATH, rank 0 saves the model, the optimiser, the tokens trained on
and the loader's state (the client's state_dict(): the same on every rank at the same
step, which every checkpoint checks) every --checkpoint-every steps and at the end. A
restarted job resumes from PATH, with the same or another number of ranks: the rows of
an epoch do not depend on the world size, and the resumed job reads exactly the rows
the checkpoint's job had not read. --crash-after-step N rehearses a failure: every
rank kills itself (SIGKILL) after the checkpoint of step N.

At the end each rank prints one JSON line: rank, world, rows (the rows it trained on,
pad rows not counted), tokens (their tokens), targets (the tokens the loss predicted),
batches, steps, loss_first, loss_last, resumed_from (the step the run resumed at, or
null), digest (an order-free digest of its rows: the sum of their digests modulo
2**64, in hexadecimal; digests of several ranks add up the same way) and, with
--report-rows, row_digests (each row's digest, in order). --check-mask checks the
mask and the model's isolation of documents on synthetic packed rows, without a
server, and prints one JSON line.
"""

import argparse
import datetime
import hashlib
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


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--socket", help="the server's socket (default: $SHARDLOAD_SOCKET, else the server's default path)")
    p.add_argument("--pack", default="tokens.npy:128:eos=1:pad=0",
                   help="the packing spec, FIELD:SEQ_LEN[:eos=ID][:pad=ID] (default tokens.npy:128:eos=1:pad=0, "
                        "the docs preset of shardload gen)")
    p.add_argument("--vocab", type=int, default=1024, help="vocabulary size: every token id is below it (default 1024)")
    p.add_argument("--epochs", type=int, default=1, help="epochs to train (counting those before a resume)")
    p.add_argument("--steps", type=int, default=0, help="stop after this many steps in all (0: no limit)")
    p.add_argument("--batch-size", type=int, default=8, help="rows per batch and rank")
    p.add_argument("--seed", type=int, default=0, help="seed of the loader's order and of the model's weights")
    p.add_argument("--lr", type=float, default=3e-3, help="peak learning rate of AdamW (default 3e-3)")
    p.add_argument("--warmup", type=float, default=0.05, help="share of the training's tokens spent warming up")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--device", default="cpu", help="cpu (default), cuda (each rank on GPU LOCAL_RANK) or auto")
    p.add_argument("--checkpoint", help="checkpoint file: resumed from when it exists, written by rank 0")
    p.add_argument("--checkpoint-every", type=int, default=50, help="steps between checkpoints (default 50)")
    p.add_argument("--crash-after-step", type=int, default=0,
                   help="rehearse a failure: after the checkpoint of this step, every rank kills itself (SIGKILL)")
    p.add_argument("--report-rows", action="store_true", help="list the digest of every row trained on in the JSON line")
    p.add_argument("--check-mask", action="store_true", help="check the mask and the model on synthetic rows, and exit")
    p.add_argument("--timeout", type=float, default=300, help="seconds to wait for the server at most")
    p.add_argument("--connect-timeout", type=float, default=0,
                   help="seconds to keep trying while no server listens on the socket (a node's server restarting)")
    return p.parse_args(argv)


class Spec:
    """A packing spec, FIELD:SEQ_LEN[:eos=ID][:pad=ID], as the server reads it: pad
    defaults to eos, else 0."""

    def __init__(self, text):
        parts = text.split(":")
        if len(parts) < 2 or not parts[0]:
            raise SystemExit(f"--pack {text!r}: want FIELD:SEQ_LEN[:eos=ID][:pad=ID]")
        self.text, self.field, self.seq_len = text, parts[0], int(parts[1])
        opts = {}
        for kv in parts[2:]:
            k, _, v = kv.partition("=")
            if k not in ("eos", "pad") or not v:
                raise SystemExit(f"--pack {text!r}: {kv!r} is neither eos=ID nor pad=ID")
            opts[k] = int(v)
        self.eos = opts.get("eos")
        self.pad = opts.get("pad", 0 if self.eos is None else self.eos)


# -- the mask --------------------------------------------------------------------------

def segments_from_cu_seqlens(cu_seqlens, batch, seq_len):
    """Segment ids [batch, seq_len] from cu_seqlens (0, every segment's start over the
    flattened batch, then batch*seq_len): tokens of the same segment share an id, and
    no two segments do."""
    n = batch * seq_len
    cu = cu_seqlens.to(torch.int64)
    if cu.dim() != 1 or len(cu) < 2 or int(cu[0]) != 0 or int(cu[-1]) != n or bool((cu[1:] <= cu[:-1]).any()):
        raise ValueError(f"cu_seqlens {cu.tolist()[:8]}...: want 0, increasing segment starts, then {n}")
    starts = torch.zeros(n, dtype=torch.int64, device=cu.device)
    starts[cu[:-1]] = 1
    return starts.cumsum(0).view(batch, seq_len)


def segments_from_position_ids(position_ids):
    """Segment ids [batch, seq_len] from position_ids (0 where a segment starts): what
    HF's position-id packing reads; equal to segments_from_cu_seqlens of the batch."""
    return (position_ids.flatten() == 0).to(torch.int64).cumsum(0).view(position_ids.shape)


def block_causal_mask(segments):
    """[batch, 1, seq_len, seq_len] bool: query i may attend key j when both are of
    the same segment and j <= i (block-diagonal and causal)."""
    s = segments.shape[-1]
    same = segments.unsqueeze(2) == segments.unsqueeze(1)
    causal = torch.ones(s, s, dtype=torch.bool, device=segments.device).tril()
    return (same & causal).unsqueeze(1)


def loss_targets(input_ids, segments, spec, real_rows):
    """The next-token targets [batch, seq_len-1] and where they count: the next token
    is of the same segment, the row is not a pad row, and (when pad is no eos) the
    target is not pad."""
    targets = input_ids[:, 1:]
    valid = segments[:, 1:] == segments[:, :-1]
    if spec.pad != spec.eos:
        valid = valid & (targets != spec.pad)
    valid[real_rows:] = False
    return targets, valid


# -- the model -------------------------------------------------------------------------

class Block(torch.nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = torch.nn.LayerNorm(dim), torch.nn.LayerNorm(dim)
        self.qkv, self.proj = torch.nn.Linear(dim, 3 * dim), torch.nn.Linear(dim, dim)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(dim, 4 * dim), torch.nn.GELU(), torch.nn.Linear(4 * dim, dim))

    def forward(self, x, mask):
        b, s, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(d // self.heads)
        # Every query attends to itself at least: no row of the mask is empty.
        att = att.masked_fill(~mask, float("-inf")).softmax(-1)
        x = x + self.proj((att @ v).transpose(1, 2).reshape(b, s, d))
        return x + self.mlp(self.ln2(x))


class GPT(torch.nn.Module):
    """A GPT of a few pre-norm transformer blocks, its output tied to its embedding.
    forward takes input_ids and position_ids [batch, seq_len] and the mask of
    block_causal_mask; a fused varlen kernel (flash-attention's
    flash_attn_varlen_func(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen,
    causal=True)) computes the same attention from cu_seqlens directly."""

    def __init__(self, vocab, seq_len, dim, layers, heads):
        super().__init__()
        self.tok = torch.nn.Embedding(vocab, dim)
        self.pos = torch.nn.Embedding(seq_len, dim)
        self.blocks = torch.nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.ln = torch.nn.LayerNorm(dim)
        torch.nn.init.normal_(self.tok.weight, std=0.02)
        torch.nn.init.normal_(self.pos.weight, std=0.02)

    def forward(self, input_ids, position_ids, mask):
        x = self.tok(input_ids) + self.pos(position_ids)
        for block in self.blocks:
            x = block(x, mask)
        return self.ln(x) @ self.tok.weight.t()


# -- rows and their digests ------------------------------------------------------------

def row_digest(row):
    """A row's digest: the first 8 bytes of the SHA-256 of its tokens as little-endian
    int64, in hexadecimal."""
    return hashlib.sha256(row.to(torch.int64).numpy().astype("<i8").tobytes()).hexdigest()[:16]


# -- the check without a server --------------------------------------------------------

def pack_rows(docs, seq_len, eos, pad, batch):
    """A reference packing of docs (lists of ids) into batch rows: concatenated, eos
    after each, a document continuing into the next row; the rest filled with pad.
    Returns input_ids, position_ids and cu_seqlens as the server writes them."""
    flat, pos = [], []
    p = 0
    for d in docs:
        for t in d + [eos]:
            if len(flat) % seq_len == 0:
                p = 0
            flat.append(t)
            pos.append(p)
            p += 1
        p = 0  # after an eos
    while len(flat) < batch * seq_len:
        if len(flat) % seq_len == 0:
            p = 0
        flat.append(pad)
        pos.append(p)
        p += 1
    ids = torch.tensor(flat[:batch * seq_len]).view(batch, seq_len)
    position_ids = torch.tensor(pos[:batch * seq_len]).view(batch, seq_len)
    starts = [i for i, q in enumerate(pos[:batch * seq_len]) if q == 0]
    return ids, position_ids, torch.tensor(starts + [batch * seq_len], dtype=torch.int32)


def check_mask(args):
    """The mask from cu_seqlens equals the one from position_ids and the brute-force
    definition; the model's outputs for a document do not change when another
    document of the row does, and do when an earlier token of its own does; no loss
    target crosses a segment."""
    g = torch.Generator().manual_seed(5)
    seq_len, batch, eos, pad = 32, 4, 1, 0
    spec = Spec(f"tokens:{seq_len}:eos={eos}:pad={pad}")
    docs = [[2 + int(t) for t in torch.randint(0, 200, (int(n),), generator=g)]
            for n in torch.randint(1, 40, (7,), generator=g)]
    ids, pos, cu = pack_rows(docs, seq_len, eos, pad, batch)
    seg = segments_from_cu_seqlens(cu, batch, seq_len)
    if not torch.equal(seg, segments_from_position_ids(pos)):
        raise SystemExit("the segments from cu_seqlens and from position_ids differ")
    mask = block_causal_mask(seg)
    if not torch.equal(mask, block_causal_mask(segments_from_position_ids(pos))):
        raise SystemExit("the masks from cu_seqlens and from position_ids differ")
    # Brute force: the document index and the row of every token.
    doc_of, n = [], 0
    for di, dd in enumerate(docs):
        doc_of += [di] * (len(dd) + 1)
    doc_of += [-1] * (batch * seq_len - len(doc_of))
    doc_of = torch.tensor(doc_of[:batch * seq_len]).view(batch, seq_len)
    for b in range(batch):
        for i in range(seq_len):
            for j in range(seq_len):
                want = j <= i and bool(doc_of[b, i] == doc_of[b, j])
                if bool(mask[b, 0, i, j]) != bool(want):
                    raise SystemExit(f"mask[{b}, {i}, {j}] is {bool(mask[b, 0, i, j])}, want {want}")
                n += want
    rows_with_two = sum(1 for b in range(batch) if len(set(doc_of[b].tolist())) > 1)
    if rows_with_two < 2:
        raise SystemExit("the synthetic rows hold too few documents to check anything")
    targets, valid = loss_targets(ids, seg, spec, batch)
    if bool((valid & (seg[:, 1:] != seg[:, :-1])).any()) or bool((valid & (targets == pad)).any()):
        raise SystemExit("a loss target crosses a segment or is pad")

    # Isolation: change the tokens of one document; the outputs at every other
    # document's tokens stay, those at its own tokens after the first change.
    torch.manual_seed(0)
    model = GPT(256, seq_len, 32, 2, 4).eval()
    # The first document of a row that holds another after it.
    b = next(b for b in range(batch) if len(set(doc_of[b].tolist()) - {-1}) > 1)
    victim = int(doc_of[b, 0])
    where = doc_of == victim
    changed = ids.clone()
    changed[where] = 2 + (changed[where] + 17) % 200
    with torch.no_grad():
        out, out2 = model(ids, pos, mask), model(changed, pos, mask)
        leak = (out - out2).abs().amax(-1)
        if float(leak[~where].max()) != 0.0:
            raise SystemExit(f"changing document {victim} changed other documents' outputs by {float(leak[~where].max())}")
        if float(leak[where].min()) == 0.0 and int(where.sum()) > 0:
            raise SystemExit(f"changing every token of document {victim} left one of its outputs as it was")
        # Without the mask's blocks (causal only), the change leaks: the check can fail.
        causal = torch.ones(seq_len, seq_len, dtype=torch.bool).tril().expand(batch, 1, seq_len, seq_len)
        leak_causal = (model(ids, pos, causal) - model(changed, pos, causal)).abs().amax(-1)
        if float(leak_causal[~where].max()) == 0.0:
            raise SystemExit("a causal mask without blocks leaks nothing either: the check is void")
    print(json.dumps({"check_mask": "ok", "rows": batch, "seq_len": seq_len, "documents": len(docs),
                      "segments": len(cu) - 1, "attended_pairs": n}), flush=True)
    return 0


# -- training --------------------------------------------------------------------------

def save(path, obj):
    """Write a checkpoint whole or not at all."""
    tmp = f"{path}.tmp.{os.getpid()}"
    torch.save(obj, tmp)
    os.replace(tmp, path)


def connect(args, **kwargs):
    """A client of the node's server, trying again while none listens for up to
    --connect-timeout seconds."""
    deadline = time.monotonic() + args.connect_timeout
    while True:
        try:
            return shardload.Client(args.socket, **kwargs)
        except shardload.NoServer:
            if time.monotonic() >= deadline:
                raise
            time.sleep(1)


def lr_at(args, done, total):
    """Linear warmup over --warmup of the training's tokens, then cosine decay to a
    tenth, by the tokens of every rank trained on so far: the same schedule whatever
    the world size."""
    frac = min(done / max(total, 1), 1.0)
    if frac < args.warmup:
        return args.lr * (frac / args.warmup)
    t = (frac - args.warmup) / max(1 - args.warmup, 1e-9)
    return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))


def main(argv=None):
    args = parse_args(argv)
    if args.check_mask:
        return check_mask(args)
    spec = Spec(args.pack)
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
    model = GPT(args.vocab, spec.seq_len, args.dim, args.layers, args.heads).to(device)
    optim = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)

    step, state, resumed_from, done_tokens = 0, None, None, 0
    if args.checkpoint and os.path.exists(args.checkpoint):
        ckpt = torch.load(args.checkpoint, map_location="cpu")
        model.load_state_dict(ckpt["model"])
        optim.load_state_dict(ckpt["optim"])
        step, state, resumed_from, done_tokens = ckpt["step"], ckpt["data"], ckpt["step"], ckpt["tokens"]
    ddp = torch.nn.parallel.DistributedDataParallel(model) if world > 1 else model

    rows = tokens = targets_seen = batches = 0
    loss_first = loss_last = None
    digests, digest = [], 0
    saved = [step]  # the step of the last checkpoint written
    t0 = time.perf_counter()

    def checkpoint(client):
        saved[0] = step
        data = client.state_dict()
        if world > 1:
            states = [None] * world
            dist.all_gather_object(states, data)
            if any(s != data for s in states):
                raise SystemExit(f"rank {rank}: the loader's states of the ranks differ at step {step}: {states}")
        if rank == 0:
            save(args.checkpoint, {"model": model.state_dict(), "optim": optim.state_dict(), "data": data,
                                   "step": step, "tokens": done_tokens, "pack": spec.text})
        if world > 1:
            dist.barrier()  # every rank goes on (or stops) only once the file is whole
        if rank == 0:
            print(json.dumps({"checkpoint": args.checkpoint, "step": step, "data": data}), flush=True)

    # rank, world and local rank come from the same environment variables.
    with connect(args, seed=args.seed, batch_size=args.batch_size, pack=spec.text, output="torch",
                 state=state, timeout=args.timeout) as client:
        epoch = client.current_epoch
        # Every rank trains on world x batch_size rows a step: the schedule's length
        # in tokens, the same on any world size (up to the last step's pad rows).
        total_tokens = args.epochs * client.epoch_batches * world * args.batch_size * spec.seq_len
        epoch_batches = client.batches()
        stop = args.steps > 0 and step >= args.steps
        while epoch < args.epochs and not stop:
            for batch in epoch_batches:
                ids, pos, cu = batch["input_ids"], batch["position_ids"], batch["cu_seqlens"]
                b, s = ids.shape
                if s != spec.seq_len:
                    raise SystemExit(f"rows of {s} tokens, the spec says {spec.seq_len}")
                real = batch.rows - batch.padded  # the last padded rows are all pad
                top = int(ids.max())
                if top >= args.vocab:
                    raise SystemExit(f"token id {top} in batch {batch.seq}: --vocab {args.vocab} is too small")
                seg = segments_from_cu_seqlens(cu, b, s)
                if not torch.equal(seg, segments_from_position_ids(pos)):
                    raise SystemExit(f"batch {batch.seq}: cu_seqlens and position_ids disagree")
                for r in range(real):
                    h = row_digest(ids[r])
                    digest = (digest + int(h, 16)) % (1 << 64)
                    if args.report_rows:
                        digests.append(h)
                ids, pos, seg = ids.to(device), pos.to(device), seg.to(device)
                targets, valid = loss_targets(ids, seg, spec, real)
                count = valid.sum().to(torch.float32)
                if world > 1:  # the loss is the mean over every rank's targets
                    dist.all_reduce(count)
                for group in optim.param_groups:
                    group["lr"] = lr_at(args, done_tokens, total_tokens)
                logits = ddp(ids, pos, block_causal_mask(seg))[:, :-1]
                losses = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction="none")
                loss_sum = (losses * valid.reshape(-1)).sum()
                # DDP averages the gradients of the ranks: scaled by world, they are
                # those of the sum over every rank's targets over their count.
                loss = loss_sum * world / count.clamp(min=1)
                optim.zero_grad(set_to_none=True)
                loss.backward()
                optim.step()
                mean = loss_sum.detach().clone()
                if world > 1:
                    dist.all_reduce(mean)
                loss_last = float(mean / count.clamp(min=1))
                if loss_first is None:
                    loss_first = loss_last
                step += 1
                batches += 1
                rows += real
                tokens += real * s
                targets_seen += int(valid.sum())
                done_tokens += world * b * s
                if args.checkpoint and (step % args.checkpoint_every == 0 or step == args.crash_after_step):
                    checkpoint(client)
                if step == args.crash_after_step:
                    sys.stdout.flush()
                    os.kill(os.getpid(), signal.SIGKILL)
                if args.steps > 0 and step >= args.steps:
                    stop = True
                    break
            else:
                epoch += 1
                if epoch < args.epochs:
                    epoch_batches = client.epoch(epoch)
        if args.checkpoint and saved[0] != step:
            checkpoint(client)

    seconds = time.perf_counter() - t0
    out = {"rank": rank, "world": world, "rows": rows, "tokens": tokens, "targets": targets_seen,
           "batches": batches, "steps": step, "loss_first": loss_first, "loss_last": loss_last,
           "resumed_from": resumed_from, "digest": f"{digest:016x}", "seconds": round(seconds, 3),
           "tokens_per_sec": round(tokens / seconds, 1) if seconds > 0 else None}
    if args.report_rows:
        out["row_digests"] = digests
    print(json.dumps(out), flush=True)
    if loss_last is not None and not math.isfinite(loss_last):
        return 1
    if world > 1:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
