#!/usr/bin/env bash
# Eviction by next use for packed token streams: what a node's cache fetches from the
# store each epoch when the corpus is larger than its disk and reshuffled every epoch,
# `shardload bench --pack` with --cache-policy order against lru (the sides
# alternating, RUNS runs each, medians), and what `bench --pack` announced.
#
#   scripts/bench-cachepack.sh [RUNS] [SHARDS] [DOCS]     (defaults: 3, 128, 1000)
#
# The corpus: `gen --preset docs` (tokens.npy documents of 1 to 1024 uint16 tokens,
# about 1 MB a shard at the defaults), indexed, served over HTTP by tools/latencyproxy
# (--dir, no delay, --count: the bytes it sends). Each run: EPOCHS (4) epochs packed
# into rows of 1024 tokens, a fresh cache whose disk holds half the corpus, and
# --memory 32MiB (a read-ahead of 16 MiB, an eighth of the default corpus: a job's 64
# MiB is a far smaller part of its own). Reported: the store's bytes over the
# corpus's, the first epoch and then each epoch after it, and the runs' tokens/s. Results under
# .demo/bench-cachepack/. Needs curl, python3 and bc.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/bench-lib.sh
runs=${1:-3}
shards=${2:-128}
docs=${3:-1000}
epochs=${EPOCHS:-4}

go build -o bin/shardload ./cmd/shardload
go build -o bin/latencyproxy ./tools/latencyproxy
sl=$PWD/bin/shardload
work=.demo/bench-cachepack
rm -rf "$work"
mkdir -p "$work"
data=$work/data
"$sl" gen --preset docs --shards "$shards" --samples "$docs" "$data" > /dev/null
bytes=$(cat "$data"/train-*.tar | wc -c)

proxy_pid=
cleanup() { [[ -n $proxy_pid ]] && kill "$proxy_pid" 2> /dev/null && wait "$proxy_pid" 2> /dev/null || true; }
trap cleanup EXIT
bin/latencyproxy --dir "$data" --delay 0 --count > "$work/proxy.out" 2> "$work/proxy.log" &
proxy_pid=$!
for ((i = 0; i < 100; i++)); do
	[[ -s $work/proxy.out ]] && break
	sleep 0.1
done
store=$(head -n 1 "$work/proxy.out")
url="$store/train-{000000..$(printf '%06d' $((shards - 1)))}.tar"
sent() { curl -fsS "$store/.latencyproxy/count" | python3 -c 'import json,sys; print(json.load(sys.stdin)["bytes"])'; }
"$sl" index --no-index-store --output "$work/corpus.index" "$url" 2> /dev/null
m() { printf '%s\n' "$@" | median; }

# one POLICY EPOCHS: store bytes over the corpus's for a fresh cache of half of it.
one() {
	rm -rf "$work/cache"
	local before after
	before=$(sent)
	"$sl" bench --pack tokens.npy:1024 --index "$work/corpus.index" --no-index-store --json --epochs "$2" \
		--batch-size 8 --seed 7 --memory 32MiB --cache-dir "$work/cache" --cache-disk $((bytes / 2)) \
		--cache-policy "$1" "$url" > "$work/$1-$2.json"
	after=$(sent)
	echo "($after - $before) / $bytes" | bc -l
}

echo "corpus: $shards shards, $bytes bytes; $runs runs a side, $epochs epochs"
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
