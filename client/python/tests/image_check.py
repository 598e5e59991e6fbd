"""The trainer-side check of image fields, for the integration tests: reads one epoch
from a running `shardload serve` through the Python client with an image field and
compares what arrives with the PIL reference computed from the same tar files.

    image_check.py --socket PATH --field-spec SPEC [--field-spec SPEC ...]
        --shards TAR [TAR ...] [--size 224] [--resize N] [--layout hwc|chw]
        [--check-keys 16] [--max-diff 40] [--max-mean-diff 2.0]
        [--batch-size 8] [--seed 5]

The --field-spec values are the session's fields, in shardload's syntax; exactly one
must be an image field (NAME=EXT:image[:DTYPE[:SHAPE[:OPTIONS]]]), with dtype uint8
and without random-crop or flip (the reference is the center transform). --size,
--resize and --layout default to what the spec says (shape HxWx3 is hwc, 3xHxW chw;
resize=N among the options; the default resize is max(H, W)); when given, they must
agree with it.

Checks, each a failure with a message on stderr and exit status 1:
  - every batch's image column is a torch.uint8 tensor of shape [rows, H, W, 3]
    (hwc) or [rows, 3, H, W] (chw);
  - the epoch holds every sample of the tar files that has the image extension,
    once (with a world of one);
  - for the first K keys received (--check-keys, default 16; 0: all), the pixels
    against bench/pil_reference.py's reference of the same member: each key's mean
    absolute difference below --max-mean-diff (2.0) and every pixel's absolute
    difference at most --max-diff (40). The Go side may decode JPEGs with DCT
    scaling or another IDCT, hence tolerances rather than equality.

Prints one JSON line: samples, batches, keys_checked, mean_abs_diff (over every
checked pixel), worst_key_mean_abs_diff, max_abs_diff, exact_keys (keys identical to
the reference), layout, size, resize, and problems (empty when it passes).
"""

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(HERE, "..", "..", "..", "bench"))

import numpy as np  # noqa: E402

import pil_reference  # noqa: E402
import shardload  # noqa: E402


def parse_image_spec(spec):
    """(name, ext, dtype, shape, options) of an image field spec, or None when the
    spec is not an image field. Raises ValueError for a malformed image spec."""
    parts = spec.split(":")
    if len(parts) < 2 or parts[1] != "image":
        return None
    head = parts[0]
    name, ext = head.split("=", 1) if "=" in head else (head, head)
    ext = ext.lower()
    dtype = parts[2] if len(parts) > 2 else "uint8"
    shape = [224, 224, 3]
    if len(parts) > 3:
        try:
            shape = [int(d) for d in parts[3].split("x")]
        except ValueError:
            raise ValueError(f"field {spec!r}: bad shape {parts[3]!r}") from None
    options = {}
    if len(parts) > 4:
        for o in parts[4].split(","):
            k, _, v = o.partition("=")
            options[k] = v
    return name, ext, dtype, shape, options


def layout_of(shape):
    if len(shape) == 3 and shape[2] == 3:
        return "hwc", shape[0], shape[1]
    if len(shape) == 3 and shape[0] == 3:
        return "chw", shape[1], shape[2]
    return None, None, None


def fail_args(msg):
    sys.exit(f"image_check: {msg}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--socket", required=True)
    ap.add_argument("--field-spec", action="append", required=True, help="a field of the session (repeatable)")
    ap.add_argument("--shards", nargs="+", required=True, help="the tar files the server reads")
    ap.add_argument("--size", type=pil_reference.parse_size, default=None, help="H or HxW (default: the spec's)")
    ap.add_argument("--resize", type=int, default=None, help="shorter side before the crop (default: the spec's)")
    ap.add_argument("--layout", choices=("hwc", "chw"), default=None, help="default: from the spec's shape")
    ap.add_argument("--check-keys", type=int, default=16, help="keys compared with the reference (0: all)")
    ap.add_argument("--max-diff", type=int, default=40, help="largest absolute difference of a pixel allowed")
    ap.add_argument("--max-mean-diff", type=float, default=2.0, help="mean absolute difference of a key must be below")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--seed", type=int, default=5)
    args = ap.parse_args()

    images = []
    for spec in args.field_spec:
        try:
            f = parse_image_spec(spec)
        except ValueError as e:
            fail_args(str(e))
        if f is not None:
            images.append((spec, f))
    if len(images) != 1:
        fail_args(f"want exactly one image field among --field-spec {args.field_spec}, got {len(images)}")
    spec, (name, ext, dtype, shape, options) = images[0]
    if dtype != "uint8":
        fail_args(f"field {spec!r}: dtype {dtype}; this check compares uint8 pixels")
    for o in ("random-crop", "flip"):
        if o in options:
            fail_args(f"field {spec!r}: option {o} is random; the reference is the center transform")
    layout, h, w = layout_of(shape)
    if layout is None:
        fail_args(f"field {spec!r}: shape {shape} is neither HxWx3 nor 3xHxW")
    if args.layout is not None and args.layout != layout:
        fail_args(f"--layout {args.layout} but the spec's shape {shape} is {layout}")
    if args.size is not None and tuple(args.size) != (h, w):
        fail_args(f"--size {args.size[0]}x{args.size[1]} but the spec's shape {shape} is {h}x{w}")
    spec_resize = options.get("resize")
    resize = int(spec_resize) if spec_resize else None
    if args.resize is not None:
        if resize is not None and resize != args.resize:
            fail_args(f"--resize {args.resize} but the spec says resize={resize}")
        resize = args.resize
    if resize is None:
        resize = max(h, w)
    want = (h, w, 3) if layout == "hwc" else (3, h, w)

    import torch

    problems = []
    received = {}  # key -> number of times
    kept = {}  # key -> HWC uint8 array, for the first K keys
    limit = args.check_keys if args.check_keys > 0 else None
    samples = batches = 0
    with shardload.Client(args.socket, batch_size=args.batch_size, fields=args.field_spec, seed=args.seed,
                          output="torch") as c:
        world = c.world
        for b in c:
            batches += 1
            col = b[name]
            if not isinstance(col, torch.Tensor) or col.dtype != torch.uint8 or tuple(col.shape) != (b.rows,) + want:
                what = f"{type(col).__name__} {getattr(col, 'dtype', '')} {list(getattr(col, 'shape', []))}"
                problems.append(f"batch {b.seq}: column {name} is a {what}, want a torch.uint8 tensor "
                                f"{[b.rows] + list(want)}")
                if len(problems) > 10:
                    break
                continue
            real = b.rows - b.padded
            for i, key in enumerate(b.keys[:real]):
                received[key] = received.get(key, 0) + 1
                if key not in kept and (limit is None or len(kept) < limit):
                    px = col[i].clone().numpy()
                    kept[key] = px if layout == "hwc" else px.transpose(1, 2, 0).copy()
            samples += real

    # The reference, from the same tar files.
    refs = {}  # key -> array, or None when the key is in the tars twice
    tar_keys = {}
    for key, data in pil_reference.tar_members(args.shards, ext):
        tar_keys[key] = tar_keys.get(key, 0) + 1
        if key in kept:
            if key in refs:
                refs[key] = None
                continue
            try:
                refs[key] = pil_reference.reference(data, h, w, resize)
            except (OSError, ValueError) as e:
                problems.append(f"{key}.{ext}: no reference: {e}")
    if not tar_keys:
        problems.append(f"no member with extension {ext} in {args.shards}")

    if world == 1 and tar_keys and not problems:
        missing = sorted(set(tar_keys) - set(received))
        extra = sorted(set(received) - set(tar_keys))
        twice = sorted(k for k, n in received.items() if n > tar_keys.get(k, 0))
        if missing:
            problems.append(f"{len(missing)} of {len(tar_keys)} samples not received, e.g. {missing[:5]}")
        if extra:
            problems.append(f"{len(extra)} keys received that no tar holds, e.g. {extra[:5]}")
        if twice:
            problems.append(f"{len(twice)} keys received more often than the tars hold them, e.g. {twice[:5]}")

    checked = 0
    total_abs = 0.0
    total_px = 0
    worst_mean = 0.0
    max_abs = 0
    exact = 0
    for key, px in kept.items():
        ref = refs.get(key)
        if ref is None:
            if key in refs:
                problems.append(f"{key}: in the tars more than once; not compared")
            elif key in tar_keys or not tar_keys:
                pass  # reported above
            else:
                problems.append(f"{key}: received, but no {ext} member in the tars")
            continue
        d = np.abs(px.astype(np.int16) - ref.astype(np.int16))
        checked += 1
        m, mx = float(d.mean()), int(d.max())
        total_abs += float(d.sum())
        total_px += d.size
        worst_mean = max(worst_mean, m)
        max_abs = max(max_abs, mx)
        exact += mx == 0
        if m >= args.max_mean_diff:
            problems.append(f"{key}: mean absolute difference from the PIL reference {m:.3f} >= {args.max_mean_diff}")
        if mx > args.max_diff:
            y, x, ch = np.unravel_index(int(d.argmax()), d.shape)
            problems.append(f"{key}: pixel (y={y}, x={x}, channel {ch}) is {int(px[y, x, ch])}, the reference "
                            f"{int(ref[y, x, ch])}: difference {mx} > {args.max_diff}")
    if checked == 0 and not problems:
        problems.append("no key compared with the reference")

    print(json.dumps({
        "samples": samples, "batches": batches, "keys_checked": checked,
        "mean_abs_diff": total_abs / total_px if total_px else None,
        "worst_key_mean_abs_diff": worst_mean, "max_abs_diff": max_abs, "exact_keys": exact,
        "layout": layout, "size": [h, w], "resize": resize, "problems": problems,
    }))
    sys.stdout.flush()
    if problems:
        sys.exit("image_check: FAILED: " + "; ".join(problems[:10]) + (f" (and {len(problems) - 10} more)" if len(problems) > 10 else ""))


if __name__ == "__main__":
    main()
