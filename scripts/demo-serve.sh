#!/usr/bin/env bash
# The loader process and a Python trainer, for `make demo`: starts `shardload serve` on
# a socket in a temporary directory, reads one epoch with the Python client (standard
# library only), prints what the trainer saw, and stops the server with SIGTERM.
#
#   scripts/demo-serve.sh BINARY PATTERN
set -euo pipefail
bin=$1 pattern=$2
py=$(command -v python3 || true)
if [[ -z $py ]] || ! "$py" -c 'import socket, sys; sys.exit(not hasattr(socket, "recv_fds"))' 2> /dev/null; then
	echo "demo-serve: skipped: needs python3 3.9 or later (scripts/deps.sh installs it)"
	exit 0
fi
dir=$(mktemp -d)
sock=$dir/run/loader.sock
"$bin" serve --socket "$sock" --field jpg --field label=cls:int "$pattern" > "$dir/serve.log" 2>&1 &
pid=$!
trap 'kill "$pid" 2> /dev/null || true; wait "$pid" 2> /dev/null || true; rm -rf "$dir"' EXIT
for ((i = 0; i < 100; i++)); do
	grep -q "listening on" "$dir/serve.log" && break
	kill -0 "$pid" 2> /dev/null || { cat "$dir/serve.log"; exit 1; }
	sleep 0.1
done
head -n 1 "$dir/serve.log"
PYTHONPATH=client/python "$py" - "$sock" << 'PY'
import sys, time
import shardload
t0 = time.perf_counter()
with shardload.Client(sys.argv[1], batch_size=32, seed=1, output="memoryview") as c:
    n = rows = nbytes = 0
    for b in c:
        if n == 0:
            first = time.perf_counter() - t0
            print(f"trainer: first batch after {first:.2f}s: keys {b.keys[:2]}..., labels {b['label'].tolist()[:4]}..., {len(b['jpg'])} jpgs")
        n += 1
        rows += b.rows
        nbytes += b["jpg"].offsets[-1]
    secs = time.perf_counter() - t0
print(f"trainer: {n} batches, {rows} samples, {nbytes / 1e6:.1f} MB of jpg in {secs:.2f}s ({rows / secs:.0f} samples/s), zero-copy from shared slabs")
PY
kill -TERM "$pid"
wait "$pid" || true
tail -n 1 "$dir/serve.log"
