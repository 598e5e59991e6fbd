#!/usr/bin/env bash
# Measures read amplification: the bytes every rank of a job reads together, over the
# bytes of the dataset, and the requests they make, for several world sizes and read
# gaps, from local files and from S3 (MinIO on loopback). Each rank is one `shardload
# bench --json` run of one epoch with an index; the figures are summed over the ranks.
#
#   scripts/bench-reads.sh [WORLDS] [GAPS] [SHARDS] [SAMPLES]
#       (defaults: "2 4 8 16 64", "auto 64KiB 1MiB 0", 4, 500)
#
# A gap of 0 reads no sample a rank does not yield (one request per run of samples);
# auto is the source's request cost (file: 64 KiB, S3: 1 MiB). Samples are the gen
# default (16-48 KiB). Prints one line per source, world and gap: bytes read / dataset
# bytes, requests (ranged opens) per rank, and the CPU seconds of all ranks together
# (and of MinIO, for S3). First it measures each source's request cost with
# tools/fetchbench: one shard read as 32 KiB ranged requests and as 4 MiB ones; the
# cost of a request in CPU seconds over the cost of a byte, as bytes.
# Set BENCH_SOURCES="file" to leave S3 out.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/bench-lib.sh
worlds=${1:-2 4 8 16 64}
gaps=${2:-auto 64KiB 1MiB 0}
shards=${3:-4}
samples=${4:-500}
sources=${BENCH_SOURCES:-file s3}

go build -o bin/shardload ./cmd/shardload
go build -o bin/fetchbench ./tools/fetchbench
work=.demo/bench-reads
rm -rf "$work"
mkdir -p "$work"
pattern=$(bin/shardload gen --shards "$shards" --samples "$samples" "$work/data")
files=$(ls "$work"/data/train-*.tar)
bytes=$(cat $files | wc -c)
bin/shardload index --no-index-store --output "$work/data/" "$pattern" > /dev/null

if [[ $sources == *s3* ]]; then
	trap stop_minio EXIT
	start_minio "$work"
	s3curl -X PUT "$AWS_ENDPOINT_URL/shards" > /dev/null
	for f in $files "$work/data/shardload.index"; do
		s3curl -T "$f" "$AWS_ENDPOINT_URL/shards/$(basename "$f")" > /dev/null
	done
fi

mcpu() { if [[ -n ${minio_pid:-} ]]; then awk '{print ($14+$15)/100}' "/proc/$minio_pid/stat"; else echo 0; fi; }
# cost URL: a request's CPU cost in bytes, client and server together.
cost() {
	local m0 m1 m2 small large
	m0=$(mcpu)
	small=$(bin/fetchbench -ranges 32768 -repeat 4 "$1")
	m1=$(mcpu)
	large=$(bin/fetchbench -ranges 4194304 -repeat 16 "$1")
	m2=$(mcpu)
	python3 - "$small" "$(echo "$m1-$m0" | bc -l)" "$large" "$(echo "$m2-$m1" | bc -l)" << 'PY'
import sys
def parse(line, server):
    f = line.split()
    return int(f[2]), int(f[0]), float(f[6]) + float(server)
r1, b1, c1 = parse(sys.argv[1], sys.argv[2])
r2, b2, c2 = parse(sys.argv[3], sys.argv[4])
per_byte = (c2 * r1 - c1 * r2) / (b2 * r1 - b1 * r2)
per_req = (c1 - per_byte * b1) / r1
print(f"{per_req * 1e6:.0f} us CPU a request, {per_byte * 1e9:.2f} ns a byte: a request costs {per_req / per_byte / 1024:.0f} KiB")
PY
}
first=$(echo $files | cut -d' ' -f1)
echo "request cost, file: $(cost "$first")"
[[ $sources == *s3* ]] && echo "request cost, s3:   $(cost "s3://shards/$(basename "$first")")"

printf 'dataset: %d shards x %d samples, %.1f MB, indexed\n' "$shards" "$samples" "$(echo "$bytes/1000000" | bc -l)"
printf '%-6s %6s %7s %10s %14s %10s %10s\n' source world gap read/data requests/rank cpu_s minio_cpu_s
for src in $sources; do
	url=$pattern
	[[ $src == s3 ]] && url="s3://shards/$(basename "$pattern")"
	for w in $worlds; do
		for g in $gaps; do
			flag=()
			[[ $g != auto ]] && flag=(--read-gap "$g")
			m0=$(mcpu)
			read -r in req cpu < <(for ((r = 0; r < w; r++)); do
				bin/shardload bench --json --no-index-store --world "$w" --rank "$r" "${flag[@]}" --field jpg "$url" 2> /dev/null
			done | python3 -c '
import json, sys
rows = [json.loads(l) for l in sys.stdin if l.strip()]
print(sum(r["bytes_in"] for r in rows), sum(r.get("requests", 0) for r in rows) / len(rows), sum(r["cpu_seconds"] for r in rows))')
			m1=$(mcpu)
			printf '%-6s %6d %7s %10.3f %14.1f %10.2f %10.2f\n' "$src" "$w" "$g" "$(echo "$in/$bytes" | bc -l)" "$req" "$cpu" "$(echo "$m1-$m0" | bc -l)"
		done
	done
done
