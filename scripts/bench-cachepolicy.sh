#!/usr/bin/env bash
# Measures what eviction by next use and shards kept on nodes cost where they cannot
# help (issue 50's "no loss of throughput on a fully cached or uncached dataset,
# within 3%"), what the hints cost, and the plan's cache model against a node of two
# ranks:
#
#   1. throughput, `shardload bench` of EPOCHS (10) epochs, samples/s, the two sides of each
#      pair alternating, RUNS runs each, medians and their ratio:
#        cached     --cache-policy order against lru, a disk tier of twice the
#                   dataset warmed before (every read from the disk tier);
#        uncached   order against lru, a disk tier of two shards (every shard
#                   fetched, nearly every fetch evicts or is declined), and no
#                   --cache-dir at all as a reference;
#        affinity   --node-affinity on against off: node 0 of a job of 4 ranks,
#                   2 a node (ranks 0 and 1 at once, one process each, sharing the
#                   cache), samples/s of the node, fully cached and with no cache;
#   2. the hints: from the order runs' JSON (bench's "hints": publishes, bytes of
#      hint files written per shard and epoch, time spent publishing) and a CPU
#      profile of one cached order run and one node of the affinity case: the
#      share of the samples under the hint code (serve.EpochHints, cache.Hints,
#      the hint book read at eviction);
#   3. the plan's cache model against a measured run: every node of that job
#      (2 nodes of 2 ranks, the two ranks of a node at once on one cache), 4
#      epochs, a disk tier of a quarter of the dataset per node, each policy: the
#      store bytes per node and epoch (the two ranks' cache_epochs store_bytes,
#      checked against what the store counted it sent for the whole run) against
#      `shardload plan --cache-bytes`'s store_bytes_per_node.
#
#   scripts/bench-cachepolicy.sh [RUNS] [SHARDS] [SAMPLES]     (defaults: 5, 48, 128)
#
# The store is tools/latencyproxy serving the generated shards over HTTP from a
# directory (--dir, no delay) and counting the bytes it sends (--count): the cache
# caches only remote shards, and HTTP needs no server to build. The default dataset
# is about 220 MB (gen's default preset, 16-48 KiB samples of raw jpg, cls and txt:
# the cheapest decode, so the largest share for the cache and the hints). Results
# and profiles go under .demo/bench-cachepolicy/. Needs curl, python3 and bc.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/bench-lib.sh
runs=${1:-5}
shards=${2:-48}
samples=${3:-128}
epochs=${EPOCHS:-10}

go build -o bin/shardload ./cmd/shardload
go build -o bin/latencyproxy ./tools/latencyproxy
sl=$PWD/bin/shardload

work=.demo/bench-cachepolicy
rm -rf "$work"
mkdir -p "$work"
bench_dirs
data=$work/data
"$sl" gen --shards "$shards" --samples "$samples" "$data" > /dev/null
bytes=$(cat "$data"/train-*.tar | wc -c)
shard_bytes=$((bytes / shards))

start_store "$data" "$work"
url="$store/train-{000000..$(printf '%06d' $((shards - 1)))}.tar"
"$sl" index --no-index-store --output "$work/ds.index" "$url" 2> /dev/null

common=(--index "$work/ds.index" --no-index-store --autotune=false --json --field jpg --field cls --field txt --batch-size 32 --seed 7)
# js FILE EXPR: a Python expression of the JSON object r in FILE.
js() { python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print($2)" "$1"; }
m() { printf '%s\n' "$@" | median; }
ratio() { echo "$1/$2" | bc -l; }

# one NAME ARGS...: a bench of one rank, its JSON in $out/NAME.json; prints samples/s.
one() {
	local name=$1
	shift
	"$sl" bench "${common[@]}" --epochs "$epochs" "$@" "$url" > "$out/$name.json"
	js "$out/$name.json" 'r["samples_per_sec"]'
}

# node NAME ARGS...: ranks 0 and 1 of world 4, 2 a node, at once; prints the node's
# samples/s (both ranks' samples over the slower one's seconds).
node() {
	local name=$1
	shift
	"$sl" bench "${common[@]}" --epochs "$epochs" --world 4 --ranks-per-node 2 --rank 0 "$@" "$url" > "$out/$name-r0.json" &
	local p0=$!
	"$sl" bench "${common[@]}" --epochs "$epochs" --world 4 --ranks-per-node 2 --rank 1 "$@" "$url" > "$out/$name-r1.json"
	wait "$p0"
	python3 -c 'import json,sys; a,b=(json.load(open(f)) for f in sys.argv[1:]); print((a["samples"]+b["samples"])/max(a["seconds"],b["seconds"]))' \
		"$out/$name-r0.json" "$out/$name-r1.json"
}

log "dataset: $shards shards, $bytes bytes; $runs runs a side"
big=$((2 * bytes + (64 << 20)))
for p in order lru; do
	"$sl" warm --cache-dir "$work/cache-$p" --cache-disk "$big" "$url" > /dev/null 2>&1
done
"$sl" warm --cache-dir "$work/cache-node" --cache-disk "$big" "$url" > /dev/null 2>&1
small=$((2 * shard_bytes + (1 << 20)))
c_order=() c_lru=() u_order=() u_lru=() u_none=() a_on=() a_off=() an_on=() an_off=()
for ((i = 0; i < runs; i++)); do
	log "round $((i + 1)) of $runs"
	c_order+=("$(one c-order-$i --cache-dir "$work/cache-order" --cache-disk "$big" --cache-policy order)")
	c_lru+=("$(one c-lru-$i --cache-dir "$work/cache-lru" --cache-disk "$big" --cache-policy lru)")
	u_order+=("$(one u-order-$i --cache-dir "$work/small-order" --cache-disk "$small" --cache-policy order)")
	u_lru+=("$(one u-lru-$i --cache-dir "$work/small-lru" --cache-disk "$small" --cache-policy lru)")
	u_none+=("$(one u-none-$i)")
	a_on+=("$(node a-on-$i --cache-dir "$work/cache-node" --cache-disk "$big")")
	a_off+=("$(node a-off-$i --cache-dir "$work/cache-node" --cache-disk "$big" --node-affinity=false)")
	an_on+=("$(node an-on-$i)")
	an_off+=("$(node an-off-$i --node-affinity=false)")
done

# Profiles: one cached order run of 8 epochs, one node of the cached affinity case.
"$sl" bench "${common[@]}" --epochs 8 --cache-dir "$work/cache-order" --cache-disk "$big" --cpuprofile "$out/c-order.prof" "$url" > "$out/prof-c-order.json"
# (rank 1 profiled alone: two processes must not write one profile)
"$sl" bench "${common[@]}" --epochs "$epochs" --world 4 --ranks-per-node 2 --rank 0 --cache-dir "$work/cache-node" --cache-disk "$big" "$url" > /dev/null &
p0=$!
"$sl" bench "${common[@]}" --epochs "$epochs" --world 4 --ranks-per-node 2 --rank 1 --cache-dir "$work/cache-node" --cache-disk "$big" \
	--cpuprofile "$out/node.prof" "$url" > "$out/prof-node-r1.json"
wait "$p0"
hintcode='EpochHints|cache\.\(\*Hints\)|hintBook|mergeHints|hintSet|hintKey|encodeHints|parseHints'
share() {
	go tool pprof -top -focus="$hintcode" "$sl" "$1" 2> /dev/null |
		awk '/^Showing nodes accounting for/ {gsub(",", ""); print $5, $8; exit}'
}

printf '\ndataset: %d shards, %.1f MB over HTTP (latencyproxy --dir); bench --epochs %d, %d runs a side, medians of samples/s\n' \
	"$shards" "$(echo "$bytes/1000000" | bc -l)" "$epochs" "$runs"
row() { printf '%-58s %10.0f  %10.0f   %.3f\n' "$1" "$2" "$3" "$(ratio "$2" "$3")"; }
printf '%-58s %10s  %10s   %s\n' "" "A" "B" "A/B"
row "cached (disk tier 2x, warm): order (A) vs lru (B)" "$(m "${c_order[@]}")" "$(m "${c_lru[@]}")"
row "uncached (disk tier of 2 shards): order (A) vs lru (B)" "$(m "${u_order[@]}")" "$(m "${u_lru[@]}")"
row "uncached: order, tier of 2 shards (A) vs no cache (B)" "$(m "${u_order[@]}")" "$(m "${u_none[@]}")"
row "node of 2 ranks, cached: affinity on (A) vs off (B)" "$(m "${a_on[@]}")" "$(m "${a_off[@]}")"
row "node of 2 ranks, no cache: affinity on (A) vs off (B)" "$(m "${an_on[@]}")" "$(m "${an_off[@]}")"

printf '\nhints (order runs; per shard and epoch: hint file bytes / shards announced):\n'
for f in c-order-0 u-order-0 a-on-0-r0 prof-c-order; do
	printf '  %-14s %s\n' "$f" "$(js "$out/$f.json" '"%d publishes, %d files bytes, %.1f B a shard an epoch, %.4f s publishing on the trainer goroutine of %.2f CPU s" % (r["hints"]["publishes"], r["hints"]["file_bytes"], r["hints"]["bytes_per_shard_epoch"], r["hints"]["seconds"], r["cpu_seconds"])')"
done
read -r hs tot < <(share "$out/c-order.prof") || true
printf '  CPU profile, cached order run of 8 epochs: %s of %s of samples under the hint code\n' "$hs" "$tot"
read -r hs tot < <(share "$out/node.prof") || true
printf '  CPU profile, rank 1 of the cached node:   %s of %s of samples under the hint code\n' "$hs" "$tot"

# 3. the plan's model against a measured job of 2 nodes of 2 ranks.
cachebytes=$((bytes / 4))
printf '\nplan against measured: world 4, 2 ranks a node, 4 epochs, a disk tier of %d bytes (0.25 D) a node; store bytes per node and epoch / D\n' "$cachebytes"
for aff in true false; do
	"$sl" plan --index "$work/ds.index" --nodes 2 --ranks-per-node 2 --epochs 4 --cache-bytes "$cachebytes" --batch-size 32 --seed 7 \
		--node-affinity="$aff" --json > "$out/plan-$aff.json"
	for p in order lru; do
		meas=() tot=0
		for n in 0 1; do
			rm -rf "$work/plan-cache"
			before=$(sent)
			pids=()
			for r in 0 1; do
				"$sl" bench "${common[@]}" --epochs 4 --world 4 --ranks-per-node 2 --rank $((2 * n + r)) --node-affinity="$aff" \
					--cache-dir "$work/plan-cache" --cache-disk "$cachebytes" --cache-policy "$p" "$url" > "$out/plan-$aff-$p-n$n-r$r.json" &
				pids+=($!)
			done
			wait "${pids[@]}"
			tot=$((tot + $(sent) - before))
			meas+=("$(python3 -c 'import json,sys; a,b=(json.load(open(f)) for f in sys.argv[1:]); print(" ".join(str(x["store_bytes"]+y["store_bytes"]) for x,y in zip(a["cache_epochs"],b["cache_epochs"])))' \
				"$out/plan-$aff-$p-n$n-r0.json" "$out/plan-$aff-$p-n$n-r1.json")")
		done
		model=$(js "$out/plan-$aff.json" '" ".join("%.3f" % (b / r["dataset_bytes"]) for b in r["cache_policies"]["'"$p"'"]["store_bytes_per_node"])')
		measured=$(python3 -c 'import sys; d=float(sys.argv[1]); a=[list(map(int,s.split())) for s in sys.argv[2:]]; print(" ".join("%.3f" % ((a[0][e]+a[1][e])/2/d) for e in range(len(a[0]))))' "$bytes" "${meas[@]}")
		counted=$(python3 -c 'import sys; print(sum(int(x) for s in sys.argv[1:] for x in s.split()))' "${meas[@]}")
		printf '  affinity %-5s %-5s  plan: %s   measured (mean of the 2 nodes): %s   (the store counted %.4f of what the caches counted)\n' \
			"$aff" "$p" "$model" "$measured" "$(ratio "$tot" "$counted")"
	done
done
