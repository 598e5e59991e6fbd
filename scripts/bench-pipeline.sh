#!/usr/bin/env bash
# Measures the whole pipeline against its baselines in one run, on one machine state,
# so that every figure can be read as a ratio:
#
#   - two datasets of about 1 GiB each, generated once and reused: "images" (plain tar,
#     ~110 KB jpg + cls per sample) and "tokens" (zstd shards, 2048 int32 tokens as npy
#     + cls per sample);
#   - MinIO started as a native process on 127.0.0.1 (random free port, temporary data
#     directory, stopped on exit), the shards uploaded with curl (SigV4) into a bucket
#     that is then made public-read, and index files written by `shardload ls`;
#   - per dataset: the raw fetch ceiling (every object fetched by 4 parallel curl
#     processes to /dev/null), the PyTorch DataLoader baseline (bench/dataloader_baseline.py),
#     for zstd the single-core decode rate (tools/zstdrate), and `shardload bench`
#     for throughput (--step-time 0), sustained throughput (--epochs 3: the epochs
#     after the first) and trainer wait (--step-time 50ms --batches N).
#     Ceiling and shardload throughput runs alternate; medians are reported.
#
#   scripts/bench-pipeline.sh [--work DIR] [--out DIR] [--scale F] [--runs N] [--only images|tokens]
#
# Environment (flags win): BENCH_WORK (default .demo/bench-pipeline), BENCH_OUT
# (default WORK/results/TIMESTAMP), BENCH_SCALE (default 1; 0.05 for a quick trial),
# BENCH_RUNS (3), BENCH_PY_RUNS (3, or 1 when the first run takes over
# BENCH_PY_SLOW seconds, default 60), BENCH_WAIT_BATCHES (100), BENCH_STEP_TIME (50ms),
# BENCH_CORES (nproc; for the zstd ceiling), BENCH_ONLY (images or tokens),
# BENCH_RUN_TIMEOUT (600: seconds one measured run may take before it is killed and
# counted as failed).
# BENCH_SHARDLOAD (a shardload binary to measure instead of building bin/shardload),
# BENCH_SL_FLAGS (more flags for shardload bench and serve, e.g. --fetch-parallel 1),
# BENCH_PYTHON (the baseline's interpreter; default: python3 or /usr/bin/python3,
# whichever imports torch).
# Needs: go, curl (with --aws-sigv4), python3; PyTorch and numpy for the baseline
# (scripts/deps.sh installs them; without torch the baseline is skipped); python3-zstandard
# for the baseline on zstd shards (skipped without it).
# Results: one JSON file per run in the output directory, summary.json, summary.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
# shellcheck source=scripts/bench-lib.sh
. scripts/bench-lib.sh

work=${BENCH_WORK:-.demo/bench-pipeline}
out=${BENCH_OUT:-}
scale=${BENCH_SCALE:-1}
runs=${BENCH_RUNS:-3}
py_runs=${BENCH_PY_RUNS:-3}
py_slow=${BENCH_PY_SLOW:-60}
wait_batches=${BENCH_WAIT_BATCHES:-100}
step_time=${BENCH_STEP_TIME:-50ms}
cores=${BENCH_CORES:-$(nproc)}
run_timeout=${BENCH_RUN_TIMEOUT:-600}
only=${BENCH_ONLY:-}
sl_flags=${BENCH_SL_FLAGS:-}
while [[ $# -gt 0 ]]; do
	case $1 in
	--work) work=$2; shift 2 ;;
	--out) out=$2; shift 2 ;;
	--scale) scale=$2; shift 2 ;;
	--runs) runs=$2; shift 2 ;;
	--only) only=$2; shift 2 ;;
	-h | --help) sed -n '2,34s/^# \{0,1\}//p' "$0"; exit 0 ;;
	*) echo "bench-pipeline: unknown argument $1 (see --help)" >&2; exit 2 ;;
	esac
done
case $only in "" | images | tokens) ;; *) echo "bench-pipeline: --only images|tokens" >&2; exit 2 ;; esac
[[ $scale =~ ^([0-9]+\.?[0-9]*|\.[0-9]+)$ ]] && awk -v f="$scale" 'BEGIN {exit !(f > 0)}' ||
	{ echo "bench-pipeline: scale must be a positive number, not $scale" >&2; exit 2; }
[[ $runs =~ ^[1-9][0-9]*$ ]] || { echo "bench-pipeline: runs must be a positive integer" >&2; exit 2; }
bench_dirs
now() { date +%s.%N; }
# jget FILE KEY: a top-level key of a one-object JSON file ("" if absent or null).
jget() { python3 -c 'import json,sys; v=json.load(open(sys.argv[1])).get(sys.argv[2]); print("" if v is None else v)' "$1" "$2"; }
# jfmt FILE KEY [FORMAT]: a number from a JSON file, printf-formatted (default %.1f).
jfmt() { python3 -c 'import json,sys; v=json.load(open(sys.argv[1])).get(sys.argv[2]); print("-" if v is None else sys.argv[3] % v)' "$1" "$2" "${3:-%.1f}"; }
command -v curl > /dev/null || { echo "bench-pipeline: curl not found (scripts/deps.sh installs it)" >&2; exit 1; }
command -v python3 > /dev/null || { echo "bench-pipeline: python3 not found (scripts/deps.sh installs it)" >&2; exit 1; }
curl --help all 2> /dev/null | grep -q -- --aws-sigv4 || { echo "bench-pipeline: this curl has no --aws-sigv4 (need 7.75 or later)" >&2; exit 1; }

# --- build -----------------------------------------------------------------------
if [[ -n ${BENCH_SHARDLOAD:-} ]]; then
	sl=$(command -v "$BENCH_SHARDLOAD") || { echo "bench-pipeline: BENCH_SHARDLOAD=$BENCH_SHARDLOAD not found" >&2; exit 1; }
	log "using $sl (BENCH_SHARDLOAD); building bin/zstdrate"
else
	log "building bin/shardload and bin/zstdrate"
	go build -o bin/shardload ./cmd/shardload ||
		{ echo "bench-pipeline: go build ./cmd/shardload failed (BENCH_SHARDLOAD=BINARY measures a binary built before)" >&2; exit 1; }
	sl=$root/bin/shardload
fi
go build -o bin/zstdrate ./tools/zstdrate
have_bench=0
if "$sl" bench --help > /dev/null 2>&1; then
	have_bench=1
else
	log "NOTE: '$sl bench --help' fails: shardload bench is not available yet; its runs are skipped"
fi
# The baseline's Python: $BENCH_PYTHON, else the first of python3 on PATH and Debian's
# /usr/bin/python3 that imports torch and numpy (a pyenv or venv python3 first on PATH
# does not see the Debian packages scripts/deps.sh installs).
py=
for cand in ${BENCH_PYTHON:-python3 /usr/bin/python3}; do
	if "$cand" -c 'import torch, numpy' 2> /dev/null; then
		py=$cand
		break
	fi
done
if [[ -n $py ]]; then
	log "DataLoader baseline: $py ($("$py" -c 'import sys, torch; print("Python", sys.version.split()[0], "torch", torch.__version__)'))"
	"$py" -c 'import zstandard' 2> /dev/null || log "NOTE: $py has no zstandard module (Debian: python3-zstandard): the baseline skips zstd shards"
else
	log "NOTE: no python3 that imports torch and numpy (scripts/deps.sh installs them; or set BENCH_PYTHON): the DataLoader baseline is skipped"
fi

# --- datasets ----------------------------------------------------------------------
# size N F: round(N*F), at least 1.
size() { awk -v n="$1" -v f="$2" 'BEGIN {v = int(n*f + 0.5); print (v < 1 ? 1 : v)}'; }
# layout SHARDS SAMPLES: at scale, keep at least 4 shards (4 curl processes, 2 workers)
# and scale the samples per shard for the rest.
layout() {
	local shards samples
	shards=$(size "$1" "$scale")
	((shards >= 4)) || shards=4
	samples=$(size "$(($1 * $2))" "$scale")
	samples=$(((samples + shards - 1) / shards))
	echo "$shards $samples"
}
# dataset NAME PRESET COMPRESSION SHARDS SAMPLES: generate into WORK once; sets
# ds_dir and ds_pattern (the local brace pattern).
dataset() {
	local name=$1 preset=$2 comp=$3 shards=$4 samples=$5
	ds_dir=$work/$name-$comp-${shards}x$samples
	if [[ -f $ds_dir/.complete ]]; then
		ds_pattern=$(cat "$ds_dir/.complete")
		log "$name: reusing $ds_dir"
		return
	fi
	log "$name: generating $shards shards x $samples samples (--preset $preset --compression $comp) in $ds_dir"
	rm -rf "$ds_dir"
	ds_pattern=$("$sl" gen --preset "$preset" --compression "$comp" --shards "$shards" --samples "$samples" --seed 1 "$ds_dir")
	echo "$ds_pattern" > "$ds_dir/.complete"
}

declare -A DIR PATTERN
names=()
failed=() # what failed but let the rest run; the script then exits 1
[[ $only == tokens ]] || {
	read -r s n < <(layout 32 300)
	dataset images images none "$s" "$n"
	DIR[images]=$ds_dir PATTERN[images]=$ds_pattern
	names+=(images)
}
[[ $only == images ]] || {
	read -r s n < <(layout 64 2000)
	dataset tokens tokens zstd "$s" "$n"
	DIR[tokens]=$ds_dir PATTERN[tokens]=$ds_pattern
	names+=(tokens)
}

# --- MinIO -------------------------------------------------------------------------
minio_bin=${SHARDLOAD_MINIO_BIN:-$(scripts/tools.sh path minio)}
if [[ ! -x $minio_bin ]]; then
	log "MinIO not built yet: scripts/tools.sh (minutes the first time)"
	scripts/tools.sh >&2
fi
minio_dir=$(mktemp -d "${TMPDIR:-/tmp}/bench-pipeline-minio.XXXXXX")
minio_pid=
cleanup() {
	local rc=$?
	serve_stop 2> /dev/null || true
	if [[ -n $minio_pid ]] && kill -0 "$minio_pid" 2> /dev/null; then
		kill -TERM "$minio_pid" 2> /dev/null || true
		local i
		for ((i = 0; i < 100; i++)); do # up to 10 s, then SIGKILL
			kill -0 "$minio_pid" 2> /dev/null || break
			sleep 0.1
		done
		kill -KILL "$minio_pid" 2> /dev/null || true
		wait "$minio_pid" 2> /dev/null || true
	fi
	rm -rf "$minio_dir"
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# free_ports N: N distinct free TCP ports on 127.0.0.1 (free when asked; MinIO may
# still lose a race for one, in which case we try again).
free_ports() {
	python3 -c '
import socket, sys
socks = []
for _ in range(int(sys.argv[1])):
    s = socket.socket(); s.bind(("127.0.0.1", 0)); socks.append(s)
print(" ".join(str(s.getsockname()[1]) for s in socks))' "$1"
}
rand_hex() { od -An -N"$1" -tx1 /dev/urandom | tr -d ' \n'; }

access_key=bench-$(rand_hex 6)
secret_key=$(rand_hex 16)
region=us-east-1
bucket=bench
endpoint=
pdeath=()
setpriv --help 2> /dev/null | grep -q pdeathsig && pdeath=(setpriv --pdeathsig KILL --)
for attempt in 1 2 3; do
	read -r port console < <(free_ports 2)
	log "starting MinIO on 127.0.0.1:$port (attempt $attempt, data in $minio_dir)"
	MINIO_ROOT_USER=$access_key MINIO_ROOT_PASSWORD=$secret_key MINIO_BROWSER=off \
		MINIO_UPDATE=off MINIO_CI_CD=1 \
		"${pdeath[@]}" "$minio_bin" server --quiet --address "127.0.0.1:$port" \
		--console-address "127.0.0.1:$console" "$minio_dir/data" > "$minio_dir/minio.log" 2>&1 &
	minio_pid=$!
	deadline=$(($(date +%s) + 60))
	ready=0
	while (($(date +%s) < deadline)); do
		kill -0 "$minio_pid" 2> /dev/null || break
		if curl -fsS --noproxy '*' -m 2 -o /dev/null "http://127.0.0.1:$port/minio/health/live" 2> /dev/null; then
			ready=1
			break
		fi
		sleep 0.1
	done
	if ((ready)); then
		# Our credentials prove that the server answering is ours.
		if curl -fsS --noproxy '*' -m 10 -o /dev/null --aws-sigv4 "aws:amz:$region:s3" \
			--user "$access_key:$secret_key" "http://127.0.0.1:$port/"; then
			endpoint=http://127.0.0.1:$port
			break
		fi
	fi
	log "MinIO did not start; log tail:"
	tail -n 20 "$minio_dir/minio.log" >&2 || true
	kill -KILL "$minio_pid" 2> /dev/null || true
	wait "$minio_pid" 2> /dev/null || true
	minio_pid=
	rm -rf "$minio_dir/data"
done
[[ -n $endpoint ]] || { echo "bench-pipeline: MinIO did not become ready" >&2; exit 1; }
log "MinIO ready at $endpoint"

# s3curl ARGS...: curl signed with the root credentials.
s3curl() { curl -fsS --noproxy '*' -m 600 --aws-sigv4 "aws:amz:$region:s3" --user "$access_key:$secret_key" "$@"; }
s3curl -X PUT -o /dev/null "$endpoint/$bucket"
policy=$(printf '{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Principal":{"AWS":["*"]},"Action":["s3:GetObject"],"Resource":["arn:aws:s3:::%s/*"]}]}' "$bucket")
# curl 7.88 signs a request body with its SHA-256 but does not send it, and MinIO
# takes a missing x-amz-content-sha256 as the empty body's: send it. "?policy=", not
# "?policy": 7.88 canonicalizes a bare query key differently from S3.
s3curl -X PUT -o /dev/null -H 'Content-Type: application/json' \
	-H "x-amz-content-sha256: $(printf %s "$policy" | sha256sum | cut -d' ' -f1)" \
	--data-binary "$policy" "$endpoint/$bucket?policy="

export AWS_ENDPOINT_URL=$endpoint AWS_ENDPOINT_URL_S3=$endpoint AWS_ACCESS_KEY_ID=$access_key \
	AWS_SECRET_ACCESS_KEY=$secret_key AWS_REGION=$region AWS_EC2_METADATA_DISABLED=true
unset AWS_SESSION_TOKEN AWS_PROFILE AWS_DEFAULT_PROFILE

declare -A FILES URLS S3PAT BYTES NSHARDS INDEX WAITB
for name in "${names[@]}"; do
	dir=${DIR[$name]}
	files=$(find "$dir" -maxdepth 1 -name 'train-*' -type f | sort)
	n=$(wc -l <<< "$files")
	bytes=$(xargs stat -c %s <<< "$files" | awk '{s += $1} END {print s}')
	log "$name: uploading $n shards ($(awk -v b="$bytes" 'BEGIN {printf "%.1f", b/1e6}') MB) to s3://$bucket/$name/"
	t0=$(now)
	# Four uploads at a time; curl streams each file (-T), the headers signed, the
	# payload declared unsigned.
	xargs -P 4 -I{} sh -c 'curl -fsS --noproxy "*" -m 600 --aws-sigv4 "$1" --user "$2" \
		-H "x-amz-content-sha256: UNSIGNED-PAYLOAD" -o /dev/null -T "$3" "$4/$(basename "$3")"' \
		sh "aws:amz:$region:s3" "$access_key:$secret_key" {} "$endpoint/$bucket/$name" <<< "$files"
	log "$name: uploaded in $(awk -v a="$t0" -v b="$(now)" 'BEGIN {printf "%.1f", b-a}')s"
	FILES[$name]=$files
	NSHARDS[$name]=$n
	BYTES[$name]=$bytes
	URLS[$name]=$out/$name.urls
	sed "s|^.*/|$endpoint/$bucket/$name/|" <<< "$files" > "${URLS[$name]}"
	S3PAT[$name]=s3://$bucket/$name/$(basename "${PATTERN[$name]}")
	INDEX[$name]=$out/$name.index.jsonl
	"$sl" ls --summary --json "${S3PAT[$name]}" > "${INDEX[$name]}"
	samples=$(python3 -c 'import json, sys; print(sum(json.loads(l)["samples"] for l in open(sys.argv[1])))' "${INDEX[$name]}")
	# The trainer-wait runs stay within one epoch (shardload bench --batches does not
	# go past --epochs), so both tools see the same batches.
	WAITB[$name]=$(((samples / 32) < wait_batches ? samples / 32 : wait_batches))
	((WAITB[$name] > 0)) || WAITB[$name]=1
	log "$name: index ${INDEX[$name]} ($(wc -l < "${INDEX[$name]}") shards, $samples samples)"
	printf '{"name":"%s","dir":"%s","local_pattern":"%s","s3_pattern":"%s","shards":%d,"samples":%d,"bytes":%d,"wait_batches":%d,"urls_file":"%s","index":"%s"}\n' \
		"$name" "$dir" "${PATTERN[$name]}" "${S3PAT[$name]}" "$n" "$samples" "$bytes" "${WAITB[$name]}" "${URLS[$name]}" "${INDEX[$name]}" > "$out/$name.dataset.json"
	# The public-read policy works: a plain GET of one object.
	curl -fsS --noproxy '*' -m 60 -o /dev/null -r 0-0 "$(head -n 1 "${URLS[$name]}")"
done

# --- measurements --------------------------------------------------------------------
# ceiling NAME I: fetch every object of NAME with 4 parallel curl processes (each a
# contiguous quarter of the list, one connection reused) into /dev/null.
ceiling() {
	local name=$1 i=$2 n per t0 t1
	n=${NSHARDS[$name]}
	per=$(((n + 3) / 4))
	t0=$(now)
	xargs -P 4 -n "$per" curl -fsS --noproxy '*' -m "$run_timeout" < "${URLS[$name]}" > /dev/null
	t1=$(now)
	awk -v a="$t0" -v b="$t1" -v bytes="${BYTES[$name]}" -v n="$n" 'BEGIN {
		s = b - a; printf "{\"objects\":%d,\"bytes\":%d,\"seconds\":%.6f,\"mb_per_sec\":%.3f,\"processes\":4}\n", n, bytes, s, bytes/1e6/s }' \
		> "$out/$name.ceiling.$i.json"
}

# fields NAME: the --field flags of shardload bench for a dataset.
fields() {
	case $1 in
	images) echo --field jpg --field cls ;;
	tokens) echo --field tokens=npy:npy:int32:2048 --field cls ;;
	esac
}
# sl_bench NAME OUTFILE ARGS...: one `shardload bench --json` run.
sl_bench() {
	local name=$1 dest=$2; shift 2
	# shellcheck disable=SC2046
	if ! timeout --foreground -k 10 "$run_timeout" "$sl" bench --json --batch-size 32 --index "${INDEX[$name]}" $(fields "$name") $sl_flags "$@" \
		"${S3PAT[$name]}" > "$dest.tmp" 2> "$dest.err"; then
		log "$name: shardload bench failed or timed out after ${run_timeout}s (see $dest.err):"
		tail -n 5 "$dest.err" >&2
		rm -f "$dest.tmp"
		failed+=("$name: shardload bench $*")
		return 1
	fi
	tail -n 1 "$dest.tmp" > "$dest" && rm -f "$dest.tmp"
	[[ -s $dest.err ]] || rm -f "$dest.err"
	if ! python3 -c 'import json, sys; float(json.load(open(sys.argv[1]))["seconds"])' "$dest" 2> /dev/null; then
		log "$name: shardload bench printed no JSON object with \"seconds\" (kept as $dest.bad)"
		mv "$dest" "$dest.bad"
		failed+=("$name: shardload bench $* (bad JSON)")
		return 1
	fi
}

# serve_start NAME: start `shardload serve` for a dataset (its own pipeline flags as
# bench's), wait until it listens; sets serve_pid and serve_sock. serve_stop ends it.
serve_pid=
serve_start() {
	local name=$1 deadline
	serve_sock=$(mktemp -d "${TMPDIR:-/tmp}/bench-serve.XXXXXX")/run/loader.sock
	# shellcheck disable=SC2046
	"$sl" serve --socket "$serve_sock" --index "${INDEX[$name]}" $(fields "$name") $sl_flags "${S3PAT[$name]}" \
		> "$out/$name.serve.log" 2>&1 &
	serve_pid=$!
	deadline=$(($(date +%s) + 30))
	while ! grep -q "listening on" "$out/$name.serve.log"; do
		if ! kill -0 "$serve_pid" 2> /dev/null || (($(date +%s) > deadline)); then
			log "$name: shardload serve did not start (see $out/$name.serve.log)"
			serve_stop
			return 1
		fi
		sleep 0.1
	done
}
serve_stop() {
	[[ -n $serve_pid ]] || return 0
	kill -TERM "$serve_pid" 2> /dev/null || true
	wait "$serve_pid" 2> /dev/null || true
	serve_pid=
	rm -rf "$(dirname "$(dirname "$serve_sock")")"
}
# sl_serve NAME OUTFILE ARGS...: one run of bench/serve_trainer.py (a PyTorch trainer
# stand-in fed by the server through the Python client).
sl_serve() {
	local name=$1 dest=$2; shift 2
	# shellcheck disable=SC2046
	if ! timeout --foreground -k 10 "$run_timeout" "$py" bench/serve_trainer.py --json --socket "$serve_sock" \
		--batch-size 32 $(fields "$name") "$@" > "$dest" 2> "$dest.err"; then
		log "$name: serve_trainer.py failed or timed out (see $dest.err):"
		tail -n 5 "$dest.err" >&2
		rm -f "$dest"
		failed+=("$name: serve_trainer.py $*")
		return 1
	fi
	[[ -s $dest.err ]] || rm -f "$dest.err"
}
step_seconds=$(awk -v t="$step_time" 'BEGIN { if (t ~ /ms$/) print t/1000; else if (t ~ /s$/) print t+0; else print t }')

for name in "${names[@]}"; do
	log "== $name: ${NSHARDS[$name]} shards, ${BYTES[$name]} bytes stored"
	serve_ok=0
	if [[ -n $py ]] && ((have_bench)) && "$sl" serve --help > /dev/null 2>&1; then
		serve_start "$name" && serve_ok=1
	fi
	# Ceiling, shardload bench and the served trainer alternate, so all see the same
	# machine state. A kind of run that fails once is not repeated (a hang costs the
	# timeout).
	sl_ok=$have_bench
	for ((i = 1; i <= runs; i++)); do
		if ((serve_ok)); then
			if sl_serve "$name" "$out/$name.serve.$i.json" --epochs 1; then
				log "$name: serve + Python client run $i: $(jfmt "$out/$name.serve.$i.json" samples_per_sec %.0f) samples/s, client $(jfmt "$out/$name.serve.$i.json" client_overhead_us) us/batch"
			else
				serve_ok=0
			fi
		fi
		ceiling "$name" "$i"
		log "$name: curl ceiling run $i: $(jfmt "$out/$name.ceiling.$i.json" mb_per_sec) MB/s"
		if ((sl_ok)); then
			if sl_bench "$name" "$out/$name.shardload.$i.json" --epochs 1 --step-time 0; then
				log "$name: shardload bench run $i: $(jfmt "$out/$name.shardload.$i.json" mb_per_sec) MB/s out, $(jfmt "$out/$name.shardload.$i.json" samples_per_sec %.0f) samples/s"
			else
				sl_ok=0
			fi
		fi
	done
	if ((have_bench)); then
		# The sustained rate: three epochs in one process, the first of which carries
		# the start-up (process, memory, connections) that a one-epoch run is judged
		# with; the summary takes the median of the later epochs.
		for ((i = 1; i <= runs; i++)); do
			if sl_bench "$name" "$out/$name.shardload-sustained.$i.json" --epochs 3 --step-time 0; then
				log "$name: shardload bench --epochs 3 run $i: epochs took $(python3 -c 'import json,sys; print(" ".join("%.2fs" % s for s in json.load(open(sys.argv[1])).get("epoch_seconds") or []))' "$out/$name.shardload-sustained.$i.json")"
			else
				break
			fi
		done
		for ((i = 1; i <= runs; i++)); do
			if sl_bench "$name" "$out/$name.shardload-wait.$i.json" --batches "${WAITB[$name]}" --step-time "$step_time"; then
				log "$name: shardload bench --step-time $step_time --batches ${WAITB[$name]} run $i: wait_fraction $(jfmt "$out/$name.shardload-wait.$i.json" wait_fraction %.3f)"
			else
				break
			fi
		done
	else
		log "$name: SKIPPED shardload bench (not available yet)"
	fi

	if ((serve_ok)); then
		for ((i = 1; i <= runs; i++)); do
			if sl_serve "$name" "$out/$name.serve-wait.$i.json" --batches "${WAITB[$name]}" --step-time "$step_seconds"; then
				log "$name: serve + client --step-time $step_time --batches ${WAITB[$name]} run $i: wait_fraction $(jfmt "$out/$name.serve-wait.$i.json" wait_fraction %.3f)"
			else
				break
			fi
		done
	fi
	serve_stop

	if [[ $name == tokens ]]; then
		# shellcheck disable=SC2086
		timeout --foreground -k 10 "$run_timeout" bin/zstdrate ${FILES[$name]} > "$out/$name.zstdrate.json"
		log "$name: zstd single core: $(jfmt "$out/$name.zstdrate.json" mb_per_sec_decompressed) MB/s decompressed"
	fi

	if [[ -n $py ]]; then
		n_py=$py_runs
		for ((i = 1; i <= n_py; i++)); do
			if ! timeout --foreground -k 10 "$run_timeout" "$py" bench/dataloader_baseline.py --json --urls-file "${URLS[$name]}" --epochs 1 \
				--batch-size 32 --workers 2 --step-time 0 > "$out/$name.baseline.$i.json"; then
				log "$name: DataLoader baseline run $i failed or timed out after ${run_timeout}s"
				failed+=("$name: DataLoader baseline run $i")
				rm -f "$out/$name.baseline.$i.json"
				break
			fi
			if [[ -n $(jget "$out/$name.baseline.$i.json" skipped) ]]; then
				log "$name: DataLoader baseline skipped: $(jfmt "$out/$name.baseline.$i.json" skipped)"
				break
			fi
			secs=$(jget "$out/$name.baseline.$i.json" seconds)
			log "$name: DataLoader baseline run $i: $(jfmt "$out/$name.baseline.$i.json" seconds %.2f)s, $(jfmt "$out/$name.baseline.$i.json" samples_per_sec %.0f) samples/s, $(jfmt "$out/$name.baseline.$i.json" mb_per_sec_in) MB/s in"
			if ((i == 1)) && awk -v s="$secs" -v lim="$py_slow" 'BEGIN {exit !(s > lim)}'; then
				log "$name: baseline is slow (over ${py_slow}s): one run only"
				n_py=1
			fi
		done
		if [[ -f $out/$name.baseline.1.json && -z $(jget "$out/$name.baseline.1.json" skipped) ]]; then
			if ! timeout --foreground -k 10 "$run_timeout" "$py" bench/dataloader_baseline.py --json --urls-file "${URLS[$name]}" --batches "${WAITB[$name]}" \
				--batch-size 32 --workers 2 --step-time "$step_seconds" \
				> "$out/$name.baseline-wait.1.json"; then
				log "$name: DataLoader baseline --step-time $step_time failed or timed out after ${run_timeout}s"
				failed+=("$name: DataLoader baseline --step-time $step_time")
				rm -f "$out/$name.baseline-wait.1.json"
			else
				log "$name: DataLoader baseline --step-time $step_time --batches ${WAITB[$name]}: wait_fraction $(jfmt "$out/$name.baseline-wait.1.json" wait_fraction %.3f)"
			fi
		fi
	else
		log "$name: SKIPPED DataLoader baseline (no torch)"
	fi
done

# --- summary -----------------------------------------------------------------------------
python3 -c '
import json, sys
keys = ["scale", "runs", "cores", "step_time", "wait_batches", "endpoint", "git", "go", "datasets"]
env = dict(zip(keys, sys.argv[1:]))
env["datasets"] = env["datasets"].split()
for k in ("runs", "cores", "wait_batches"):
    env[k] = int(env[k])
env["loadavg_at_end"] = open("/proc/loadavg").read().split()[:3]
env["cpu"] = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "")
json.dump(env, open(sys.argv[-1], "w"), indent=1)' "$scale" "$runs" "$cores" "$step_time" "$wait_batches" "$endpoint" \
	"$(git rev-parse --short HEAD 2> /dev/null || echo unknown)$(git diff --quiet HEAD -- 2> /dev/null || echo -dirty)" \
	"$(go env GOVERSION)" "${names[*]}" "$out/env.json"
python3 bench/summarize_pipeline.py "$out" | tee "$out/summary.txt"
log "results in $out (python3 bench/summarize_pipeline.py $out prints the summary again)"
if ((${#failed[@]})); then
	printf 'bench-pipeline: FAILED: %s\n' "${failed[@]}" >&2
	exit 1
fi
