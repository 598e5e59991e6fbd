#!/usr/bin/env bash
# Reads straight into slab rows against the copying path, on the peers' image
# shards from MinIO (index given, --field jpg --field cls, 3 epochs): CPU seconds a
# GB read, MB/s and the share of the slabs' bytes read in place, for each --slabs
# given, the two paths alternating in each run; medians of RUNS. The lean reader
# (tools/leanget -jobs 4) reads the same objects 3 times in each run too: the
# issue's ratio is the loader's CPU a GB over its.
#
#   scripts/bench-slabreads.sh [RUNS] [SLABS...]     (defaults: 5; 4 24)
#
# MinIO is the one scripts/tools.sh builds, on 127.0.0.1, stopped at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/bench-lib.sh
runs=${1:-5}
shift || true
slabs=("${@:-4 24}")
read -r -a slabs <<< "${slabs[*]}"

go build -o bin/shardload ./cmd/shardload
go build -o bin/leanget ./tools/leanget
sl=bin/shardload
work=.demo/bench-slabreads
rm -rf "$work"
mkdir -p "$work"
img=$($sl gen --preset images --shards 32 --samples 300 "$work/img")
trap stop_minio EXIT
start_minio "$work"
s3curl -X PUT "$AWS_ENDPOINT_URL/peers" > /dev/null
urls=()
for f in "$work"/img/*.tar; do
	s3curl -T "$f" "$AWS_ENDPOINT_URL/peers/img/$(basename "$f")" > /dev/null
	urls+=("s3://peers/img/$(basename "$f")")
done
s3img="s3://peers/img/$(basename "$img")"
$sl index --no-index-store --output "$work/img.index" "$s3img" > /dev/null 2>&1

j() { python3 -c "import json,sys; d=json.load(sys.stdin); print(eval(sys.argv[1], {}, d))" "$1"; }
m() { printf '%s\n' "$@" | median; }
declare -A cpu mbs placed
lean=()
for ((i = 0; i < runs; i++)); do
	out=$(bin/leanget -jobs 4 "${urls[@]}" "${urls[@]}" "${urls[@]}")
	lean+=("$(j 'cpu_seconds/(bytes_in/1e9)' <<< "$out")")
	for n in "${slabs[@]}"; do
		for sr in true false; do
			out=$($sl bench --no-index-store --json --epochs 3 --slabs "$n" --slab-reads=$sr --index "$work/img.index" --field jpg --field cls "$s3img" 2> /dev/null)
			cpu[$n,$sr]+="$(j 'cpu_seconds_per_gb' <<< "$out") "
			mbs[$n,$sr]+="$(j 'mb_per_sec' <<< "$out") "
			placed[$n,$sr]+="$(j 'bytes_placed/bytes_out' <<< "$out") "
		done
	done
done
r() { python3 -c "print(f'{$1:.3f}')"; }
printf 'slab reads: 32 image shards from MinIO, 3 epochs; %d runs, medians (lean reader: %s CPU s a GB)\n' "$runs" "$(r "$(m "${lean[@]}")")"
printf '%-8s %-11s %12s %12s %10s %14s\n' slabs slab-reads "CPU s/GB" "/ lean" "MB/s" "bytes placed"
for n in "${slabs[@]}"; do
	for sr in true false; do
		read -r -a c <<< "${cpu[$n,$sr]}"
		read -r -a b <<< "${mbs[$n,$sr]}"
		read -r -a p <<< "${placed[$n,$sr]}"
		printf '%-8s %-11s %12s %12s %10s %14s\n' "$n" "$sr" "$(r "$(m "${c[@]}")")" "$(r "$(m "${c[@]}")/$(m "${lean[@]}")")" "$(r "$(m "${b[@]}")")" "$(r "$(m "${p[@]}")")"
	done
done
