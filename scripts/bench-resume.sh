#!/usr/bin/env bash
# Measures restoring a loader mid-epoch from S3 (MinIO on loopback): the 1 GB image
# dataset of the pipeline benchmark (32 shards x 300 samples of ~110 KB) with an
# index beside the shards (shardload index --output). For each point of the epoch
# (0: a fresh start, 0.1, 0.5, 0.9 of the rank's batches) a fresh process restores
# from the state a trainer would have saved there (bench --resume-at) and reports
# the time to its first batch (from the start of the process's planning: index
# lookup included) and the bytes it read before it (rchar: files and sockets).
# "skip" is the way before states: reopen the epoch and read through the batches
# already consumed (bench --batches K+1: the seconds to get batch K+1).
# Both for world 1 and for rank 1 of world 4.
#
#   scripts/bench-resume.sh [RUNS]     (default 5; BENCH_FLAGS adds bench flags to every run)
#
# Prints one line per case with the medians; raw JSON under .demo/bench-resume/.
# BENCH_REUSE=1 reuses the dataset and the MinIO data of the previous run.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/bench-lib.sh
runs=${1:-5}

go build -o bin/shardload ./cmd/shardload
sl=$PWD/bin/shardload
work=$PWD/.demo/bench-resume
bench_workdir "$work"
if [[ -z $reuse ]]; then
	"$sl" gen --shards 32 --samples 300 --preset images "$work/images" > /dev/null
fi

trap stop_minio EXIT
start_minio "$work"
echo "$AWS_ACCESS_KEY_ID $AWS_SECRET_ACCESS_KEY" > "$work/creds"
pattern="s3://bench/images/train-{000000..000031}.tar"
if [[ -z $reuse ]]; then
	s3curl -X PUT "$AWS_ENDPOINT_URL/bench" > /dev/null
	find "$work/images" -maxdepth 1 -name 'train-*.tar' | sort |
		xargs -P 8 -I{} sh -c 'curl -fsS -m 600 --aws-sigv4 "aws:amz:us-east-1:s3" --user "$AWS_ACCESS_KEY_ID:$AWS_SECRET_ACCESS_KEY" \
			-H "x-amz-content-sha256: UNSIGNED-PAYLOAD" -o /dev/null -T "$1" "$AWS_ENDPOINT_URL/bench/images/$(basename "$1")"' sh {}
	SHARDLOAD_INDEX_DIR=$work/store-index "$sl" index --output "s3://bench/images/" "$pattern" 2> "$work/index.log"
fi
bytes=$(cat "$work/images"/train-*.tar | wc -c)
shard=$((bytes / 32))

# run CASE I [FLAGS...]: one bench run on a fresh node (an empty index store), its
# JSON saved.
run() {
	local case=$1 i=$2
	shift 2
	rm -rf "$work/store"
	# shellcheck disable=SC2086
	SHARDLOAD_INDEX_DIR=$work/store "$sl" bench --json --field jpg --field cls "$@" ${BENCH_FLAGS:-} "$pattern" \
		> "$work/$case-$i.json" 2> "$work/$case-$i.log"
}

# field CASE KEY: the median of KEY over the runs of a case.
field() {
	for f in "$work/$1"-*.json; do
		python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "$f" "$2"
	done | median
}

for world in 1 4; do
	rank=$((world > 1 ? 1 : 0))
	for i in $(seq "$runs"); do
		for at in 0 0.1 0.5 0.9; do
			run "w$world-at$at" "$i" --world "$world" --rank "$rank" --resume-at "$at" --batches 10
		done
	done
	# The batches of the rank's epoch: the fresh start's plan.
	total=$(field "w$world-at0" plan_batches)
	for i in $(seq "$runs"); do
		for at in 0.1 0.5 0.9; do
			k=$(python3 -c "print(int($at * $total))")
			run "w$world-skip$at" "$i" --world "$world" --rank "$rank" --batches $((k + 1))
		done
	done
	echo "== world $world (rank $rank, $total batches of 32): $((bytes / 1000000)) MB in 32 shards of $((shard / 1000000)) MB; medians of $runs"
	for at in 0 0.1 0.5 0.9; do
		fb=$(field "w$world-at$at" first_batch_seconds)
		rd=$(field "w$world-at$at" read_before_first_batch_bytes)
		printf 'resume at %-4s first batch %6.3fs  read before it %6.1f MB (%4.2f shards)\n' \
			"$at" "$fb" "$(echo "$rd/1000000" | bc -l)" "$(echo "$rd/$shard" | bc -l)"
	done
	for at in 0.1 0.5 0.9; do
		s=$(field "w$world-skip$at" seconds)
		c=$(field "w$world-skip$at" count_seconds)
		printf 'skip to %-4s    batch K+1 after %6.3fs\n' "$at" "$(echo "$s + $c" | bc -l)"
	done
done
