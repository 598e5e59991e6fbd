#!/usr/bin/env bash
# The token row of scripts/bench-peers.sh on its own, with what it takes to find where
# the loader's time goes: zstd token shards in MinIO, read by `shardload bench` (3
# epochs, index given) and by the lean reader (tools/leanget -jobs 2 -zstd), the sides
# alternating, medians of RUNS. The lean reader is measured twice: over the shards
# once (the peer row's figure) and over them three times (the bytes the loader's 3
# epochs read, so that both sides pay their start-up once for the same work). Per
# loader: MB/s (decompressed), its first epoch's and its later epochs' seconds, and
# its CPU seconds.
#
#   scripts/bench-tok.sh [RUNS] [OLD_REV]      (defaults: 7, none)
#
# OLD_REV (a commit) builds that revision's shardload beside the working tree's, for
# an A/B of the two in the same runs. BENCH_DELAY (e.g. 30ms) puts tools/latencyproxy
# in front of MinIO, so that every request waits that long for its first byte, as
# from a remote store. BENCH_SHARDS (default 8) token shards of 2,000 samples of
# 2,048 int32 tokens. MinIO is the one scripts/tools.sh builds, on 127.0.0.1,
# stopped at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/bench-lib.sh
runs=${1:-7}
old=${2:-}
nshards=${BENCH_SHARDS:-8}
work=.demo/bench-tok
rm -rf "$work"
mkdir -p "$work/bin"
root=$(pwd)

go build -o "$work/bin/shardload" ./cmd/shardload
go build -o "$work/bin/leanget" ./tools/leanget
variants=("now:$root/$work/bin/shardload")
if [[ -n $old ]]; then
	rm -rf "$work/old"
	mkdir -p "$work/old"
	git archive "$old" | tar -x -C "$work/old"
	(cd "$work/old" && go build -o "$root/$work/bin/shardload-old" ./cmd/shardload)
	variants=("old:$root/$work/bin/shardload-old" "${variants[@]}")
fi
sl=$work/bin/shardload
tok=$($sl gen --preset tokens --compression zstd --shards "$nshards" --samples 2000 "$work/tok")

trap 'stop_minio; [[ -z ${proxy_pid:-} ]] || kill "$proxy_pid" 2> /dev/null || true' EXIT
start_minio "$work"
s3curl -X PUT "$AWS_ENDPOINT_URL/peers" > /dev/null
for f in "$work"/tok/*.tar.zst; do
	s3curl -T "$f" "$AWS_ENDPOINT_URL/peers/tok/$(basename "$f")" > /dev/null
done
s3tok="s3://peers/tok/$(basename "$tok")"
$sl index --no-index-store --output "$work/tok.index" "$s3tok" > /dev/null
if [[ -n ${BENCH_DELAY:-} ]]; then
	go build -o "$work/bin/latencyproxy" ./tools/latencyproxy
	coproc proxy { exec "$work/bin/latencyproxy" --target "$AWS_ENDPOINT_URL" --listen 127.0.0.1:0 --delay "$BENCH_DELAY" 2> /dev/null; }
	proxy_pid=$proxy_PID
	read -r AWS_ENDPOINT_URL <&"${proxy[0]}"
	export AWS_ENDPOINT_URL
fi
urls=()
for f in "$work"/tok/*.tar.zst; do urls+=("s3://peers/tok/$(basename "$f")"); done

# Each line: NAME MB/s EPOCH1_S LATER_EPOCHS_S CPU_S (the lean reader's EPOCH1_S: its
# run's seconds).
for ((i = 0; i < runs; i++)); do
	out=$("$work/bin/leanget" -jobs 2 -zstd "${urls[@]}")
	python3 -c "import json,sys; d=json.loads(sys.argv[1]); print('lean', d['bytes_decompressed']/1e6/d['seconds'], d['seconds'], 0, d['cpu_seconds'])" "$out"
	out=$("$work/bin/leanget" -jobs 2 -zstd "${urls[@]}" "${urls[@]}" "${urls[@]}")
	python3 -c "import json,sys; d=json.loads(sys.argv[1]); print('lean-x3', d['bytes_decompressed']/1e6/d['seconds'], d['seconds'], 0, d['cpu_seconds'])" "$out"
	for v in "${variants[@]}"; do
		out=$("${v#*:}" bench --no-index-store --json --epochs 3 --index "$work/tok.index" \
			--field tokens=npy:npy:int32:2048 --field cls "$s3tok" 2> /dev/null)
		python3 -c "
import json, sys
d = json.loads(sys.argv[2]); e = d['epoch_seconds']
print(sys.argv[1], d['mb_per_sec_decompressed'], e[0], sum(e[1:]) / len(e[1:]), d['cpu_seconds'])" "${v%%:*}" "$out"
	done
done | tee "$work/runs.txt" | python3 -c "
import sys, statistics as st
rows = {}
for line in sys.stdin:
    name, *v = line.split()
    rows.setdefault(name, []).append([float(x) for x in v])
lean = st.median(r[0] for r in rows['lean'])
lean3 = st.median(r[0] for r in rows['lean-x3'])
print(f'token shards: $nshards; $runs runs, medians; MinIO on loopback' + (' behind a ${BENCH_DELAY:-} proxy' if '${BENCH_DELAY:-}' else ''))
print(f'{\"\":10} {\"MB/s\":>8} {\"/lean\":>7} {\"/lean-x3\":>9} {\"epoch 1 s\":>10} {\"later s\":>8} {\"cpu s\":>7}')
for name, rs in rows.items():
    m = [st.median(r[i] for r in rs) for i in range(4)]
    later = f'{m[2]:8.3f}' if m[2] else f'{\"\":8}'
    print(f'{name:10} {m[0]:8.1f} {m[0]/lean:7.2f} {m[0]/lean3:9.2f} {m[1]:10.3f} {later} {m[3]:7.2f}')
"
