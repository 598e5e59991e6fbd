#!/usr/bin/env bash
# Eviction by next use for packed token streams: what a node's cache fetches from the
# store each epoch when the corpus is larger than its disk and reshuffled every epoch,
# `shardload bench --pack` with --cache-policy order against lru (the sides
# alternating, RUNS runs each, medians), and what `bench --pack` announced.
#
#   scripts/bench-cachepack.sh [RUNS] [SHARDS] [DOCS]     (defaults: 3, 128, 1000)
#   CORPUS=megatron scripts/bench-cachepack.sh [RUNS] [DATASETS] [DOCS]   (3, 6, 12000)
#
# The corpus: `gen --preset docs` (tokens.npy documents of 1 to 1024 uint16 tokens,
# about 1 MB a shard at the defaults), indexed; or, with CORPUS=megatron, DATASETS
# Megatron datasets written by tools/packgen (documents of 1 to 8192 uint16 tokens,
# a .bin of about 98 MB each at the defaults: larger than the 64 MiB a range fill
# takes, so the cache reads their ranges and fetches them whole behind). Served over
# HTTP by tools/latencyproxy (--dir, no delay, --count: the bytes it sends). Each run:
# EPOCHS (4) epochs packed into rows of 1024 tokens, a fresh cache whose disk holds
# DISK of the corpus (0.5; 0.55 for the datasets: half of them and their .idx files),
# and --memory 32MiB
# (a read-ahead of 16 MiB: a job's 64 MiB is a far smaller part of its corpus).
# Reported: the store's bytes over the corpus's, the first epoch and then each epoch
# after it, and the runs' tokens/s. Results under
# .demo/bench-cachepack/. Needs curl, python3 and bc.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/bench-lib.sh
corpus=${CORPUS:-tar}
runs=${1:-3}
if [[ $corpus == megatron ]]; then
	shards=${2:-6}
	docs=${3:-12000}
	disk=${DISK:-0.55}
else
	shards=${2:-128}
	docs=${3:-1000}
	disk=${DISK:-0.5}
fi
epochs=${EPOCHS:-4}

go build -o bin/shardload ./cmd/shardload
go build -o bin/latencyproxy ./tools/latencyproxy
go build -o bin/packgen ./tools/packgen
sl=$PWD/bin/shardload
work=.demo/bench-cachepack
rm -rf "$work"
mkdir -p "$work"
data=$work/data
if [[ $corpus == megatron ]]; then
	mkdir -p "$data"
	for ((i = 0; i < shards; i++)); do
		bin/packgen megatron "$data/c$(printf '%02d' "$i")" "$docs" 1 8192 > /dev/null
	done
	bytes=$(cat "$data"/*.bin | wc -c)
else
	"$sl" gen --preset docs --shards "$shards" --samples "$docs" "$data" > /dev/null
	bytes=$(cat "$data"/train-*.tar | wc -c)
fi

start_store "$data" "$work"
if [[ $corpus == megatron ]]; then
	urls=()
	for f in "$data"/*.idx; do urls+=("$store/$(basename "$f")"); done
	spec=tokens:1024
else
	urls=("$store/train-{000000..$(printf '%06d' $((shards - 1)))}.tar")
	"$sl" index --no-index-store --output "$work/corpus.index" "${urls[0]}" 2> /dev/null
	urls=(--index "$work/corpus.index" "${urls[@]}")
	spec=tokens.npy:1024
fi
m() { printf '%s\n' "$@" | median; }

# one POLICY EPOCHS: store bytes over the corpus's for a fresh cache of half of it.
one() {
	rm -rf "$work/cache"
	local before after
	before=$(sent)
	"$sl" bench --pack "$spec" --no-index-store --json --epochs "$2" \
		--batch-size 8 --seed 7 --memory 32MiB --cache-dir "$work/cache" --cache-disk "$(echo "$bytes * $disk / 1" | bc)" \
		--cache-policy "$1" "${urls[@]}" > "$work/$1-$2.json"
	after=$(sent)
	echo "($after - $before) / $bytes" | bc -l
}

echo "corpus ($corpus): $shards objects, $bytes bytes; a disk of $disk of it; $runs runs a side, $epochs epochs"
declare -A first later rate
for ((i = 0; i < runs; i++)); do
	for p in order lru; do
		f=$(one "$p" 1)
		all=$(one "$p" "$epochs")
		first[$p]+="$f "
		later[$p]+="$(echo "($all - $f) / ($epochs - 1)" | bc -l) "
		rate[$p]+="$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["tokens_per_second"])' "$work/$p-$epochs.json") "
	done
done
for p in order lru; do
	# shellcheck disable=SC2086
	printf '%s: first epoch %.3f of the corpus, each epoch after it %.3f (medians; runs: %s); %.0f tokens/s\n' "$p" \
		"$(m ${first[$p]})" "$(m ${later[$p]})" "$(for x in ${later[$p]}; do printf '%.3f ' "$x"; done)" "$(m ${rate[$p]})"
done
python3 -c 'import json,sys; h=json.load(open(sys.argv[1])).get("hints") or {}; print("hints (order, last run):", {k: h.get(k) for k in ("publishes","entries","shard_epochs","bytes_per_shard_epoch","seconds")})' "$work/order-$epochs.json"
