#!/usr/bin/env bash
# The peer rows of the CPU-per-gigabyte benchmark, in one run on one machine state,
# each as a ratio against its peer measured in the same run (medians of RUNS, the
# two sides alternating):
#
#   1. loader CPU seconds per GB read from S3 (JPEG shards, index given, 3 epochs),
#      over a lean reader's (tools/leanget: one GET per object, bytes discarded);
#   2. image shards: shardload bench MB/s against leanget -jobs 4;
#   3. token shards (zstd): decompressed MB/s against leanget -jobs 2 -zstd, reading
#      the shards once (the row's figure) and three times (the bytes the loader's 3
#      epochs read: both sides then pay their start-up once for the same work);
#      Below rows 2 and 3, for reading them: the loader's epochs 2-3 alone against
#      the same peers (the first epoch carries the start-up), and the sample memory
#      the loader mapped new and the seconds faulting it in took;
#   4. bytes read / dataset bytes, world 8 over 4 of the image shards, indexed;
#   5. warm cache: shardload cat from S3 through a warm disk cache against shardload
#      cat of the same shards as local files;
#   6. peak RSS against the memory budget in effect + 64 MiB (what the process holds
#      beyond its buffers must fit in those 64 MiB), from row 2's runs and from the
#      same run at --memory 128MiB, where the budget binds;
#   7. with BENCH_IMAGES=1, scripts/bench-images.sh (decoded 224x224 images against
#      DataLoader(num_workers=2) + PIL + torchvision), whose own lines follow.
#
#   scripts/bench-peers.sh [RUNS] [SCALE]     (defaults: 3, 1)
#
# The target column is what BENCHMARKS.md's "CPU per gigabyte" and "Token shards
# against the zstd ceiling" sections hold the rows to.
#
# SCALE 1: 32 image shards of 300 samples of ~110 KB (about 1 GB) and 16 zstd token
# shards of 2,000 samples of 2,048 int32 tokens; SCALE 0.25 a quarter of the shards.
# MinIO is the one scripts/tools.sh builds, on 127.0.0.1, stopped at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/bench-lib.sh
runs=${1:-3}
scale=${2:-1}

go build -o bin/shardload ./cmd/shardload
go build -o bin/leanget ./tools/leanget
sl=bin/shardload
work=.demo/bench-peers
rm -rf "$work"
mkdir -p "$work"
nimg=$(python3 -c "print(max(4, round(32*$scale)))")
ntok=$(python3 -c "print(max(2, round(16*$scale)))")
img=$($sl gen --preset images --shards "$nimg" --samples 300 "$work/img")
tok=$($sl gen --preset tokens --compression zstd --shards "$ntok" --samples 2000 "$work/tok")
four=$(dirname "$img")/train-{000000..000003}.tar

trap stop_minio EXIT
start_minio "$work"
s3curl -X PUT "$AWS_ENDPOINT_URL/peers" > /dev/null
for f in "$work"/img/*.tar "$work"/tok/*.tar.zst; do
	s3curl -T "$f" "$AWS_ENDPOINT_URL/peers/$(basename "$(dirname "$f")")/$(basename "$f")" > /dev/null
done
s3img="s3://peers/img/$(basename "$img")"
s3tok="s3://peers/tok/$(basename "$tok")"
s3four="s3://peers/img/$(basename "$four")"
$sl index --no-index-store --output "$work/img.index" "$s3img" > /dev/null
$sl index --no-index-store --output "$work/tok.index" "$s3tok" > /dev/null
$sl index --no-index-store --output "$work/four.index" "$s3four" > /dev/null
imgurls=() tokurls=()
for f in "$work"/img/*.tar; do imgurls+=("s3://peers/img/$(basename "$f")"); done
for f in "$work"/tok/*.tar.zst; do tokurls+=("s3://peers/tok/$(basename "$f")"); done
imgbytes=$(cat "$work"/img/*.tar | wc -c)
fourbytes=$(eval cat "$four" | wc -c)

j() { python3 -c "import json,sys; d=json.load(sys.stdin); print(eval(sys.argv[1], {}, d))" "$1"; }
m() { printf '%s\n' "$@" | median; }
common=(--no-index-store --json)
lean_img=() lean_imgcpu=() sl_img=() sl_imgcpu=() rss=() lean_tok=() lean_tok3=() sl_tok=() local_cat=() warm_cat=() rss_small=()
sl_img_later=() sl_tok_later=() img_fresh=() img_fresh_s=() tok_fresh=() tok_fresh_s=()
# later: the MB/s of epochs 2 and 3 alone (the first carries the start-up and the
# sample memory faulted in new), from bytes (a JSON field) and epoch_seconds.
later() { j "$1*(len(epoch_seconds)-1)/len(epoch_seconds)/1e6/sum(epoch_seconds[1:])"; }
for ((i = 0; i < runs; i++)); do
	out=$(bin/leanget -jobs 4 "${imgurls[@]}")
	lean_img+=("$(j 'bytes_in/1e6/seconds' <<< "$out")")
	lean_imgcpu+=("$(j 'cpu_seconds/(bytes_in/1e9)' <<< "$out")")
	out=$($sl bench "${common[@]}" --epochs 3 --index "$work/img.index" --field jpg --field cls "$s3img" 2> /dev/null)
	sl_img+=("$(j 'mb_per_sec' <<< "$out")")
	sl_imgcpu+=("$(j 'cpu_seconds_per_gb' <<< "$out")")
	sl_img_later+=("$(later bytes_in <<< "$out")")
	img_fresh+=("$(j 'arena_fresh_bytes/1e6' <<< "$out")")
	img_fresh_s+=("$(j 'arena_fresh_seconds' <<< "$out")")
	rss+=("$(j 'peak_rss_bytes/(memory_budget_bytes+64*2**20)' <<< "$out")")
	out=$($sl bench "${common[@]}" --memory 128MiB --epochs 1 --index "$work/img.index" --field jpg --field cls "$s3img" 2> /dev/null)
	rss_small+=("$(j 'peak_rss_bytes/(memory_budget_bytes+64*2**20)' <<< "$out")")

	out=$(bin/leanget -jobs 2 -zstd "${tokurls[@]}")
	lean_tok+=("$(j 'bytes_decompressed/1e6/seconds' <<< "$out")")
	out=$(bin/leanget -jobs 2 -zstd "${tokurls[@]}" "${tokurls[@]}" "${tokurls[@]}")
	lean_tok3+=("$(j 'bytes_decompressed/1e6/seconds' <<< "$out")")
	out=$($sl bench "${common[@]}" --epochs 3 --index "$work/tok.index" --field tokens=npy:npy:int32:2048 --field cls "$s3tok" 2> /dev/null)
	sl_tok+=("$(j 'mb_per_sec_decompressed' <<< "$out")")
	sl_tok_later+=("$(later bytes_decompressed <<< "$out")")
	tok_fresh+=("$(j 'arena_fresh_bytes/1e6' <<< "$out")")
	tok_fresh_s+=("$(j 'arena_fresh_seconds' <<< "$out")")

	cache=$work/cache
	rm -rf "$cache"
	$sl cat --no-index-store --cache-dir "$cache" --cache-disk $((2 * imgbytes + (1 << 20))) "$s3img" > /dev/null
	warm_cat+=("$(secs $sl cat --no-index-store --cache-dir "$cache" --cache-disk $((2 * imgbytes + (1 << 20))) "$s3img")")
	local_cat+=("$(secs $sl cat --no-index-store "$img")")
done
reads=$(for ((r = 0; r < 8; r++)); do
	$sl bench "${common[@]}" --index "$work/four.index" --world 8 --rank $r --field jpg "$s3four" 2> /dev/null
done | python3 -c "
import json, sys
rows = [json.loads(l) for l in sys.stdin if l.strip()]
print(sum(r['bytes_in'] for r in rows) / $fourbytes, sum(r['requests'] for r in rows) / len(rows))")

r() { python3 -c "print(f'{$1:.2f}')"; }
printf 'peers: %d image shards (%.0f MB), %d token shards; %d runs, medians; MinIO on loopback\n' "$nimg" "$(echo "$imgbytes/1000000" | bc -l)" "$ntok" "$runs"
printf '%-58s %10s %10s\n' row figure target
printf '%-58s %10s %10s\n' "img CPU s per GB / lean reader's ($(r "$(m "${sl_imgcpu[@]}")") / $(r "$(m "${lean_imgcpu[@]}")"))" \
	"$(r "$(m "${sl_imgcpu[@]}")/$(m "${lean_imgcpu[@]}")")" "<= 1.3"
printf '%-58s %10s %10s\n' "img MB/s / leanget x4 MB/s ($(r "$(m "${sl_img[@]}")") / $(r "$(m "${lean_img[@]}")"))" \
	"$(r "$(m "${sl_img[@]}")/$(m "${lean_img[@]}")")" ">= 1.0"
printf '%-58s %10s %10s\n' "tok MB/s decomp. / leanget x2 + zstd ($(r "$(m "${sl_tok[@]}")") / $(r "$(m "${lean_tok[@]}")"))" \
	"$(r "$(m "${sl_tok[@]}")/$(m "${lean_tok[@]}")")" ">= 0.95"
printf '%-58s %10s %10s\n' "  the same / leanget x2 + zstd over the shards 3 times ($(r "$(m "${lean_tok3[@]}")"))" \
	"$(r "$(m "${sl_tok[@]}")/$(m "${lean_tok3[@]}")")" ""
printf '%-58s %10s %10s\n' "  epochs 2-3 alone: img MB/s / leanget x4 ($(r "$(m "${sl_img_later[@]}")"))" \
	"$(r "$(m "${sl_img_later[@]}")/$(m "${lean_img[@]}")")" ""
printf '%-58s %10s %10s\n' "  epochs 2-3 alone: tok MB/s / leanget x2 + zstd, 3 times ($(r "$(m "${sl_tok_later[@]}")"))" \
	"$(r "$(m "${sl_tok_later[@]}")/$(m "${lean_tok3[@]}")")" ""
printf '%-58s %10s %10s\n' "  sample memory mapped new, seconds (img $(r "$(m "${img_fresh[@]}")") MB, tok $(r "$(m "${tok_fresh[@]}")") MB)" \
	"$(r "$(m "${img_fresh_s[@]}")") $(r "$(m "${tok_fresh_s[@]}")")" ""
printf '%-58s %10s %10s\n' "bytes read / dataset, world 8 over 4 shards ($(r "${reads#* }") requests/rank)" "$(r "${reads% *}")" "<= 1.1"
printf '%-58s %10s %10s\n' "warm-cache cat / local cat ($(r "$(m "${warm_cat[@]}")")s / $(r "$(m "${local_cat[@]}")")s)" \
	"$(r "$(m "${local_cat[@]}")/$(m "${warm_cat[@]}")")" ">= 0.9"
printf '%-58s %10s %10s\n' "peak RSS / (memory budget + 64 MiB), default budget" "$(r "$(m "${rss[@]}")")" "<= 1"
printf '%-58s %10s %10s\n' "peak RSS / (memory budget + 64 MiB), --memory 128MiB" "$(r "$(m "${rss_small[@]}")")" "<= 1"
if [[ ${BENCH_IMAGES:-0} == 1 ]]; then
	stop_minio
	scripts/bench-images.sh
fi
