#!/usr/bin/env python3
"""The baseline shardload is measured against: what our users run today.

A PyTorch ``DataLoader(ds, batch_size=32, num_workers=2)`` with its defaults (no
pinned memory, workers re-created every epoch, prefetch_factor 2) over an
``IterableDataset`` that streams WebDataset tar shards over HTTP with ``urllib``
(plain GETs of public-read object URLs) and Python's ``tarfile`` in streaming mode.
Shards are split across workers with ``get_worker_info``; members are grouped into
samples by WebDataset's rules (key = member path up to the first dot of its basename,
a new sample whenever the key changes); each sample is decoded to tensors (``cls`` ->
int label, ``*npy`` -> ``numpy.load`` -> tensor, anything else -> raw bytes as a
``torch.uint8`` tensor) and a ``collate_fn`` builds a dict per batch (labels and
equal-shaped tensors stacked, ragged byte tensors as a list).

Image mode (``--image SIZE``): the usual image-classification input pipeline instead.
In the DataLoader workers, each sample's ``--image-field`` member (default jpg) is
decoded with PIL (``Image.open(...).convert("RGB")``) and transformed with
torchvision's ``Resize(SIZE)`` (bilinear, PIL backend: the shorter side to SIZE),
``CenterCrop(SIZE)`` and ``PILToTensor()`` into a uint8 tensor [3, SIZE, SIZE]; ``cls``
becomes an int label; the sample's other members are read and dropped. Batches are
built by PyTorch's default collate (images stacked into [B, 3, SIZE, SIZE], labels
into an int64 tensor). This is what `shardload bench --field img=jpg:image:uint8:3xSxS
--field cls` does, on the same shards.

A simulated trainer sleeps ``--step-time`` seconds per batch; the time the loop spends
blocked in ``next()`` is the trainer's wait.

Usage:
    python3 bench/dataloader_baseline.py --urls-file URLS [--batch-size 32]
        [--workers 2] [--epochs 1 | --batches N] [--step-time 0.05]
        [--image SIZE [--image-field jpg]] [--json]

URLS holds one http(s) URL per line (blank lines and lines starting with # are
ignored). With --json it prints one JSON object with the keys of ``shardload bench
--json`` where meaningful:

    samples, batches, bytes_in (bytes received over HTTP), bytes_out (bytes of the
    tensors in the batches: payloads plus 8 per int64 label), seconds (wall time from
    before the DataLoader is created to the last batch, step sleeps included),
    samples_per_sec, mb_per_sec (bytes_out, MB = 1e6 bytes), mb_per_sec_in (bytes_in),
    first_batch_seconds, peak_rss_bytes, wait_fraction (time blocked in next() after
    the first batch / (that + the simulated step time)), wait_seconds, cpu_seconds,
    cpu_seconds_per_sample, cpu_seconds_startup, workers_reaped, plus the
    configuration.

cpu_seconds is the user + system CPU time of the whole run: this process from its
start (interpreter and torch import included: cpu_seconds_startup is that part, the
CPU time used before the DataLoader is created) plus its DataLoader workers. It is
read with getrusage(RUSAGE_SELF) + getrusage(RUSAGE_CHILDREN) at the end, after every
worker has exited and been reaped (waited for: only reaped children count in
RUSAGE_CHILDREN). Workers are not persistent, so the DataLoader joins them when its
epoch ends (or when its iterator is dropped); before reading the counters the script
also waits until this process has no child left, living or zombie (up to 10 s).
workers_reaped says whether that happened; if not, cpu_seconds misses the workers
still there. cpu_seconds_per_sample is cpu_seconds / samples.

peak_rss_bytes is VmHWM (peak resident set) from /proc/PID/status of the main
process plus the largest sum over the workers of one epoch. Workers exit when their
epoch ends, so theirs is sampled after every batch while they live (VmHWM is a
high-water mark, so the last sample is within one batch of their peak).

Whole-shard compression is detected from the first bytes of the first shard, as
shardload does: gzip, bzip2 and xz go to tarfile's own "r|*"; zstd needs the
``zstandard`` module (Debian: python3-zstandard) or Python 3.14's
``compression.zstd``. Without either, a zstd dataset is not run and the output is
``{"skipped": "no zstd in Python", ...}`` with exit status 0.
"""

import argparse
import io
import json
import multiprocessing
import os
import resource
import sys
import tarfile
import time
import urllib.request

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
HTTP_TIMEOUT = 60  # seconds, per socket operation


def zstd_stream_reader():
    """Returns a function f(fileobj) -> decompressed fileobj, or None."""
    if os.environ.get("BASELINE_NO_ZSTD"):  # to test the skip path
        return None
    try:
        import zstandard

        def open_zstandard(f):
            # read_across_frames: shards may be written as several frames.
            return zstandard.ZstdDecompressor().stream_reader(f, read_across_frames=True)

        return open_zstandard
    except ImportError:
        pass
    try:
        from compression import zstd  # Python 3.14+

        return lambda f: zstd.ZstdFile(f, mode="rb")
    except ImportError:
        return None


class CountingReader(io.RawIOBase):
    """A read-only stream that counts the bytes read through it."""

    def __init__(self, f):
        self.f = f
        self.n = 0

    def readable(self):
        return True

    def readinto(self, b):
        n = self.f.readinto(b)
        if n:
            self.n += n
        return n

    def read(self, size=-1):
        data = self.f.read(size)
        self.n += len(data)
        return data


def sample_key(name):
    """WebDataset's rule: (key, ext) of a member path, or None for a member that is
    not a sample field (a basename without a dot or starting with one, a top-level
    __name__ metadata member)."""
    slash = name.rfind("/")
    if slash < 0 and name.startswith("__") and name.endswith("__"):
        return None
    base = name[slash + 1 :]
    dot = base.find(".")
    if dot <= 0:
        return None
    return name[: slash + 1 + dot], base[dot + 1 :].lower()


def decode(ext, data):
    if ext == "cls":
        return int(bytes(data).strip())
    if ext == "npy" or ext.endswith(".npy"):
        return torch.from_numpy(np.load(io.BytesIO(data), allow_pickle=False))
    if len(data) == 0:
        return torch.empty(0, dtype=torch.uint8)
    return torch.frombuffer(data, dtype=torch.uint8)


class ImageDecoder:
    """Image mode's per-sample decoding: the image field with PIL and torchvision's
    Resize(size) + CenterCrop(size) + PILToTensor(), cls as an int, the rest dropped."""

    def __init__(self, size, field):
        from torchvision import transforms

        self.size, self.field = size, field
        self.transform = transforms.Compose([
            transforms.Resize(size, interpolation=transforms.InterpolationMode.BILINEAR),
            transforms.CenterCrop(size),
            transforms.PILToTensor(),
        ])

    def __call__(self, ext, data):
        """The decoded value of a member, or None to drop it."""
        if ext == self.field:
            from PIL import Image

            with Image.open(io.BytesIO(data)) as im:
                return self.transform(im.convert("RGB"))
        if ext == "cls":
            return int(bytes(data).strip())
        return None

    def check(self, sample, url):
        if self.field not in sample:
            raise ValueError(f"{url}: sample {sample['__key__']} has no {self.field} member")


class TarShards(IterableDataset):
    """Streams samples from WebDataset tar shards fetched with plain HTTP GETs. With
    an ImageDecoder, samples hold its decoded image and label only."""

    def __init__(self, urls, zstd_open=None, image=None):
        self.urls = urls
        self.zstd_open = zstd_open
        self.image = image

    def __iter__(self):
        info = get_worker_info()
        urls = self.urls if info is None else self.urls[info.id :: info.num_workers]
        for url in urls:
            yield from self.shard_samples(url)

    def shard_samples(self, url):
        with urllib.request.urlopen(url, timeout=HTTP_TIMEOUT) as resp:
            counted = CountingReader(resp)
            buffered = io.BufferedReader(counted, 1 << 20)
            if buffered.peek(4)[:4] == ZSTD_MAGIC:
                if self.zstd_open is None:
                    raise RuntimeError(f"{url}: zstd shard and no zstd in Python")
                stream, mode = self.zstd_open(buffered), "r|"
            else:
                stream, mode = buffered, "r|*"
            reported = 0  # bytes_in already attached to a sample
            cur_key, cur = None, None
            with tarfile.open(fileobj=stream, mode=mode) as tf:
                for m in tf:
                    if not m.isreg():
                        continue
                    ke = sample_key(m.name)
                    if ke is None:
                        continue
                    key, ext = ke
                    if key != cur_key:
                        if cur is not None:
                            cur["__bytes_in__"] = counted.n - reported
                            reported = counted.n
                            if self.image is not None:
                                self.image.check(cur, url)
                            yield cur
                        cur_key, cur = key, {"__key__": key, "__url__": url}
                    if ext in cur:
                        raise ValueError(f"{url}: sample {key}: duplicate extension {ext}")
                    # Read straight into a writable buffer torch.frombuffer can share.
                    data = bytearray(m.size)
                    f = tf.extractfile(m)
                    view, got = memoryview(data), 0
                    while got < m.size:
                        n = f.readinto(view[got:])
                        if not n:
                            raise EOFError(f"{url}: {m.name}: truncated member")
                        got += n
                    if self.image is None:
                        cur[ext] = decode(ext, data)
                    else:
                        v = self.image(ext, data)
                        if v is not None:
                            cur[ext] = v
            # Read what tarfile left (end-of-archive padding) so bytes_in is the object.
            while buffered.read(1 << 20):
                pass
            if cur is not None:
                cur["__bytes_in__"] = counted.n - reported
                if self.image is not None:
                    self.image.check(cur, url)
                yield cur


def nbytes(v):
    if isinstance(v, torch.Tensor):
        return v.element_size() * v.nelement()
    if isinstance(v, list):
        return sum(nbytes(x) for x in v)
    return 0


def collate(samples):
    """One dict per batch: ints -> int64 tensor, equal-shaped tensors stacked,
    ragged tensors as a list, strings as a list. __bytes_in__ is summed."""
    out = {"__bytes_in__": sum(s.pop("__bytes_in__", 0) for s in samples)}
    for name in samples[0]:
        vals = [s[name] for s in samples]
        v0 = vals[0]
        if isinstance(v0, int):
            out[name] = torch.tensor(vals, dtype=torch.int64)
        elif isinstance(v0, torch.Tensor) and all(v.shape == v0.shape for v in vals):
            out[name] = torch.stack(vals)
        else:
            out[name] = vals
    return out


def vm_hwm(pid):
    """Peak resident set of a process in bytes, or 0 if it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def child_pids():
    pids = []
    me = os.getpid()
    try:
        for tid in os.listdir(f"/proc/{me}/task"):
            with open(f"/proc/{me}/task/{tid}/children") as f:
                pids += [int(p) for p in f.read().split()]
    except OSError:
        pass
    return pids


def cpu_seconds():
    """User + system CPU seconds of this process and of its reaped children."""
    me = resource.getrusage(resource.RUSAGE_SELF)
    ch = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + ch.ru_utime + ch.ru_stime


def reap_children(timeout=10.0):
    """Waits until this process has no child process left, living or zombie (a child
    that exited and was not waited for is still listed in /proc/PID/task/TID/children),
    reaping those multiprocessing started. True when none is left."""
    deadline = time.monotonic() + timeout
    while True:
        multiprocessing.active_children()  # joins (reaps) the finished ones
        if not child_pids():
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)


def first_bytes(url, n=4):
    req = urllib.request.Request(url, headers={"Range": f"bytes=0-{n - 1}"})
    with urllib.request.urlopen(req, timeout=HTTP_TIMEOUT) as resp:
        return resp.read(n)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--urls-file", required=True, help="one http(s) shard URL per line")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--workers", type=int, default=2, help="DataLoader num_workers")
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--epochs", type=int, default=None, help="full passes (default 1)")
    g.add_argument("--batches", type=int, default=None, help="stop after N batches (epochs repeat as needed)")
    ap.add_argument("--step-time", type=float, default=0.0, help="simulated trainer step, seconds of sleep per batch")
    ap.add_argument("--image", type=int, default=None, metavar="SIZE",
                    help="image mode: decode --image-field with PIL, Resize(SIZE) + CenterCrop(SIZE), uint8 [3,SIZE,SIZE]")
    ap.add_argument("--image-field", default="jpg", metavar="EXT", help="image mode: the image member's extension (default jpg)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args()
    if args.image is not None and args.image < 1:
        sys.exit("--image: the size must be positive")

    with open(args.urls_file) as f:
        urls = [ln.strip() for ln in f if ln.strip() and not ln.lstrip().startswith("#")]
    if not urls:
        sys.exit(f"{args.urls_file}: no URLs")
    epochs = args.epochs if args.epochs is not None else (None if args.batches else 1)
    config = {
        "tool": "dataloader_baseline",
        "torch": torch.__version__,
        "shards": len(urls),
        "batch_size": args.batch_size,
        "workers": args.workers,
        "epochs": epochs,
        "batches_limit": args.batches,
        "step_time": args.step_time,
    }
    image = None
    if args.image is not None:
        import PIL
        import torchvision

        image = ImageDecoder(args.image, args.image_field.lower())
        config.update(image_size=args.image, image_field=image.field, pil=PIL.__version__,
                      torchvision=torchvision.__version__)

    zstd_open = zstd_stream_reader()
    if first_bytes(urls[0]) == ZSTD_MAGIC and zstd_open is None:
        out = dict(config, skipped="no zstd in Python")
        print(json.dumps(out) if args.json else "skipped: no zstd in Python (install python3-zstandard)")
        return

    ds = TarShards(urls, zstd_open, image)
    # Image mode batches with PyTorch's default collate (collate_fn=None).
    collate_fn = collate if image is None else None
    samples = batches = bytes_in = bytes_out = 0
    wait = 0.0
    trained = 0.0
    first_batch = None
    peak_workers = 0
    cpu_startup = cpu_seconds()
    t0 = time.perf_counter()
    epoch = 0
    done = False
    while not done:
        loader = DataLoader(ds, batch_size=args.batch_size, num_workers=args.workers, collate_fn=collate_fn)
        hwm = {}  # this epoch's workers: pid -> VmHWM
        it = iter(loader)
        got_any = False
        while True:
            w0 = time.perf_counter()
            try:
                batch = next(it)
            except StopIteration:
                break
            now = time.perf_counter()
            if first_batch is None:
                first_batch = now - t0
            else:
                wait += now - w0  # the first batch's latency is first_batch_seconds
            got_any = True
            batches += 1
            bytes_in += int(torch.as_tensor(batch.pop("__bytes_in__")).sum())  # a tensor after default collate
            samples += len(batch["__key__"])
            bytes_out += sum(nbytes(v) for k, v in batch.items() if not k.startswith("__"))
            for pid in child_pids():
                hwm[pid] = max(hwm.get(pid, 0), vm_hwm(pid))
            if args.step_time > 0:
                s0 = time.perf_counter()
                time.sleep(args.step_time)  # the simulated trainer computing on the batch
                trained += time.perf_counter() - s0
            if args.batches is not None and batches >= args.batches:
                done = True
                break
        for pid in child_pids():  # still alive when we stopped early
            hwm[pid] = max(hwm.get(pid, 0), vm_hwm(pid))
        peak_workers = max(peak_workers, sum(hwm.values()))
        del it, loader
        epoch += 1
        if epochs is not None and epoch >= epochs:
            done = True
        if not got_any:
            done = True  # an empty dataset would loop forever
    seconds = time.perf_counter() - t0
    peak = vm_hwm(os.getpid()) + peak_workers
    # The workers' CPU time counts once they have been waited for.
    reaped = reap_children()
    cpu = cpu_seconds()

    out = dict(
        config,
        epochs_run=epoch,
        samples=samples,
        batches=batches,
        bytes_in=bytes_in,
        bytes_out=bytes_out,
        seconds=seconds,
        samples_per_sec=samples / seconds if seconds else 0.0,
        mb_per_sec=bytes_out / 1e6 / seconds if seconds else 0.0,
        mb_per_sec_in=bytes_in / 1e6 / seconds if seconds else 0.0,
        first_batch_seconds=first_batch,
        peak_rss_bytes=peak,
        wait_seconds=wait,
        # As shardload bench: the share of the trainer's time spent waiting for data
        # after its first batch (with no step time, the share of the run).
        wait_fraction=wait / (wait + trained) if trained else (wait / seconds if seconds else 0.0),
        cpu_seconds=cpu,
        cpu_seconds_per_sample=cpu / samples if samples else None,
        cpu_seconds_startup=cpu_startup,
        workers_reaped=reaped,
    )
    if args.json:
        print(json.dumps(out))
    else:
        print(
            f"{samples} samples in {batches} batches, {seconds:.2f}s: {out['samples_per_sec']:.0f} samples/s, "
            f"{out['mb_per_sec']:.1f} MB/s out, {out['mb_per_sec_in']:.1f} MB/s in, "
            f"first batch {first_batch or 0:.2f}s, wait {out['wait_fraction']:.0%}, "
            f"peak RSS {peak / 2**20:.0f} MiB, CPU {cpu:.2f}s ({1e3 * cpu / max(samples, 1):.2f} ms/sample)"
        )


if __name__ == "__main__":
    main()
