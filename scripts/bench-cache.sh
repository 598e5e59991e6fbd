#!/usr/bin/env bash
# Measures the shard cache: epoch 1 (cold: every shard fetched from MinIO into the
# cache) and epoch 2 (warm: every shard read from the disk tier) of `shardload cat`
# over a dataset larger than the memory tier and smaller than the disk tier, against
# reading the same shards as local files with plain `cat` and with `shardload cat`.
# Each run starts from an empty cache; it prints the medians, MB/s and ratios.
#
#   scripts/bench-cache.sh [RUNS] [SHARDS] [SAMPLES]     (defaults: 5, 32, 512)
#
# The default dataset is about 540 MB (32 shards of 512 samples of ~33 KB); the memory
# tier is 64 MiB and the disk tier twice the dataset. MinIO is the one scripts/tools.sh
# builds; it runs on 127.0.0.1 with its data under .demo/ and is stopped at the end.
# Needs curl (7.75 or later, for --aws-sigv4) and bc.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/bench-lib.sh
runs=${1:-5}
shards=${2:-32}
samples=${3:-512}

go build -o bin/shardload ./cmd/shardload

work=.demo/bench-cache
rm -rf "$work"
mkdir -p "$work"
data=$work/data
pattern=$(bin/shardload gen --shards "$shards" --samples "$samples" "$data")
files=$(ls "$data"/train-*.tar)
bytes=$(cat $files | wc -c)

trap stop_minio EXIT
start_minio "$work"
s3curl -X PUT "$AWS_ENDPOINT_URL/shards" > /dev/null
for f in $files; do
	s3curl -T "$f" "$AWS_ENDPOINT_URL/shards/$(basename "$f")" > /dev/null
done
url="s3://shards/$(basename "$pattern")"

mbs() { echo "$bytes/1000000/$1" | bc -l; }

cache=$work/cache
flags=(--cache-dir "$cache" --cache-memory 64MiB --cache-disk $((2 * bytes + (1 << 20))))
raw=() local=() cold=() warm=()
for ((i = 0; i < runs; i++)); do
	rm -rf "$cache"
	cold+=("$(secs bin/shardload cat "${flags[@]}" "$url")")
	warm+=("$(secs bin/shardload cat "${flags[@]}" "$url")")
	raw+=("$(secs cat $files)")
	local+=("$(secs bin/shardload cat "$pattern")")
done
m() { printf '%s\n' "$@" | median; }
mraw=$(m "${raw[@]}") mlocal=$(m "${local[@]}") mcold=$(m "${cold[@]}") mwarm=$(m "${warm[@]}")
printf 'dataset: %s shards, %.1f MB; memory tier 64 MiB, disk tier %.1f MB; %d runs each, medians\n' \
	"$shards" "$(echo "$bytes/1000000" | bc -l)" "$(echo "(2*$bytes+1048576)/1000000" | bc -l)" "$runs"
printf 'cat local files > /dev/null:              %.3fs  %6.0f MB/s\n' "$mraw" "$(mbs "$mraw")"
printf 'shardload cat local files:                %.3fs  %6.0f MB/s\n' "$mlocal" "$(mbs "$mlocal")"
printf 'shardload cat s3, epoch 1 (cold cache):   %.3fs  %6.0f MB/s\n' "$mcold" "$(mbs "$mcold")"
printf 'shardload cat s3, epoch 2 (warm cache):   %.3fs  %6.0f MB/s\n' "$mwarm" "$(mbs "$mwarm")"
printf 'epoch 2 / epoch 1 throughput:             %.2f\n' "$(echo "$mcold/$mwarm" | bc -l)"
printf 'epoch 2 / shardload cat local files:      %.2f   (target: at least 0.90)\n' "$(echo "$mlocal/$mwarm" | bc -l)"
printf 'epoch 2 / cat local files:                %.2f\n' "$(echo "$mraw/$mwarm" | bc -l)"
