#!/usr/bin/env python3
"""Summarizes a scripts/bench-pipeline.sh output directory: a table per dataset and
the ratios the pipeline is judged by. Writes summary.json beside the inputs and
prints the table.

    python3 bench/summarize_pipeline.py OUTDIR

Inputs (written by the script; any may be missing, and that part is then reported
as not measured): env.json; per dataset NAME: NAME.dataset.json,
NAME.ceiling.I.json, NAME.baseline.I.json, NAME.baseline-wait.1.json,
NAME.shardload.I.json, NAME.shardload-sustained.I.json, NAME.shardload-wait.I.json,
NAME.serve.I.json,
NAME.serve-wait.I.json, NAME.zstdrate.json.

The median run of a group is the run with the median "seconds" (wait runs: the median
"wait_fraction"); its figures are reported whole, so they stay consistent.

Ratios:
  - shardload / ceiling: stored bytes per second, shardload bench's bytes_in/seconds
    against the curl ceiling's bytes/seconds (target >= 0.9 on plain tar);
  - shardload / DataLoader: samples per second;
  - zstd: shardload's decompressed MB/s against CORES x the single-core zstd rate
    (target >= 0.8).
  - sustained: the same two ratios for the epochs after the first of a three-epoch
    run (the median of their epoch_seconds), which carry none of the start-up. Decompressed bytes are shardload's "bytes_decompressed" when it
    reports one, else bytes_in scaled by the dataset's decompressed/compressed ratio
    from zstdrate (exact when whole shards are read, as in a one-epoch run).
"""

import glob
import json
import os
import re
import sys


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def runs(outdir, name, kind):
    pat = re.compile(re.escape(f"{name}.{kind}.") + r"(\d+)\.json$")
    found = []
    for p in glob.glob(os.path.join(outdir, f"{name}.{kind}.*.json")):
        if pat.search(os.path.basename(p)):
            r = load(p)
            if r is not None:
                found.append(r)
    return found


def median_run(rs, key):
    rs = [r for r in rs if not r.get("skipped") and isinstance(r.get(key), (int, float))]
    if not rs:
        return None
    rs.sort(key=lambda r: r[key])
    return dict(rs[(len(rs) - 1) // 2], _n=len(rs))


def fmt(v, spec="{:.1f}", none="-"):
    return none if v is None else spec.format(v)


def rate(r, key, seconds="seconds"):
    if r is None or not r.get(seconds) or r.get(key) is None:
        return None
    return r[key] / 1e6 / r[seconds]


def sustained(r):
    """Adds sustained_seconds to a multi-epoch run: its epochs after the first, as the
    time of one epoch (their median); None when it has no later epoch."""
    later = sorted((r.get("epoch_seconds") or [])[1:])
    epochs = r.get("epochs") or 0
    if not later or epochs < 2:
        return None
    r = dict(r)
    per_epoch = later[(len(later) - 1) // 2]
    # One epoch's bytes and samples, at the later epochs' pace.
    for k in ("bytes_in", "bytes_out", "bytes_decompressed", "samples"):
        if isinstance(r.get(k), (int, float)):
            r[k] = r[k] / epochs
    r["seconds"] = per_epoch
    r["samples_per_sec"] = r["samples"] / per_epoch if r.get("samples") else None
    r["first_batch_seconds"] = None
    return r


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    outdir = sys.argv[1]
    env = load(os.path.join(outdir, "env.json")) or {}
    cores = env.get("cores") or os.cpu_count()
    names = env.get("datasets") or sorted(
        os.path.basename(p).split(".")[0] for p in glob.glob(os.path.join(outdir, "*.dataset.json"))
    )
    summary = {"env": env, "datasets": {}}
    lines = [
        f"bench-pipeline: scale {env.get('scale', '?')}, {env.get('runs', '?')} runs, {cores} cores"
        f" ({env.get('cpu', '?')}), {env.get('go', '?')}, git {env.get('git', '?')}, load at end {' '.join(env.get('loadavg_at_end', []))}"
    ]
    for name in names:
        ds = load(os.path.join(outdir, f"{name}.dataset.json")) or {"name": name}
        ceil = median_run(runs(outdir, name, "ceiling"), "seconds")
        base = median_run(runs(outdir, name, "baseline"), "seconds")
        base_skipped = next((r["skipped"] for r in runs(outdir, name, "baseline") if r.get("skipped")), None)
        base_wait = median_run(runs(outdir, name, "baseline-wait"), "wait_fraction")
        sl = median_run(runs(outdir, name, "shardload"), "seconds")
        sl_wait = median_run(runs(outdir, name, "shardload-wait"), "wait_fraction")
        sl_sus = median_run([x for x in map(sustained, runs(outdir, name, "shardload-sustained")) if x], "seconds")
        sv = median_run(runs(outdir, name, "serve"), "seconds")
        sv_wait = median_run(runs(outdir, name, "serve-wait"), "wait_fraction")
        zr = load(os.path.join(outdir, f"{name}.zstdrate.json"))

        d = {"dataset": ds}
        lines.append("")
        lines.append(
            f"== {name}: {ds.get('shards', '?')} shards, {fmt((ds.get('bytes') or 0) / 1e6)} MB stored"
            f" ({ds.get('s3_pattern', '?')})"
        )
        hdr = f"{'':44s} {'seconds':>8s} {'samples/s':>10s} {'MB/s in':>8s} {'MB/s out':>9s} {'1st batch':>9s} {'wait':>6s} {'peak RSS':>9s}"
        lines.append(hdr)

        def row(label, r, in_key="bytes_in"):
            if r is None:
                return f"{label:44s} {'not measured':>8s}"
            return (
                f"{label:44s} {fmt(r.get('seconds'), '{:.2f}'):>8s} {fmt(r.get('samples_per_sec'), '{:.0f}'):>10s}"
                f" {fmt(rate(r, in_key)):>8s} {fmt(rate(r, 'bytes_out')):>9s}"
                f" {fmt(r.get('first_batch_seconds'), '{:.2f}s'):>9s} {fmt(r.get('wait_fraction'), '{:.0%}'):>6s}"
                f" {fmt(r['peak_rss_bytes'] / 2**20 if r.get('peak_rss_bytes') else None, '{:.0f}Mi'):>9s}"
            )

        n = lambda r: r["_n"] if r else 0  # noqa: E731
        lines.append(row(f"curl ceiling, 4 processes (median of {n(ceil)})", ceil, "bytes"))
        if base_skipped and base is None:
            lines.append(f"{'DataLoader baseline, 2 workers':44s} skipped: {base_skipped}")
        else:
            lines.append(row(f"DataLoader baseline, 2 workers (median of {n(base)})", base))
        lines.append(row(f"shardload bench --step-time 0 (median of {n(sl)})", sl))
        lines.append(row(f"  sustained: epochs 2-3 of 3 (median of {n(sl_sus)})", sl_sus))
        st = env.get("step_time", "50ms")
        wb = ds.get("wait_batches", env.get("wait_batches", "?"))
        lines.append(row(f"DataLoader, step {st} x {wb} batches", base_wait))
        lines.append(row(f"shardload, step {st} x {wb} batches (med. {n(sl_wait)})", sl_wait))
        lines.append(row(f"serve + Python client, step 0 (median of {n(sv)})", sv))
        lines.append(row(f"serve + client, step {st} x {wb} (med. {n(sv_wait)})", sv_wait))
        d.update(ceiling=ceil, baseline=base, baseline_skipped=base_skipped, baseline_wait=base_wait,
                 shardload=sl, shardload_sustained=sl_sus, shardload_wait=sl_wait, serve=sv, serve_wait=sv_wait, zstdrate=zr)

        ratios = {}
        ceil_mbs = rate(ceil, "bytes")
        sl_in = rate(sl, "bytes_in")
        if ceil_mbs and sl_in:
            ratios["shardload_over_ceiling"] = sl_in / ceil_mbs
        if ceil_mbs and rate(sl_sus, "bytes_in"):
            ratios["sustained_over_ceiling"] = rate(sl_sus, "bytes_in") / ceil_mbs
        if base and sl and base.get("samples_per_sec") and sl.get("samples_per_sec"):
            ratios["shardload_over_dataloader"] = sl["samples_per_sec"] / base["samples_per_sec"]
        if base and ceil_mbs and rate(base, "bytes_in"):
            ratios["dataloader_over_ceiling"] = rate(base, "bytes_in") / ceil_mbs
        if zr:
            zr_rate = zr["mb_per_sec_decompressed"]
            expand = zr["decompressed_bytes"] / zr["compressed_bytes"]
            lines.append(
                f"zstd single core (zstdrate, median of {zr.get('rounds', '?')}): {zr_rate:.0f} MB/s decompressed,"
                f" {zr['mb_per_sec_compressed']:.0f} MB/s compressed (ratio {expand:.2f});"
                f" ceiling for {cores} cores {cores * zr_rate:.0f} MB/s decompressed"
            )
            if sl and sl.get("seconds"):
                dec = sl.get("bytes_decompressed")
                if dec is None and sl.get("bytes_in") is not None:
                    dec = sl["bytes_in"] * expand
                if dec is not None:
                    d["shardload_decompressed_mb_per_sec"] = dec / 1e6 / sl["seconds"]
                    ratios["shardload_decompressed_over_zstd_cores"] = dec / 1e6 / sl["seconds"] / (cores * zr_rate)
            if sl_sus and sl_sus.get("bytes_decompressed"):
                ratios["sustained_decompressed_over_zstd_cores"] = rate(sl_sus, "bytes_decompressed") / (cores * zr_rate)
            if base and base.get("bytes_in") and base.get("seconds"):
                ratios["dataloader_decompressed_over_zstd_cores"] = (
                    base["bytes_in"] * expand / 1e6 / base["seconds"] / (cores * zr_rate)
                )
        if sv and sl and sl.get("samples_per_sec"):
            ratios["serve_over_bench"] = sv["samples_per_sec"] / sl["samples_per_sec"]
        if sv and base and base.get("samples_per_sec"):
            ratios["serve_over_dataloader"] = sv["samples_per_sec"] / base["samples_per_sec"]
        overheads = sorted(r["client_overhead_us"] for r in runs(outdir, name, "serve") if r.get("client_overhead_us"))
        if overheads:
            ratios["client_overhead_us"] = overheads[len(overheads) // 2]
        d["ratios"] = ratios
        lines.append("ratios:")
        if sv:
            lines.append(f"  serve + client / shardload bench, samples/s:  {fmt(ratios.get('serve_over_bench'), '{:.2f}', 'not measured')}   (target >= 0.9)")
            lines.append(f"  serve + client / DataLoader, samples/s:       {fmt(ratios.get('serve_over_dataloader'), '{:.2f}', 'not measured')}")
            lines.append(f"  client cost per batch (median):               {fmt(ratios.get('client_overhead_us'), '{:.0f} us', 'not measured')}   (target < 100 us)")
        lines.append(f"  shardload / curl ceiling, stored MB/s:        {fmt(ratios.get('shardload_over_ceiling'), '{:.2f}', 'not measured')}"
                     + ("   (target >= 0.9)" if not zr else ""))
        lines.append(f"  sustained (epochs 2-3) / curl ceiling:        {fmt(ratios.get('sustained_over_ceiling'), '{:.2f}', 'not measured')}")
        lines.append(f"  shardload / DataLoader baseline, samples/s:   {fmt(ratios.get('shardload_over_dataloader'), '{:.2f}', 'not measured')}")
        lines.append(f"  DataLoader baseline / curl ceiling, MB/s:     {fmt(ratios.get('dataloader_over_ceiling'), '{:.2f}', 'not measured')}")
        if zr:
            lines.append(f"  shardload decompressed MB/s / ({cores} x zstd 1-core): {fmt(ratios.get('shardload_decompressed_over_zstd_cores'), '{:.2f}', 'not measured')}   (target >= 0.8)")
            lines.append(f"  sustained (epochs 2-3) decompressed / ({cores} x zstd): {fmt(ratios.get('sustained_decompressed_over_zstd_cores'), '{:.2f}', 'not measured')}")
            lines.append(f"  DataLoader decompressed MB/s / ({cores} x zstd 1-core): {fmt(ratios.get('dataloader_decompressed_over_zstd_cores'), '{:.2f}', 'not measured')}")
        summary["datasets"][name] = d

    with open(os.path.join(outdir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
