#!/usr/bin/env python3
"""The PIL reference of shardload's image field (center transform): what
``NAME=EXT:image:uint8:HxWx3`` should hand out, computed with PIL alone.

    python3 bench/pil_reference.py --size H[xW] [--resize N] [--ext jpg] --out DIR
        [--check-torchvision] SHARD.tar [SHARD.tar ...]

For every sample of the shards (WebDataset's grouping: key = member path up to the
first dot of its basename) that has a member with extension EXT:

    Image.open(member).convert("RGB")
    resize the shorter side to N with Image.BILINEAR (PIL's resize, antialiased),
        the longer side to int(N * long / short)    (torchvision's Resize(N) formula)
    center crop H x W: top = int(round((H' - H) / 2.0)), left = int(round((W' - W) / 2.0))

and writes DIR/KEY.npy (KEY with "/" replaced by "__"), a uint8 array H x W x 3.
N defaults to max(H, W). --size 224 means 224x224. A crop larger than the resized
picture (N < the crop) is an error here (torchvision would pad with zeros).

--check-torchvision also runs torchvision's ``Resize(N)`` + ``CenterCrop((H, W))`` on
the same PIL images and fails unless every array is identical to the reference.

As a module: ``reference(data, height, width, resize=None)`` returns the array for one
encoded picture (bytes), ``tar_members(paths, ext)`` yields (key, bytes) of the shards'
members with extension ext, and ``resized_size`` / ``crop_box`` are the two formulas.
"""

import argparse
import io
import json
import os
import sys
import tarfile

import numpy as np
from PIL import Image


def resized_size(w, h, n):
    """(new_w, new_h) of a w x h picture whose shorter side is resized to n, as
    torchvision's Resize(n): the longer side becomes int(n * long / short)."""
    if w <= h:
        return n, int(n * h / w)
    return int(n * w / h), n


def crop_box(w, h, cw, ch):
    """(left, top, right, bottom) of a cw x ch center crop of a w x h picture, as
    torchvision's CenterCrop (Python's round, half to even)."""
    if cw > w or ch > h:
        raise ValueError(f"a {cw}x{ch} crop of a {w}x{h} picture: the resized picture is smaller than the crop "
                         "(resize to at least max(H, W))")
    top = int(round((h - ch) / 2.0))
    left = int(round((w - cw) / 2.0))
    return left, top, left + cw, top + ch


def open_rgb(data):
    with Image.open(io.BytesIO(data)) as im:
        return im.convert("RGB")


def reference_of(img, height, width, resize=None):
    """The reference transform of an RGB PIL image: uint8 array height x width x 3."""
    n = resize if resize is not None else max(height, width)
    nw, nh = resized_size(img.width, img.height, n)
    if (nw, nh) != img.size:  # as torchvision: an image already that size is kept
        img = img.resize((nw, nh), Image.BILINEAR)
    img = img.crop(crop_box(nw, nh, width, height))
    return np.asarray(img, dtype=np.uint8)


def reference(data, height, width, resize=None):
    """The reference transform of one encoded picture (bytes)."""
    return reference_of(open_rgb(data), height, width, resize)


def torchvision_of(img, height, width, resize=None):
    """The same transform done by torchvision (PIL backend)."""
    from torchvision import transforms

    n = resize if resize is not None else max(height, width)
    t = transforms.Compose([
        transforms.Resize(n, interpolation=transforms.InterpolationMode.BILINEAR),
        transforms.CenterCrop((height, width)),
    ])
    return np.asarray(t(img), dtype=np.uint8)


def sample_key(name):
    """WebDataset's rule: (key, ext) of a member path, or None for a member that is
    not a sample field."""
    slash = name.rfind("/")
    if slash < 0 and name.startswith("__") and name.endswith("__"):
        return None
    base = name[slash + 1:]
    dot = base.find(".")
    if dot <= 0:
        return None
    return name[:slash + 1 + dot], base[dot + 1:].lower()


def tar_members(paths, ext):
    """(key, bytes) of every member with extension ext in the tar files, in order."""
    for path in paths:
        with tarfile.open(path, "r|*") as tf:
            for m in tf:
                if not m.isreg():
                    continue
                ke = sample_key(m.name)
                if ke is None or ke[1] != ext:
                    continue
                yield ke[0], tf.extractfile(m).read()


def parse_size(s):
    """'224' -> (224, 224); '224x160' -> (224, 160) (height, width)."""
    parts = s.lower().split("x")
    try:
        vals = [int(p) for p in parts]
    except ValueError:
        vals = []
    if len(vals) == 1:
        vals = vals * 2
    if len(vals) != 2 or min(vals) < 1:
        raise argparse.ArgumentTypeError(f"size {s!r}: want H or HxW (positive integers)")
    return tuple(vals)


def file_name(key):
    return key.replace("/", "__") + ".npy"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", type=parse_size, required=True, help="crop H or HxW")
    ap.add_argument("--resize", type=int, default=None, help="shorter side before the crop (default max(H, W))")
    ap.add_argument("--ext", default="jpg", help="the member extension to read (default jpg)")
    ap.add_argument("--out", required=True, help="directory for KEY.npy")
    ap.add_argument("--check-torchvision", action="store_true",
                    help="fail unless torchvision's Resize + CenterCrop gives identical arrays")
    ap.add_argument("shards", nargs="+")
    args = ap.parse_args()
    h, w = args.size
    if args.resize is not None and args.resize < 1:
        sys.exit("pil_reference: --resize must be positive")
    os.makedirs(args.out, exist_ok=True)
    seen = set()
    n = same = 0
    diffs = []
    for key, data in tar_members(args.shards, args.ext.lower()):
        if key in seen:
            sys.exit(f"pil_reference: key {key} appears twice in the shards")
        seen.add(key)
        try:
            img = open_rgb(data)
            ref = reference_of(img, h, w, args.resize)
        except (OSError, ValueError) as e:
            sys.exit(f"pil_reference: {key}.{args.ext}: {e}")
        np.save(os.path.join(args.out, file_name(key)), ref)
        n += 1
        if args.check_torchvision:
            tv = torchvision_of(img, h, w, args.resize)
            if tv.shape == ref.shape and np.array_equal(tv, ref):
                same += 1
            else:
                d = int(np.abs(tv.astype(np.int16) - ref.astype(np.int16)).max()) if tv.shape == ref.shape else None
                diffs.append({"key": key, "shape": list(tv.shape), "max_abs_diff": d})
    if n == 0:
        sys.exit(f"pil_reference: no member with extension {args.ext} in {' '.join(args.shards)}")
    summary = {"samples": n, "size": [h, w], "resize": args.resize or max(h, w), "out": args.out}
    if args.check_torchvision:
        summary.update(torchvision_identical=same, torchvision_different=len(diffs))
    print(json.dumps(summary))
    if diffs:
        sys.exit(f"pil_reference: torchvision differs from the PIL reference on {len(diffs)} of {n} samples: "
                 f"{json.dumps(diffs[:5])}")


if __name__ == "__main__":
    main()
