#!/usr/bin/env bash
# The cost of mixing: the same shards read as one dataset and as two streams that give
# all their samples once an epoch (4 and 12 of 16 shards), alternating, RUNS times
# each, from local files with an index. Prints the medians of samples/s and of CPU
# microseconds per sample of each, and their ratios (two streams over one dataset).
#
#   scripts/bench-mix.sh [RUNS] [EPOCHS]   (defaults 7, 20)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/bench-lib.sh
runs=${1:-7}
epochs=${2:-20}
go build -o bin/shardload ./cmd/shardload
work=.demo/bench-mix
rm -rf "$work"
mkdir -p "$work"
pattern=$(bin/shardload gen --shards 16 --samples 256 "$work/data")
bin/shardload index --no-index-store --output "$work/data/" "$pattern" > /dev/null
field() { python3 -c "import json,sys; r=json.load(sys.stdin); print(r['samples_per_sec'], 1e6*r['cpu_seconds_per_sample'])"; }
: > "$work/one" && : > "$work/two"
for i in $(seq "$runs"); do
	bin/shardload bench --no-index-store --epochs "$epochs" --json "$pattern" 2>/dev/null | field >> "$work/one"
	bin/shardload bench --no-index-store --epochs "$epochs" --json \
		--stream "$work/data/train-{000000..000003}.tar" --stream "$work/data/train-{000004..000015}.tar" 2>/dev/null | field >> "$work/two"
done
one_r=$(cut -d' ' -f1 "$work/one" | median); one_c=$(cut -d' ' -f2 "$work/one" | median)
two_r=$(cut -d' ' -f1 "$work/two" | median); two_c=$(cut -d' ' -f2 "$work/two" | median)
printf 'one dataset: %.0f samples/s, %.1f µs CPU a sample\n' "$one_r" "$one_c"
printf 'two streams: %.0f samples/s, %.1f µs CPU a sample\n' "$two_r" "$two_c"
printf 'ratio (two / one): %.3f samples/s, %.3f CPU a sample (medians of %d runs each)\n' \
	"$(echo "$two_r / $one_r" | bc -l)" "$(echo "$two_c / $one_c" | bc -l)" "$runs"
