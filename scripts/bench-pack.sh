#!/usr/bin/env bash
# Packed token streams (package packed, `shardload bench --pack`) against their peers,
# in one run on one machine state, the sides alternating, medians of RUNS:
#
#   1. tar shards of token documents from S3: `bench --pack tokens.npy:2048:eos=0`
#      against the unpacked path over the same shards (`bench --field tokens.npy`),
#      both at --batch-size 32, both as the shards' stored bytes / the run's seconds
#      (each report's "seconds", which leaves out its count_seconds: reading the
#      index, the same on both sides); beside it the packed side's tokens/s x 2 bytes;
#      and tools/packprof over the same shards: the packed loader alone, each batch
#      released for reuse as a consumer that has copied it does (bench --pack keeps
#      none), as the shards' stored bytes / its seconds (Open and every batch);
#   2. a Megatron dataset from S3: `bench --pack tokens:2048:eos=0` over X.idx
#      against tools/leanget over the X.bin object (one GET, bytes discarded), both as
#      the .bin's bytes / seconds, the same with int32 input_ids (ids=int32), and
#      tools/packprof over X.idx likewise;
#   3. the plan's time (plan_seconds: packed.Open, the epoch's order and rows) and
#      the state's size (state_bytes, JSON) over a local Megatron dataset of
#      PLAN_DOCS short documents.
#
#   scripts/bench-pack.sh [RUNS]     (default 3)
#
# Data (tools/packgen, the same bytes every run): TAR_SHARDS (32) uncompressed tar
# shards of 1,600 documents of 200-4,000 uint16 tokens (a tokens.npy member each,
# about 8 MB a shard), indexed (`shardload index`, shardload.index uploaded beside
# them); a Megatron dataset of MEG_DOCS (48,000) documents of 200-4,000 uint16
# tokens (about 200 MB of .bin); PLAN_DOCS (1,000,000) documents of 16-64 tokens.
# MinIO is the one scripts/tools.sh builds, on 127.0.0.1, stopped at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/bench-lib.sh
runs=${1:-3}
nshards=${TAR_SHARDS:-32}
megdocs=${MEG_DOCS:-48000}
plandocs=${PLAN_DOCS:-1000000}
work=.demo/bench-pack
rm -rf "$work"
mkdir -p "$work/bin"
bench_dirs

go build -o "$work/bin/shardload" ./cmd/shardload
go build -o "$work/bin/leanget" ./tools/leanget
go build -o "$work/bin/packgen" ./tools/packgen
go build -o "$work/bin/packprof" ./tools/packprof
sl=$work/bin/shardload
log "generating data"
pattern=$("$work/bin/packgen" tar "$work/tok" "$nshards" 1600 200 4000)
"$work/bin/packgen" megatron "$work/meg" "$megdocs" 200 4000 > /dev/null
"$work/bin/packgen" megatron "$work/plan" "$plandocs" 16 64 > /dev/null
tarbytes=$(cat "$work"/tok/*.tar | wc -c)
binbytes=$(stat -c %s "$work/meg.bin")

trap stop_minio EXIT
start_minio "$work"
log "uploading"
s3curl -X PUT "$AWS_ENDPOINT_URL/pack" > /dev/null
for f in "$work"/tok/*.tar; do
	s3curl -T "$f" "$AWS_ENDPOINT_URL/pack/tok/$(basename "$f")" > /dev/null
done
s3curl -T "$work/meg.bin" "$AWS_ENDPOINT_URL/pack/meg/corpus.bin" > /dev/null
s3curl -T "$work/meg.idx" "$AWS_ENDPOINT_URL/pack/meg/corpus.idx" > /dev/null
s3tok="s3://pack/tok/$(basename "$pattern")"
mkdir -p "$work/idx"
$sl index --no-index-store --output "$work/idx/" "$s3tok" 2> /dev/null
s3curl -T "$work/idx/shardload.index" "$AWS_ENDPOINT_URL/pack/tok/shardload.index" > /dev/null

j() { python3 -c "import json,sys; d=json.load(sys.stdin); print(eval(sys.argv[1], {}, d))" "$1"; }
m() { printf '%s\n' "$@" | median; }
r() { python3 -c "print(f'{$1:.${2:-2}f}')"; }
common=(--no-index-store --json --batch-size 32)
plain=() packtar=() packtok=() packmeg=() packmeg32=() lean=() plan=() state=() proftar=() profmeg=()
for ((i = 0; i < runs; i++)); do
	log "run $((i + 1))/$runs"
	out=$($sl bench "${common[@]}" --field tokens.npy "$s3tok" 2> "$work/plain.log")
	plain+=("$(j "$tarbytes/1e6/seconds" <<< "$out")")
	out=$($sl bench "${common[@]}" --pack tokens.npy:2048:eos=0 "$s3tok" 2> "$work/packtar.log")
	packtar+=("$(j "$tarbytes/1e6/seconds" <<< "$out")")
	packtok+=("$(j "tokens_per_second*2/1e6" <<< "$out")")
	out=$("$work/bin/packprof" -json -batch-size 32 tokens.npy:2048:eos=0 "$s3tok" 2> "$work/proftar.log")
	proftar+=("$(j "$tarbytes/1e6/seconds" <<< "$out")")

	out=$("$work/bin/leanget" -jobs 1 s3://pack/meg/corpus.bin)
	lean+=("$(j "bytes_in/1e6/seconds" <<< "$out")")
	out=$($sl bench "${common[@]}" --pack tokens:2048:eos=0 s3://pack/meg/corpus.idx 2> "$work/packmeg.log")
	packmeg+=("$(j "$binbytes/1e6/seconds" <<< "$out")")
	out=$("$work/bin/packprof" -json -batch-size 32 tokens:2048:eos=0 s3://pack/meg/corpus.idx 2> "$work/profmeg.log")
	profmeg+=("$(j "$binbytes/1e6/seconds" <<< "$out")")
	out=$($sl bench "${common[@]}" --pack tokens:2048:eos=0:ids=int32 s3://pack/meg/corpus.idx 2> "$work/packmeg32.log")
	packmeg32+=("$(j "$binbytes/1e6/seconds" <<< "$out")")

	out=$($sl bench "${common[@]}" --batches 1 --pack tokens:2048:eos=0 "$work/plan.idx" 2> /dev/null)
	plan+=("$(j plan_seconds <<< "$out")")
	state+=("$(j state_bytes <<< "$out")")
done

printf 'packed token streams: %d tar shards (%s MB), Megatron .bin %s MB, plan over %d documents; %d runs, medians; MinIO on loopback\n' \
	"$nshards" "$(r "$tarbytes/1e6" 0)" "$(r "$binbytes/1e6" 0)" "$plandocs" "$runs"
printf '%-66s %8s %8s\n' row figure target
printf '%-66s %8s %8s\n' "tar from S3: packed / unpacked stored MB/s ($(r "$(m "${packtar[@]}")" 1) / $(r "$(m "${plain[@]}")" 1))" \
	"$(r "$(m "${packtar[@]}")/$(m "${plain[@]}")")" ">= 0.95"
printf '%-66s %8s %8s\n' "  packed tokens/s x 2 bytes, MB/s" "$(r "$(m "${packtok[@]}")" 1)" ""
printf '%-66s %8s %8s\n' "tar from S3: packprof (released) / unpacked ($(r "$(m "${proftar[@]}")" 1) / $(r "$(m "${plain[@]}")" 1))" \
	"$(r "$(m "${proftar[@]}")/$(m "${plain[@]}")")" ">= 0.95"
printf '%-66s %8s %8s\n' "Megatron from S3: packed / leanget MB/s ($(r "$(m "${packmeg[@]}")" 1) / $(r "$(m "${lean[@]}")" 1))" \
	"$(r "$(m "${packmeg[@]}")/$(m "${lean[@]}")")" ">= 0.9"
printf '%-66s %8s %8s\n' "Megatron from S3: packed ids=int32 / leanget ($(r "$(m "${packmeg32[@]}")" 1) / $(r "$(m "${lean[@]}")" 1))" \
	"$(r "$(m "${packmeg32[@]}")/$(m "${lean[@]}")")" ""
printf '%-66s %8s %8s\n' "Megatron from S3: packprof (released) / leanget ($(r "$(m "${profmeg[@]}")" 1) / $(r "$(m "${lean[@]}")" 1))" \
	"$(r "$(m "${profmeg[@]}")/$(m "${lean[@]}")")" ">= 0.9"
printf '%-66s %8s %8s\n' "plan_seconds, $plandocs documents" "$(r "$(m "${plan[@]}")" 3)" ""
printf '%-66s %8s %8s\n' "state_bytes (JSON)" "$(m "${state[@]}")" ""
printf 'each run (plain packtar packtok proftar lean packmeg profmeg plan state):\n'
for ((i = 0; i < runs; i++)); do
	echo "${plain[i]} ${packtar[i]} ${packtok[i]} ${proftar[i]} ${lean[i]} ${packmeg[i]} ${profmeg[i]} ${plan[i]} ${state[i]}"
done
