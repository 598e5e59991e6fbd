#!/usr/bin/env bash
# Measures `shardload cat` on a generated local dataset against the raw read ceiling
# (plain `cat` of the same files, no parsing), alternating the two, and prints the
# medians and their ratio.
#
#   scripts/bench-cat.sh [RUNS] [none|gzip|zstd]     (defaults: 7, none)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/bench-lib.sh
runs=${1:-7}
comp=${2:-none}
go build -o bin/shardload ./cmd/shardload
data=.demo/bench-$comp
pattern=$(bin/shardload gen --shards 8 --samples 512 --compression "$comp" "$data")
files=$(ls "$data"/train-*)

bytes=$(cat $files | wc -c)
raw=() sl=()
for ((i = 0; i < runs; i++)); do
	raw+=("$(secs cat $files)")
	sl+=("$(secs bin/shardload cat "$pattern")")
done
mraw=$(printf '%s\n' "${raw[@]}" | median)
msl=$(printf '%s\n' "${sl[@]}" | median)
printf 'dataset: %s (%s shards, %.1f MB stored, compression %s), %d runs each, medians\n' "$pattern" 8 "$(echo "$bytes/1000000" | bc -l)" "$comp" "$runs"
printf 'raw read (cat files > /dev/null):  %.3fs  %.0f MB/s\n' "$mraw" "$(echo "$bytes/1000000/$mraw" | bc -l)"
printf 'shardload cat > /dev/null:         %.3fs  %.0f MB/s of stored bytes\n' "$msl" "$(echo "$bytes/1000000/$msl" | bc -l)"
printf 'ratio shardload/raw throughput:    %.2f\n' "$(echo "$mraw/$msl" | bc -l)"
