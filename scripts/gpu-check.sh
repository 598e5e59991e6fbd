#!/usr/bin/env bash
# gpu-check.sh: the device-copy stage on a machine with an NVIDIA GPU, end to end, in
# a few minutes and without the network. It builds nothing: it runs a shardload
# binary built beforehand ("make build", or bin/shardload carried over).
#
#   1. shardload gen: ~0.5 GB of local shards (images preset);
#   2. shardload bench --device cuda --verify: every batch read back from the GPU
#      must equal its slab;
#   3. shardload bench --device cuda with a simulated step: host-to-device GB/s (the
#      copy engine's time, from CUDA events) and whether copies overlapped the step;
#   4. PyTorch on the same GPU: pinned_tensor.to('cuda', non_blocking=True) of the
#      same size, timed the same way (events around each copy);
#   5. pass when shardload's rate is at least MIN_RATIO (0.90) of PyTorch's, the
#      verify run found no difference and copies overlapped the step;
#   6. shardload serve and the Python client: CudaPrefetcher's tensors on the GPU equal
#      what the host-side client reads for the same settings.
#
# Figures go to RESULTS (default gpu-check-results.txt, and .json beside it).
# Exit status: 0 pass, 1 fail, 2 no GPU here (nothing was checked), 3 missing tools.
#
# Settings (environment): SHARDLOAD (binary, default bin/shardload), GPU (0),
# WORK (scratch directory, default ${TMPDIR:-/tmp}/shardload-gpu-check), RESULTS,
# MIN_RATIO (0.90), PYTHON (/usr/bin/python3), BATCHES (80), STEP (20ms).
set -euo pipefail

cd "$(dirname "$0")/.."
SHARDLOAD=${SHARDLOAD:-bin/shardload}
GPU=${GPU:-0}
WORK=${WORK:-${TMPDIR:-/tmp}/shardload-gpu-check}
RESULTS=${RESULTS:-gpu-check-results.txt}
MIN_RATIO=${MIN_RATIO:-0.90}
PYTHON=${PYTHON:-/usr/bin/python3}
BATCHES=${BATCHES:-80}
STEP=${STEP:-20ms}

say() { printf 'gpu-check: %s\n' "$*" >&2; }

if [ ! -x "$SHARDLOAD" ]; then
	say "no shardload binary at $SHARDLOAD: build it first (make build) and carry it here; this script builds nothing"
	exit 3
fi
if ! command -v nvidia-smi >/dev/null 2>&1 && ! ldconfig -p 2>/dev/null | grep -q 'libcuda\.so\.1'; then
	say "no NVIDIA GPU here (no nvidia-smi, no libcuda.so.1 in the linker cache): nothing checked"
	exit 2
fi
if command -v nvidia-smi >/dev/null 2>&1; then
	if ! nvidia-smi -L >&2; then
		say "nvidia-smi finds no GPU: nothing checked"
		exit 2
	fi
fi
if [ ! -x "$PYTHON" ] || ! "$PYTHON" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
	say "$PYTHON with a CUDA-enabled torch is needed for the comparison"
	exit 3
fi

mkdir -p "$WORK"
SHARDS="$WORK/data/train-{000000..000015}.tar"
if [ ! -f "$WORK/data/train-000015.tar" ]; then
	say "generating shards in $WORK/data"
	"$SHARDLOAD" gen --preset images --shards 16 --samples 300 "$WORK/data" >/dev/null
fi
"$SHARDLOAD" ls --summary --json "$SHARDS" >"$WORK/index.jsonl"

# Batches of 256 images (~28 MB) in 64 MiB slabs: large copies, as training uses.
common=(--index "$WORK/index.jsonl" --field jpg --field cls --batch-size 256 --slab-size 64MiB --slabs 4
	--device cuda --gpu "$GPU" --json)

say "verify: every batch read back from GPU $GPU"
"$SHARDLOAD" bench "${common[@]}" --verify --batches 20 "$SHARDS" >"$WORK/verify.json"
say "rate: $BATCHES batches with a $STEP step"
"$SHARDLOAD" bench "${common[@]}" --step-time "$STEP" --batches "$BATCHES" "$SHARDS" >"$WORK/bench.json"

set +e
"$PYTHON" - "$WORK/verify.json" "$WORK/bench.json" "$GPU" "$MIN_RATIO" "$RESULTS" <<'PY'
import json, sys, torch

verify = json.load(open(sys.argv[1]))
bench = json.load(open(sys.argv[2]))
gpu, min_ratio, results = int(sys.argv[3]), float(sys.argv[4]), sys.argv[5]
dev = bench["device"]
size = max(1, dev["bytes"] // max(1, dev["copies"]))  # the mean batch shardload copied

# PyTorch's pinned host-to-device copy of the same size, timed with events around
# each copy as shardload times its own.
torch.cuda.set_device(gpu)
src = torch.empty(size, dtype=torch.uint8).pin_memory()
src.random_(0, 255)
stream = torch.cuda.Stream()
total_ms, n = 0.0, 50
with torch.cuda.stream(stream):
    for i in range(n + 5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record(stream)
        dst = src.to("cuda", non_blocking=True)
        end.record(stream)
        end.synchronize()
        if i >= 5:  # warm-up copies not counted
            total_ms += start.elapsed_time(end)
torch_gbps = size * n / 1e9 / (total_ms / 1e3)
ok_bytes = torch.equal(dst.cpu(), src)

ours = dev["gb_per_sec"]
ratio = ours / torch_gbps if torch_gbps > 0 else 0.0
checks = {
    "verify_all_batches": verify["device"]["verified_batches"] == verify["batches"] and verify["batches"] > 0,
    "rate_at_least_min_ratio": ratio >= min_ratio,
    "copies_overlapped_step": bool(dev["overlapped"]),
    "torch_copy_intact": bool(ok_bytes),
}
out = {
    "gpu": torch.cuda.get_device_name(gpu), "device": dev["name"], "placement": dev.get("placement", ""),
    "batch_bytes": size, "shardload_gb_per_sec": round(ours, 2), "torch_gb_per_sec": round(torch_gbps, 2),
    "ratio": round(ratio, 3), "min_ratio": min_ratio, "overlap": round(dev["overlap"], 3),
    "trainer_wait_fraction": round(bench["wait_fraction"], 4), "samples_per_sec": round(bench["samples_per_sec"]),
    "verified_batches": verify["device"]["verified_batches"], "checks": checks, "pass": all(checks.values()),
}
with open(results, "w") as f:
    f.write("gpu-check: %s (%s)\n" % (out["gpu"], out["device"]))
    f.write("  host to device, %d-byte batches: shardload %.2f GB/s, torch .to('cuda', non_blocking=True) %.2f GB/s: %.1f%% (target %.0f%%)\n"
            % (size, ours, torch_gbps, 100 * ratio, 100 * min_ratio))
    f.write("  copies overlapped the step: %s (%.1f%% of copy time hidden; trainer waited %.2f%%)\n"
            % (dev["overlapped"], 100 * dev["overlap"], 100 * bench["wait_fraction"]))
    f.write("  verified: %d of %d batches on the GPU equal their slabs\n" % (verify["device"]["verified_batches"], verify["batches"]))
    if out["placement"]:
        f.write("  placement: %s\n" % out["placement"])
    f.write("  %s\n" % ("PASS" if out["pass"] else "FAIL: " + ", ".join(k for k, v in checks.items() if not v)))
with open(results.rsplit(".", 1)[0] + ".json", "w") as f:
    json.dump(out, f, indent=1)
print(open(results).read(), end="")
sys.exit(0 if out["pass"] else 1)
PY
rc=$?
set -e

# The Python client's CudaPrefetcher, through shardload serve: slabs registered with
# CUDA, each batch copied on a side stream; its tensors on the GPU must equal what the
# host-side client reads for the same settings.
say "client: CudaPrefetcher through shardload serve, against the host-side client"
sock=$WORK/run/loader.sock
rm -rf "$WORK/run"
"$SHARDLOAD" serve --socket "$sock" --index "$WORK/index.jsonl" "$SHARDS" >"$WORK/serve.log" 2>&1 &
spid=$!
for _ in $(seq 100); do
	grep -q "listening on" "$WORK/serve.log" && break
	sleep 0.1
done
client_ok=0
if PYTHONPATH=client/python "$PYTHON" client/python/tests/torch_check.py dataset "$sock" 1 64 jpg cls:int >"$WORK/client-host.jsonl" &&
	CUDA_VISIBLE_DEVICES=$GPU PYTHONPATH=client/python "$PYTHON" client/python/tests/torch_check.py prefetch "$sock" 1 64 jpg cls:int >"$WORK/client-gpu.jsonl"; then
	"$PYTHON" - "$WORK/client-host.jsonl" "$WORK/client-gpu.jsonl" "$RESULTS" <<'PY' && client_ok=1
import json, sys
host = [json.loads(l) for l in open(sys.argv[1])]
gpu = [json.loads(l) for l in open(sys.argv[2])]
head, gpu = gpu[0], gpu[1:]
same = len(host) == len(gpu) > 0 and all(h["keys"] == g["keys"] and h["columns"] == g["columns"] for h, g in zip(host, gpu))
on_gpu = all(any(d.startswith("cuda") for d in g["device"]) for g in gpu)
ok = same and on_gpu and head.get("cuda") is True
with open(sys.argv[3], "a") as f:
    f.write("  python client: CudaPrefetcher %d batches on the GPU equal the host's: %s (slabs registered with CUDA: %s)\n"
            % (len(gpu), "yes" if same and on_gpu else "NO", head.get("registered")))
print("client: %s" % ("PASS" if ok else "FAIL"))
sys.exit(0 if ok else 1)
PY
fi
kill -TERM "$spid" 2>/dev/null || true
wait "$spid" 2>/dev/null || true
if [ "$client_ok" != 1 ]; then
	say "the Python client's CUDA check failed (see $WORK/client-*.jsonl, $WORK/serve.log)"
	rc=1
fi
exit "$rc"
