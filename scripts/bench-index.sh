#!/usr/bin/env bash
# Measures how fast an epoch starts from S3 (MinIO on loopback) with and without an
# index: time to the first batch and bytes read before it (rchar of the process:
# files and sockets) for
#   (a) no index anywhere: a fresh node, counts estimated from the objects' sizes;
#   (a0) the same with --count-first (every shard read to count it first: the old way);
#   (b) a second run on the same node: the node's index store filled by run (a);
#   (c) an index object beside the shards (shardload index --output), on a fresh node;
# and (a) again at world 2 (rank 0), where the node's store is not used for planning.
# Two datasets: 10,000 shards of 4 samples (default preset, ~33 KB samples) and the
# 1 GB image dataset of the pipeline benchmark (32 shards x 300 samples of ~110 KB).
#
#   scripts/bench-index.sh [RUNS] [SMALL_SHARDS]     (defaults: 3, 10000)
#
# Prints one line per case with the medians; raw JSON under .demo/bench-index/.
# BENCH_REUSE=1 reuses the datasets and the MinIO data of the previous run (the
# upload of 10,000 objects takes a minute or two).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/bench-lib.sh
runs=${1:-3}
small=${2:-10000}

go build -o bin/shardload ./cmd/shardload
sl=$PWD/bin/shardload
work=$PWD/.demo/bench-index
bench_workdir "$work"
if [[ -z $reuse ]]; then
	"$sl" gen --shards "$small" --samples 4 "$work/small" > /dev/null
	"$sl" gen --shards 32 --samples 300 --preset images "$work/images" > /dev/null
fi

trap stop_minio EXIT
start_minio "$work"
echo "$AWS_ACCESS_KEY_ID $AWS_SECRET_ACCESS_KEY" > "$work/creds"
[[ -n $reuse ]] || s3curl -X PUT "$AWS_ENDPOINT_URL/bench" > /dev/null
for name in small images; do
	[[ -z $reuse ]] || continue
	t0=$(date +%s.%N)
	find "$work/$name" -maxdepth 1 -name 'train-*.tar' | sort |
		xargs -P 8 -I{} sh -c 'curl -fsS -m 600 --aws-sigv4 "aws:amz:us-east-1:s3" --user "$AWS_ACCESS_KEY_ID:$AWS_SECRET_ACCESS_KEY" \
			-H "x-amz-content-sha256: UNSIGNED-PAYLOAD" -o /dev/null -T "$1" "$AWS_ENDPOINT_URL/bench/$2/$(basename "$1")"' sh {} "$name"
	echo "uploaded $name in $(echo "$(date +%s.%N) - $t0" | bc -l | cut -c1-5)s" >&2
done

last=$((small - 1))
declare -A PATTERN=(
	[small]="s3://bench/small/train-{000000..$(printf %06d "$last")}.tar"
	[images]="s3://bench/images/train-{000000..000031}.tar"
)
declare -A FIELDS=([small]="--field jpg --field cls" [images]="--field jpg --field cls")

# run NAME CASE I STORE [FLAGS...]: one bench run, its JSON saved.
run() {
	local name=$1 case=$2 i=$3 store=$4
	shift 4
	# shellcheck disable=SC2086
	SHARDLOAD_INDEX_DIR=$store "$sl" bench --json ${FIELDS[$name]} "$@" "${PATTERN[$name]}" \
		> "$work/$name-$case-$i.json" 2> "$work/$name-$case-$i.log"
}

# field NAME CASE KEY: the median of KEY over the runs of a case.
field() {
	for f in "$work/$1-$2"-*.json; do
		python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "$f" "$3"
	done | median
}

for name in small images; do
	bytes=$(cat "$work/$name"/train-*.tar | wc -c)
	for i in $(seq "$runs"); do
		rm -rf "$work/store-a" "$work/store-c" "$work/store-c2" "$work/store-w2"
		s3curl -X DELETE "$AWS_ENDPOINT_URL/bench/$name/shardload.index" > /dev/null || true
		# (a) reads its whole epoch, which fills the store that (b) plans from; the
		# other cases stop after 30 batches (the first batch is what they measure).
		run "$name" a0 "$i" "$work/store-a0-$i" --count-first --no-index-store --batches 30
		run "$name" a "$i" "$work/store-a"
		run "$name" b "$i" "$work/store-a" --batches 30
		run "$name" w2 "$i" "$work/store-w2" --world 2 --rank 0 --batches 30
		SHARDLOAD_INDEX_DIR=$work/store-idx-$i "$sl" index --output "s3://bench/$name/" "${PATTERN[$name]}" 2> "$work/$name-index-$i.log"
		run "$name" c "$i" "$work/store-c" --batches 30
		# (c) with smaller fetch parts: what the four open shards read ahead of the
		# first batch is mostly their first 8 MiB parts.
		run "$name" c2 "$i" "$work/store-c2" --batches 30 --fetch-part-size 2MiB
	done
	echo "== $name: $(ls "$work/$name"/train-*.tar | wc -l) shards, $((bytes / 1000000)) MB; medians of $runs"
	for case in a0 a b w2 c c2; do
		fb=$(field "$name" "$case" first_batch_seconds)
		rd=$(field "$name" "$case" read_before_first_batch_bytes)
		cs=$(field "$name" "$case" count_seconds)
		sps=$(field "$name" "$case" samples_per_sec)
		est=$(field "$name" "$case" estimated_counts)
		printf '%-3s first batch %6.3fs  read before it %8.1f MB (%5.2f%% of the dataset)  counts %6.3fs (estimated %s)  %7.0f samples/s\n' \
			"$case" "$fb" "$(echo "$rd/1000000" | bc -l)" "$(echo "100*$rd/$bytes" | bc -l)" "$cs" "$est" "$sps"
	done
	grep -h "shardload index:" "$work/$name-index-1.log" || true
done
