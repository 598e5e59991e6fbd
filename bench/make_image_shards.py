#!/usr/bin/env python3
"""Writes a WebDataset image dataset of real-sized, photo-like pictures: tar shards
OUTDIR/images-000000.tar, images-000001.tar, ... of samples ``%08d.jpg`` (or
``.png`` with --format png) + ``%08d.cls`` (an integer label 0..999), encoded by
PIL.

    python3 bench/make_image_shards.py OUTDIR --shards N --samples-per-shard M
        [--seed S] [--width 500 --height 375] [--quality 90] [--detail 44]
        [--format jpg|png]

"Photo-like" means neither flat nor pure noise, so that the JPEG encoder and decoder
do the work they do on photographs: a smooth random colour field (a coarse random
grid upscaled bicubically), a few soft-edged shaded blobs, some straight edges, and
texture at every scale (noise with a 1/f amplitude spectrum, as natural images have,
strong in luminance and weaker in colour) plus a faint grain. --detail scales the
texture and so the encoded size: with the defaults (500x375, quality 90, detail 44)
a JPEG is about 110 KB on average (from about 60 KB for the smallest pictures to
about 170 KB for the largest).

Picture sizes vary so that aspect handling is exercised: 70% are WIDTHxHEIGHT
(landscape), 15% HEIGHTxWIDTH (portrait), 15% have both sides drawn between 300 and
640. Everything is deterministic given --seed (sample i draws from its own generator
seeded with (seed, i)); the bytes also depend on the PIL/libjpeg build that encodes.

Prints the shards' brace pattern (OUTDIR/images-{000000..00000K}.tar) on stdout and
a summary on stderr, and writes OUTDIR/stats.json (counts, bytes, image sizes).
"""

import argparse
import io
import json
import os
import sys
import tarfile

import numpy as np
from PIL import Image

MTIME = 1700000000  # a fixed member mtime, so that the shards are reproducible


def picture_size(rng, width, height):
    """(w, h) of one picture: mostly landscape width x height, some portrait, some other."""
    u = rng.random()
    if u < 0.70:
        return width, height
    if u < 0.85:
        return height, width
    return int(rng.integers(300, 641)), int(rng.integers(300, 641))


def smooth_field(rng, w, h, cells, channels):
    """A smooth random field in [0, 255]: a cells x cells grid of random values
    upscaled bicubically to w x h."""
    gw = max(2, cells)
    gh = max(2, int(round(cells * h / w)))
    grid = rng.integers(0, 256, size=(gh, gw, channels), dtype=np.uint8)
    mode = "RGB" if channels == 3 else "L"
    img = Image.fromarray(grid if channels == 3 else grid[:, :, 0], mode)
    return np.asarray(img.resize((w, h), Image.BICUBIC), dtype=np.float32).reshape(h, w, channels)


def pink(rng, w, h, alpha):
    """Noise with a 1/f^alpha amplitude spectrum (natural images have alpha near 1),
    zero mean and unit standard deviation, h x w."""
    fy = np.fft.fftfreq(h)[:, None]
    fx = np.fft.rfftfreq(w)[None, :]
    f = np.sqrt(fx * fx + fy * fy)
    f[0, 0] = 1.0
    spec = (rng.normal(size=f.shape) + 1j * rng.normal(size=f.shape)) / f**alpha
    spec[0, 0] = 0.0
    t = np.fft.irfft2(spec, s=(h, w))
    return (t / t.std()).astype(np.float32)


def picture(rng, w, h, detail):
    """One photo-like RGB picture (a PIL image, w x h)."""
    # Background: a smooth colour field at two scales.
    img = 0.65 * smooth_field(rng, w, h, int(rng.integers(3, 7)), 3)
    img += 0.35 * smooth_field(rng, w, h, int(rng.integers(8, 16)), 3)
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    # Soft-edged blobs: "objects" with their own colour and shading.
    for _ in range(int(rng.integers(3, 9))):
        cx, cy = rng.random() * w, rng.random() * h
        rx, ry = (0.05 + 0.25 * rng.random()) * w, (0.05 + 0.25 * rng.random()) * h
        theta = rng.random() * np.pi
        c, s = np.cos(theta), np.sin(theta)
        dx, dy = xx - cx, yy - cy
        d = ((c * dx + s * dy) / rx) ** 2 + ((-s * dx + c * dy) / ry) ** 2
        edge = 0.05 + 0.4 * rng.random()  # sharpness of the outline
        alpha = np.clip((1.0 - d) / edge, 0.0, 1.0)[:, :, None]
        colour = rng.integers(0, 256, size=3).astype(np.float32)
        shade = 0.75 + 0.25 * (dy / ry).clip(-1, 1)[:, :, None]  # lit from above
        img = img * (1 - alpha) + alpha * colour * shade
    # A few straight edges (horizons, walls).
    for _ in range(int(rng.integers(0, 3))):
        a, b = rng.normal(size=2)
        span = abs(a) * w + abs(b) * h
        side = ((a * (xx - w / 2) + b * (yy - h / 2)) > (rng.random() - 0.5) * span)[:, :, None]
        img = np.where(side, img * (0.6 + 0.5 * rng.random()), img)
    # Texture at every scale, as photographs have: 1/f noise in luminance, a little
    # in colour, and a faint sensor grain.
    k = detail * (0.8 + 0.4 * rng.random())
    img += k * pink(rng, w, h, 1.0)[:, :, None]
    img += 0.4 * k * np.stack([pink(rng, w, h, 1.3) for _ in range(3)], axis=-1)
    img += rng.normal(0.0, 3.0, size=(h, w, 1)).astype(np.float32)
    return Image.fromarray(np.clip(img, 0, 255).astype(np.uint8), "RGB")


def encode(img, fmt, quality):
    buf = io.BytesIO()
    if fmt == "jpg":
        img.save(buf, format="JPEG", quality=quality)
    else:
        img.save(buf, format="PNG", compress_level=6)
    return buf.getvalue()


def add_member(tf, name, data):
    ti = tarfile.TarInfo(name)
    ti.size = len(data)
    ti.mtime = MTIME
    ti.mode = 0o644
    ti.uname = ti.gname = ""
    tf.addfile(ti, io.BytesIO(data))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("outdir")
    ap.add_argument("--shards", type=int, required=True)
    ap.add_argument("--samples-per-shard", type=int, required=True)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--width", type=int, default=500, help="the common (landscape) width")
    ap.add_argument("--height", type=int, default=375, help="the common (landscape) height")
    ap.add_argument("--quality", type=int, default=90, help="JPEG quality")
    ap.add_argument("--detail", type=float, default=44.0,
                    help="contrast of the texture (sets the encoded size; 44: about 110 KB at 500x375, quality 90)")
    ap.add_argument("--format", choices=("jpg", "png"), default="jpg")
    args = ap.parse_args()
    if args.shards < 1 or args.samples_per_shard < 1:
        sys.exit("make_image_shards: --shards and --samples-per-shard must be at least 1")

    os.makedirs(args.outdir, exist_ok=True)
    sizes, shapes = [], {"landscape": 0, "portrait": 0, "square": 0}
    dims = []
    total = 0
    for s in range(args.shards):
        path = os.path.join(args.outdir, f"images-{s:06d}.tar")
        tmp = path + ".tmp"
        with tarfile.open(tmp, "w", format=tarfile.USTAR_FORMAT) as tf:
            for j in range(args.samples_per_shard):
                i = s * args.samples_per_shard + j
                rng = np.random.default_rng([args.seed, i])
                w, h = picture_size(rng, args.width, args.height)
                data = encode(picture(rng, w, h, args.detail), args.format, args.quality)
                label = int(rng.integers(0, 1000))
                key = f"{i:08d}"
                add_member(tf, f"{key}.{args.format}", data)
                add_member(tf, f"{key}.cls", str(label).encode())
                sizes.append(len(data))
                dims.append((w, h))
                shapes["landscape" if w > h else "portrait" if h > w else "square"] += 1
        os.replace(tmp, path)
        total += os.path.getsize(path)

    a = np.array(sizes, dtype=np.float64)
    stats = {
        "shards": args.shards,
        "samples": len(sizes),
        "format": args.format,
        "seed": args.seed,
        "quality": args.quality if args.format == "jpg" else None,
        "detail": args.detail,
        "common_size": f"{args.width}x{args.height}",
        "tar_bytes": total,
        "image_bytes_mean": float(a.mean()),
        "image_bytes_median": float(np.median(a)),
        "image_bytes_min": int(a.min()),
        "image_bytes_max": int(a.max()),
        "image_bytes_std": float(a.std()),
        "orientation": shapes,
        "distinct_sizes": len(set(dims)),
        "pixels_mean": float(np.mean([w * h for w, h in dims])),
    }
    with open(os.path.join(args.outdir, "stats.json"), "w") as f:
        json.dump(stats, f, indent=1)
    last = args.shards - 1
    print(os.path.join(args.outdir, f"images-{{000000..{last:06d}}}.tar"))
    print(
        f"make_image_shards: {stats['samples']} samples in {args.shards} shards, {total / 1e6:.1f} MB; "
        f"{args.format} mean {a.mean() / 1e3:.1f} KB (median {np.median(a) / 1e3:.1f}, "
        f"min {a.min() / 1e3:.1f}, max {a.max() / 1e3:.1f}); "
        f"{shapes['landscape']} landscape, {shapes['portrait']} portrait, {shapes['square']} square",
        file=sys.stderr,
    )


if __name__ == "__main__":
    main()
