#!/usr/bin/env bash
# Measures the loader's autotuning against a grid of fixed settings, in one run, on
# one machine state: is what the tuner settles on as fast as the best fixed setting,
# faster than the defaults, and within the stated memory budget? Four cases, each
# read from MinIO on 127.0.0.1 through s3:// URLs:
#
#   images   the image dataset of bench-pipeline.sh (plain tar, ~110 KB jpg + cls per
#            sample, 32 shards x 300, about 1 GiB at scale 1);
#   tokens   the token dataset of bench-pipeline.sh (zstd shards, 2048 int32 tokens as
#            npy + cls per sample, 64 shards x 2000);
#   small    the "small" dataset of bench-index.sh: 10,000 shards of 4 samples (the
#            default preset, ~33 KB jpg + cls + txt), one request per shard;
#   latency  the first BENCH_LATENCY_SHARDS (1000) shards of "small", read through
#            tools/latencyproxy, which holds every request BENCH_DELAY (50ms)
#            before passing it to MinIO, as a remote store's time to first byte.
#            Small shards, because there each shard is a request of its own (~130
#            KB, well under one fetch part; the loader of this writing sends a HEAD,
#            then a GET: two delays), so the delay is paid once per 4 samples and
#            only more shards in flight hide it: the case where a setting tuned for
#            CPU (workers = cores) is furthest off. On the big shards of images and
#            tokens the delay is paid once per 8 MiB part and hardly matters.
#
# Each case runs `shardload bench --json` (the same --epochs, --seed, --memory and
# BENCH_SL_FLAGS for all its runs; an index from `shardload ls --summary --json`) as:
#   - grid: autotuning off, at every point of --workers x --queue-bytes x
#     --fetch-parallel (BENCH_GRID_WORKERS "1 2 4 8", BENCH_GRID_QUEUE
#     "1MiB 4MiB 16MiB", BENCH_GRID_PARALLEL "1 4", BENCH_GRID_READAHEAD "0"),
#     BENCH_GRID_RUNS (1) times each; the latency case has a grid of its own,
#     --workers (BENCH_GRID_LATENCY_WORKERS "8 32 64") x --read-ahead
#     (BENCH_GRID_LATENCY_READAHEAD "0 24 56") at --queue-bytes 2MiB and
#     --fetch-parallel 1 (its shards are smaller than one part: parts are never read,
#     and counted in the budget they leave no room for read-ahead), since only shards
#     in flight beyond the 8 lanes help there (the defaults runs are its 2 workers);
#   - the BENCH_BEST_POINTS (3) best grid points again, BENCH_BEST_RERUNS (BENCH_RUNS)
#     times each, each round with one more autotune and defaults run: the best of
#     many single runs on a noisy machine is biased high, so a point's figure is the
#     median of its runs, and the reruns share the machine's state with as many runs
#     of the two it is compared with;
#   - defaults: autotuning off, no knob flags, BENCH_RUNS (3) times;
#   - autotune: no knob flags (autotuning is on by default), BENCH_RUNS times.
# They are interleaved (autotune, defaults, then a BENCH_RUNS-th of the grid, repeated),
# so drift of the machine affects all kinds alike. At scale 1 on 2 cores a whole run
# takes about an hour (latency ~25 min, its --workers 1 points ~2 min each; small
# ~15 min; images and tokens ~8 min each; generating and uploading ~5 min).
#
#   scripts/bench-autotune.sh [--work DIR] [--out DIR] [--scale F] [--runs N] [--only CASE]
#
# Environment (flags win): BENCH_WORK (default .demo/bench-autotune), BENCH_OUT
# (default WORK/results/TIMESTAMP), BENCH_SCALE (1; 0.05 for a quick trial: fewer
# shards, or fewer samples per shard, the epochs unchanged), BENCH_RUNS (3), BENCH_ONLY
# (images, tokens, small or latency), BENCH_GRID_WORKERS, BENCH_GRID_QUEUE,
# BENCH_GRID_PARALLEL, BENCH_GRID_RUNS (above), BENCH_EPOCHS (every case) or
# BENCH_EPOCHS_IMAGES (8), BENCH_EPOCHS_TOKENS (5), BENCH_EPOCHS_SMALL (1),
# BENCH_EPOCHS_LATENCY (2) (about 10-110 s a run at the defaults at scale 1 on 2 cores),
# BENCH_SEED (1), BENCH_MEMORY (--memory for every run; unset: the flag is left out and
# the default budget applies), BENCH_DELAY (50ms), BENCH_LATENCY_SHARDS (1000, scaled),
# BENCH_RUN_TIMEOUT (600: seconds one run may take before it is killed and counted as
# failed), BENCH_SHARDLOAD (a shardload binary to measure instead of building
# bin/shardload), BENCH_SL_FLAGS (more flags for every run), BENCH_AUTOTUNE_FLAG (the
# flag that turns autotuning off, default --autotune=false; empty: left out, to try the
# script with a binary that has no --autotune, whose "autotune" runs are then runs at
# the defaults), BENCH_REUSE=1 (keep the MinIO data and the indexes of the previous run
# in WORK/store instead of uploading again; the generated datasets in WORK/datasets
# are always reused).
# Needs: go, curl (with --aws-sigv4), python3, and the MinIO scripts/tools.sh builds.
# Results in the output directory: one JSON file per run (CASE.KIND[.POINT].I.json;
# a failed run's stderr in .err), runs.jsonl (every run: its flags, status and wall
# time), latencyproxy.log (a line per request of the latency case), summary.json and
# summary.txt (printed at the end). Per case the summary has the best grid point, the
# medians of autotune and defaults, their ratios, the settings the tuner settled on
# ("tuned" of the JSON), the largest peak RSS against memory_budget_bytes +
# memory_overhead_bytes, and a verdict: autotune >= 0.95 x the best grid point, every
# run's peak RSS within its budget + overhead, no run failed; then over all cases: the
# largest autotune/defaults ratio >= 1.3. A grid point that shardload refuses as
# needing more than --memory is shown as such, not counted as failed; a run that
# times out is. Fields a binary does not report show as "-", their checks as n/a.
# Exits 1 if a run failed.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
# shellcheck source=scripts/bench-lib.sh
. scripts/bench-lib.sh

# The flags of `shardload bench` this script varies, in one place.
autotune_off=() # turns autotuning off: every run but the autotune ones
read -ra autotune_off <<< "${BENCH_AUTOTUNE_FLAG---autotune=false}"
flag_workers=--workers
flag_queue=--queue-bytes
flag_parallel=--fetch-parallel
flag_memory=--memory

work=${BENCH_WORK:-.demo/bench-autotune}
out=${BENCH_OUT:-}
scale=${BENCH_SCALE:-1}
runs=${BENCH_RUNS:-3}
only=${BENCH_ONLY:-}
grid_workers=${BENCH_GRID_WORKERS:-1 2 4 8}
grid_queue=${BENCH_GRID_QUEUE:-1MiB 4MiB 16MiB}
grid_parallel=${BENCH_GRID_PARALLEL:-1 4}
grid_runs=${BENCH_GRID_RUNS:-1}
grid_readahead=${BENCH_GRID_READAHEAD:-0}
# The latency case's grid: more shards in flight is what can help there, so its
# --workers go past the 8 lanes with --read-ahead (shards opened beyond them).
lat_workers=${BENCH_GRID_LATENCY_WORKERS:-8 32 64}
lat_queue=${BENCH_GRID_LATENCY_QUEUE:-2MiB}
lat_parallel=${BENCH_GRID_LATENCY_PARALLEL:-1}
lat_readahead=${BENCH_GRID_LATENCY_READAHEAD:-0 24 56}
seed=${BENCH_SEED:-1}
memory=${BENCH_MEMORY:-}
delay=${BENCH_DELAY:-50ms}
latency_shards=${BENCH_LATENCY_SHARDS:-1000}
run_timeout=${BENCH_RUN_TIMEOUT:-600}
sl_flags=${BENCH_SL_FLAGS:-}
declare -A EPOCHS=(
	[images]=${BENCH_EPOCHS_IMAGES:-${BENCH_EPOCHS:-8}}
	[tokens]=${BENCH_EPOCHS_TOKENS:-${BENCH_EPOCHS:-5}}
	[small]=${BENCH_EPOCHS_SMALL:-${BENCH_EPOCHS:-1}}
	[latency]=${BENCH_EPOCHS_LATENCY:-${BENCH_EPOCHS:-2}}
)
while [[ $# -gt 0 ]]; do
	case $1 in
	--work) work=$2; shift 2 ;;
	--out) out=$2; shift 2 ;;
	--scale) scale=$2; shift 2 ;;
	--runs) runs=$2; shift 2 ;;
	--only) only=$2; shift 2 ;;
	-h | --help) awk 'NR > 1 && !/^#/ {exit} NR > 1 {sub(/^# ?/, ""); print}' "$0"; exit 0 ;;
	*) echo "bench-autotune: unknown argument $1 (see --help)" >&2; exit 2 ;;
	esac
done
die() { echo "bench-autotune: $*" >&2; exit 2; }
case $only in "" | images | tokens | small | latency) ;; *) die "--only images|tokens|small|latency" ;; esac
# shellcheck disable=SC2015
[[ $scale =~ ^([0-9]+\.?[0-9]*|\.[0-9]+)$ ]] && awk -v f="$scale" 'BEGIN {exit !(f > 0)}' ||
	die "scale must be a positive number, not $scale"
for v in runs grid_runs run_timeout latency_shards; do
	[[ ${!v} =~ ^[1-9][0-9]*$ ]] || die "$v must be a positive integer, not ${!v}"
done
for c in "${!EPOCHS[@]}"; do
	[[ ${EPOCHS[$c]} =~ ^[1-9][0-9]*$ ]] || die "epochs of $c must be a positive integer, not ${EPOCHS[$c]}"
done
[[ -n ${grid_workers// /} && -n ${grid_queue// /} && -n ${grid_parallel// /} ]] || die "a grid list is empty"

cases=()
for c in images tokens small latency; do
	[[ -z $only || $only == "$c" ]] && cases+=("$c")
done
bench_dirs
now() { date +%s.%N; }
command -v curl > /dev/null || { echo "bench-autotune: curl not found (scripts/deps.sh installs it)" >&2; exit 1; }
command -v python3 > /dev/null || { echo "bench-autotune: python3 not found (scripts/deps.sh installs it)" >&2; exit 1; }
curl --help all 2> /dev/null | grep -q -- --aws-sigv4 || { echo "bench-autotune: this curl has no --aws-sigv4 (need 7.75 or later)" >&2; exit 1; }

# --- build -----------------------------------------------------------------------
if [[ -n ${BENCH_SHARDLOAD:-} ]]; then
	sl=$(command -v "$BENCH_SHARDLOAD") || { echo "bench-autotune: BENCH_SHARDLOAD=$BENCH_SHARDLOAD not found" >&2; exit 1; }
	sl=$(cd "$(dirname "$sl")" && pwd)/$(basename "$sl")
	log "using $sl (BENCH_SHARDLOAD)"
else
	log "building bin/shardload"
	go build -o bin/shardload ./cmd/shardload ||
		{ echo "bench-autotune: go build ./cmd/shardload failed (BENCH_SHARDLOAD=BINARY measures a binary built before)" >&2; exit 1; }
	sl=$root/bin/shardload
fi
if [[ " ${cases[*]} " == *" latency "* ]]; then
	log "building bin/latencyproxy"
	go build -o bin/latencyproxy ./tools/latencyproxy
fi
# Every flag the runs pass must be one this binary's bench knows.
help=$("$sl" bench --help 2>&1) || { echo "bench-autotune: '$sl bench --help' fails: no shardload bench" >&2; exit 1; }
autotune_name=${autotune_off[0]:-}
autotune_name=${autotune_name%%=*}
need_flags=("$flag_workers" "$flag_queue" "$flag_parallel" --index --no-index-store --epochs --seed)
[[ -z $autotune_name ]] || need_flags+=("$autotune_name")
[[ -z $memory ]] || need_flags+=("$flag_memory")
for f in "${need_flags[@]}"; do
	if ! grep -qE -- "$f([ =]|\[)" <<< "$help"; then
		hint=
		[[ $f != "$autotune_name" ]] || hint=" (BENCH_AUTOTUNE_FLAG= leaves it out: the autotune runs are then runs at the defaults)"
		[[ $f != "$flag_memory" ]] || hint=" (leave BENCH_MEMORY unset)"
		echo "bench-autotune: $sl bench has no $f$hint" >&2
		exit 1
	fi
done
((${#autotune_off[@]})) || log "NOTE: BENCH_AUTOTUNE_FLAG is empty: autotuning is not turned off for the grid and defaults runs"

# --- datasets ----------------------------------------------------------------------
# size N F: round(N*F), at least 1.
size() { awk -v n="$1" -v f="$2" 'BEGIN {v = int(n*f + 0.5); print (v < 1 ? 1 : v)}'; }
# layout SHARDS SAMPLES: at scale, keep at least 4 shards and scale the samples per
# shard for the rest (as bench-pipeline.sh).
layout() {
	local shards samples
	shards=$(size "$1" "$scale")
	((shards >= 4)) || shards=4
	samples=$(size "$(($1 * $2))" "$scale")
	samples=$(((samples + shards - 1) / shards))
	echo "$shards $samples"
}
# dataset NAME PRESET COMPRESSION SHARDS SAMPLES: generate into WORK/datasets once
# (`shardload gen`, seed 1, as bench-pipeline.sh and bench-index.sh); sets ds_dir and
# ds_pattern (the local brace pattern).
dataset() {
	local name=$1 preset=$2 comp=$3 shards=$4 samples=$5
	ds_dir=$work/datasets/$name-$comp-${shards}x$samples
	if [[ -f $ds_dir/.complete ]]; then
		ds_pattern=$(cat "$ds_dir/.complete")
		log "$name: reusing $ds_dir"
		return
	fi
	log "$name: generating $shards shards x $samples samples (--preset $preset --compression $comp) in $ds_dir"
	rm -rf "$ds_dir"
	mkdir -p "$work/datasets"
	ds_pattern=$("$sl" gen --preset "$preset" --compression "$comp" --shards "$shards" --samples "$samples" --seed 1 "$ds_dir")
	echo "$ds_pattern" > "$ds_dir/.complete"
}

declare -A DIR PATTERN
datasets=()
for c in "${cases[@]}"; do
	case $c in
	images)
		read -r s n < <(layout 32 300)
		dataset images images none "$s" "$n"
		;;
	tokens)
		read -r s n < <(layout 64 2000)
		dataset tokens tokens zstd "$s" "$n"
		;;
	small | latency)
		[[ -z ${DIR[small]:-} ]] || continue
		s=$(size 10000 "$scale")
		((s >= 4)) || s=4
		dataset small default none "$s" 4
		c=small
		;;
	esac
	DIR[$c]=$ds_dir PATTERN[$c]=$ds_pattern
	datasets+=("$c")
done

# --- MinIO -------------------------------------------------------------------------
# WORK/store holds the MinIO data, its credentials, and per uploaded dataset a marker
# and its index; BENCH_REUSE=1 keeps it (bench-lib.sh's bench_workdir).
store=$work/store
bench_workdir "$store"
proxy_pid=
cleanup() {
	local rc=$?
	if [[ -n $proxy_pid ]]; then
		kill -TERM "$proxy_pid" 2> /dev/null || true
		wait "$proxy_pid" 2> /dev/null || true
	fi
	stop_minio
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
log "starting MinIO (data in $store/minio${reuse:+, reused})"
start_minio "$store"
echo "$AWS_ACCESS_KEY_ID $AWS_SECRET_ACCESS_KEY" > "$store/creds"
minio_endpoint=$AWS_ENDPOINT_URL
export AWS_ENDPOINT_URL_S3=$minio_endpoint
unset AWS_SESSION_TOKEN AWS_PROFILE AWS_DEFAULT_PROFILE
log "MinIO ready at $minio_endpoint"
bucket=bench
if [[ -z $reuse ]]; then
	s3curl --noproxy '*' -X PUT "$minio_endpoint/$bucket" > /dev/null
else
	s3curl --noproxy '*' -X PUT "$minio_endpoint/$bucket" > /dev/null 2>&1 || true # there already
fi

declare -A FILES S3PAT INDEX NSHARDS BYTES SAMPLES
for name in "${datasets[@]}"; do
	dir=${DIR[$name]}
	prefix=$(basename "$dir")
	files=$(find "$dir" -maxdepth 1 -name 'train-*' -type f | sort)
	FILES[$name]=$files
	NSHARDS[$name]=$(wc -l <<< "$files")
	BYTES[$name]=$(xargs stat -c %s <<< "$files" | awk '{s += $1} END {print s}')
	S3PAT[$name]=s3://$bucket/$prefix/$(basename "${PATTERN[$name]}")
	INDEX[$name]=$store/$prefix.index.jsonl
	if [[ -f $store/$prefix.uploaded && -s ${INDEX[$name]} ]]; then
		log "$name: reusing s3://$bucket/$prefix/ and its index (BENCH_REUSE=1)"
	else
		log "$name: uploading ${NSHARDS[$name]} shards ($(awk -v b="${BYTES[$name]}" 'BEGIN {printf "%.1f", b/1e6}') MB) to s3://$bucket/$prefix/"
		t0=$(now)
		# Eight uploads at a time (as bench-index.sh); curl streams each file (-T),
		# the headers signed, the payload declared unsigned.
		# shellcheck disable=SC2016
		xargs -P 8 -I{} sh -c 'curl -fsS --noproxy "*" -m 600 --aws-sigv4 "aws:amz:us-east-1:s3" --user "$AWS_ACCESS_KEY_ID:$AWS_SECRET_ACCESS_KEY" \
			-H "x-amz-content-sha256: UNSIGNED-PAYLOAD" -o /dev/null -T "$1" "$2/$(basename "$1")"' \
			sh {} "$minio_endpoint/$bucket/$prefix" <<< "$files"
		log "$name: uploaded in $(awk -v a="$t0" -v b="$(now)" 'BEGIN {printf "%.1f", b-a}')s; indexing (shardload ls --summary --json)"
		"$sl" ls --summary --json "${S3PAT[$name]}" > "${INDEX[$name]}.tmp"
		mv "${INDEX[$name]}.tmp" "${INDEX[$name]}"
		touch "$store/$prefix.uploaded"
	fi
	SAMPLES[$name]=$(python3 -c 'import json, sys; print(sum(json.loads(l)["samples"] for l in open(sys.argv[1])))' "${INDEX[$name]}")
done

# The cases: each a dataset (latency: the first shards of small) at an endpoint.
declare -A CPAT CINDEX CSHARDS CBYTES CSAMPLES FIELDS ENDPOINT
for c in "${cases[@]}"; do
	ENDPOINT[$c]=$minio_endpoint
	case $c in
	images | small) FIELDS[$c]="--field jpg --field cls" ;;
	tokens) FIELDS[$c]="--field tokens=npy:npy:int32:2048 --field cls" ;;
	latency) FIELDS[$c]="--field jpg --field cls" ;;
	esac
	if [[ $c != latency ]]; then
		CPAT[$c]=${S3PAT[$c]} CINDEX[$c]=${INDEX[$c]} CSHARDS[$c]=${NSHARDS[$c]} CBYTES[$c]=${BYTES[$c]} CSAMPLES[$c]=${SAMPLES[$c]}
		continue
	fi
	n=$(size "$latency_shards" "$scale")
	((n <= NSHARDS[small])) || n=${NSHARDS[small]}
	CPAT[$c]=$(sed -E "s/\{([0-9]+)\.\.[0-9]+\}/{\1..$(printf %06d $((n - 1)))}/" <<< "${S3PAT[small]}")
	CINDEX[$c]=$out/latency.index.jsonl
	# The index of those shards: small's lines for them.
	head -n "$n" <<< "${FILES[small]}" | python3 -c '
import json, os, sys
names = {os.path.basename(l.strip()) for l in sys.stdin if l.strip()}
with open(sys.argv[2], "w") as f:
    for l in open(sys.argv[1]):
        if os.path.basename(json.loads(l)["url"]) in names:
            f.write(l)' "${INDEX[small]}" "${CINDEX[$c]}"
	CSHARDS[$c]=$n
	CBYTES[$c]=$(head -n "$n" <<< "${FILES[small]}" | xargs stat -c %s | awk '{s += $1} END {print s}')
	CSAMPLES[$c]=$(python3 -c 'import json, sys; print(sum(json.loads(l)["samples"] for l in open(sys.argv[1])))' "${CINDEX[$c]}")
	# The proxy: its URL is the first line it prints.
	"$root/bin/latencyproxy" --listen 127.0.0.1:0 --target "$minio_endpoint" --delay "$delay" --log-requests \
		> "$out/latencyproxy.out" 2> "$out/latencyproxy.log" &
	proxy_pid=$!
	for ((i = 0; i < 100; i++)); do
		[[ -s $out/latencyproxy.out ]] && break
		kill -0 "$proxy_pid" 2> /dev/null || break
		sleep 0.1
	done
	ENDPOINT[$c]=$(head -n 1 "$out/latencyproxy.out")
	[[ ${ENDPOINT[$c]} == http://* ]] || { echo "bench-autotune: latencyproxy did not start (see $out/latencyproxy.log)" >&2; exit 1; }
	# A signed request through it: the proxy keeps the Host the client signed.
	t0=$(now)
	first=$(head -n 1 <<< "${FILES[small]}")
	s3curl --noproxy '*' -I -o /dev/null "${ENDPOINT[$c]}/$bucket/$(basename "${DIR[small]}")/$(basename "$first")" ||
		{ echo "bench-autotune: a signed HEAD through latencyproxy failed (see $out/latencyproxy.log)" >&2; exit 1; }
	log "latency: latencyproxy at ${ENDPOINT[$c]} (--delay $delay; a HEAD through it took $(awk -v a="$t0" -v b="$(now)" 'BEGIN {printf "%.3f", b-a}')s)"
done

# --- runs ----------------------------------------------------------------------------
mem_flags=()
[[ -z $memory ]] || mem_flags=("$flag_memory" "$memory")
: > "$out/runs.jsonl"
failed=0

# run_one CASE KIND POINT I FLAGS...: one `shardload bench --json` run of CASE with
# FLAGS (the kind's); its JSON in CASE.KIND[.POINT].I.json, a line in runs.jsonl.
run_one() {
	local c=$1 kind=$2 point=$3 i=$4 base rc t0 t1 status ep
	shift 4
	base=$out/$c.$kind${point:+.$point}.$i
	ep=${ENDPOINT[$c]}
	rc=0
	t0=$(now)
	# shellcheck disable=SC2086
	AWS_ENDPOINT_URL=$ep AWS_ENDPOINT_URL_S3=$ep timeout --foreground -k 10 "$run_timeout" \
		"$sl" bench --json --batch-size 32 --seed "$seed" --epochs "${EPOCHS[$c]}" --index "${CINDEX[$c]}" --no-index-store \
		${FIELDS[$c]} "${mem_flags[@]}" $sl_flags "$@" "${CPAT[$c]}" > "$base.out" 2> "$base.err" || rc=$?
	t1=$(now)
	if ((rc == 124 || rc == 137)); then
		status="timeout after ${run_timeout}s"
	elif ((rc != 0)) && [[ $kind == grid ]] && grep -q "memory budget too small" "$base.err"; then
		status=over-budget # a point whose settings need more than --memory: refused, not failed
	elif ((rc != 0)); then
		status="exit status $rc"
	elif tail -n 1 "$base.out" > "$base.json" &&
		python3 -c 'import json, sys; float(json.load(open(sys.argv[1]))["samples_per_sec"])' "$base.json" 2> /dev/null; then
		status=ok
	else
		status="no JSON object with samples_per_sec"
		mv "$base.json" "$base.bad" 2> /dev/null || true
	fi
	if [[ $status == ok ]]; then
		rm -f "$base.out"
		[[ -s $base.err ]] || rm -f "$base.err"
	else
		[[ $status == over-budget ]] || failed=$((failed + 1))
		[[ -s $base.out ]] || rm -f "$base.out"
	fi
	python3 -c '
import json, sys
c, kind, point, i, status, rc, t0, t1, path = sys.argv[1:10]
print(json.dumps({"case": c, "kind": kind, "point": point, "run": int(i), "flags": " ".join(sys.argv[10:]),
                  "status": status, "rc": int(rc), "wall_seconds": round(float(t1) - float(t0), 3),
                  "file": path if status == "ok" else None}))' \
		"$c" "$kind" "$point" "$i" "$status" "$rc" "$t0" "$t1" "$(basename "$base").json" "$@" >> "$out/runs.jsonl"
	if [[ $status == ok ]]; then
		log "$c: $kind${point:+ $point} #$i: $(python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
def mib(v): return "-" if v is None else "%.0fMi" % (v / 2**20)
t = d.get("tuned")
tuned = "" if not isinstance(t, dict) else ", tuned: " + " ".join("%s=%s" % (k, mib(v) if k.endswith("bytes") or k.endswith("size") else v) for k, v in t.items())
print("%.0f samples/s, %.1f MB/s, %.1fs, peak RSS %s (budget %s + overhead %s)%s" % (d["samples_per_sec"], d.get("mb_per_sec") or 0,
      d.get("seconds") or 0, mib(d.get("peak_rss_bytes")), mib(d.get("memory_budget_bytes")), mib(d.get("memory_overhead_bytes")), tuned))' "$base.json")"
	elif [[ $status == over-budget ]]; then
		log "$c: $kind${point:+ $point} #$i: does not fit --memory $memory (shardload refuses it; not counted as failed)"
	else
		log "$c: $kind${point:+ $point} #$i: FAILED ($status; see $base.err):"
		tail -n 3 "$base.err" >&2 || true
	fi
}

t_start=$(now)
for c in "${cases[@]}"; do
	log "== $c: ${CSHARDS[$c]} shards, ${CSAMPLES[$c]} samples, ${CBYTES[$c]} bytes stored, ${EPOCHS[$c]} epochs, ${CPAT[$c]} at ${ENDPOINT[$c]}"
	grid=()
	gw=$grid_workers gq=$grid_queue gp=$grid_parallel ga=$grid_readahead
	[[ $c != latency ]] || { gw=$lat_workers gq=$lat_queue gp=$lat_parallel ga=$lat_readahead; }
	for w in $gw; do
		for q in $gq; do
			for p in $gp; do
				for a in $ga; do
					for ((r = 1; r <= grid_runs; r++)); do
						grid+=("$w $q $p $a $r")
					done
				done
			done
		done
	done
	# Round k: autotune run k, defaults run k, then every runs-th grid run from k
	# (each round gets every --workers value, so the rounds take about as long).
	for ((k = 0; k < runs; k++)); do
		run_one "$c" autotune "" $((k + 1))
		run_one "$c" defaults "" $((k + 1)) "${autotune_off[@]}"
		for ((j = k; j < ${#grid[@]}; j += runs)); do
			read -r w q p a r <<< "${grid[j]}"
			ra=()
			[[ $a == 0 ]] || ra=(--read-ahead "$a")
			run_one "$c" grid "w$w-q$q-p$p${ra[*]:+-a$a}" "$r" "${autotune_off[@]}" "$flag_workers" "$w" "$flag_queue" "$q" "$flag_parallel" "$p" "${ra[@]}"
		done
	done
	# The best points, measured again (BENCH_BEST_RERUNS, default BENCH_RUNS, times
	# each of the BENCH_BEST_POINTS (3) best): one run per point is one draw on a noisy
	# machine, and the best of many single draws is biased high. The summary takes
	# each point's median.
	mapfile -t top < <(python3 -c '
import json, sys
out, c, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
best = {}
for l in open(out + "/runs.jsonl"):
    r = json.loads(l)
    if r["case"] != c or r["kind"] != "grid" or not r["file"]:
        continue
    v = json.load(open(out + "/" + r["file"]))["samples_per_sec"]
    best[r["point"]] = max(best.get(r["point"], 0), v)
for p, v in sorted(best.items(), key=lambda x: -x[1])[:n]:
    print(p)' "$out" "$c" "${BENCH_BEST_POINTS:-3}")
	for ((k = 0; k < ${BENCH_BEST_RERUNS:-$runs}; k++)); do
		# Each round also runs autotune and the defaults again, so that the best
		# points' reruns and these share the machine's state of that moment.
		run_one "$c" autotune "" $((runs + k + 1))
		run_one "$c" defaults "" $((runs + k + 1)) "${autotune_off[@]}"
		for pt in "${top[@]}"; do
			for g in "${grid[@]}"; do
				read -r w q p a r <<< "$g"
				ra=()
				[[ $a == 0 ]] || ra=(--read-ahead "$a")
				[[ "w$w-q$q-p$p${ra[*]:+-a$a}" == "$pt" && $r == 1 ]] || continue
				run_one "$c" grid "$pt" $((grid_runs + k + 1)) "${autotune_off[@]}" "$flag_workers" "$w" "$flag_queue" "$q" "$flag_parallel" "$p" "${ra[@]}"
			done
		done
	done
	printf '{"case":"%s","pattern":"%s","endpoint":"%s","shards":%d,"samples":%d,"bytes":%d,"epochs":%d,"index":"%s"}\n' \
		"$c" "${CPAT[$c]}" "${ENDPOINT[$c]}" "${CSHARDS[$c]}" "${CSAMPLES[$c]}" "${CBYTES[$c]}" "${EPOCHS[$c]}" "${CINDEX[$c]}" \
		> "$out/$c.case.json"
done
log "all runs took $(awk -v a="$t_start" -v b="$(now)" 'BEGIN {printf "%.0f", b-a}')s"

# --- summary -----------------------------------------------------------------------------
python3 -c '
import json, sys
keys = ["scale", "runs", "grid_runs", "grid_workers", "grid_queue", "grid_parallel", "seed", "memory", "delay",
        "autotune_off", "sl_flags", "shardload", "git", "go", "cores", "cases"]
env = dict(zip(keys, sys.argv[1:len(keys) + 1]))
for k in ("runs", "grid_runs", "seed", "cores"):
    env[k] = int(env[k])
for k in ("grid_workers", "grid_queue", "grid_parallel", "cases"):
    env[k] = env[k].split()
env["loadavg_at_end"] = open("/proc/loadavg").read().split()[:3]
env["cpu"] = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "")
json.dump(env, open(sys.argv[-1], "w"), indent=1)' "$scale" "$runs" "$grid_runs" "$grid_workers" "$grid_queue" "$grid_parallel" \
	"$seed" "${memory:-(default)}" "$delay" "${autotune_off[*]:-(none)}" "$sl_flags" "$sl" \
	"$(git rev-parse --short HEAD 2> /dev/null || echo unknown)$(git diff --quiet HEAD -- 2> /dev/null || echo -dirty)" \
	"$(go env GOVERSION 2> /dev/null || echo unknown)" "$(nproc)" "${cases[*]}" "$out/env.json"

python3 - "$out" << 'PY' | tee "$out/summary.txt"
import json, os, statistics, sys

out = sys.argv[1]
env = json.load(open(os.path.join(out, "env.json")))
runs = [json.loads(l) for l in open(os.path.join(out, "runs.jsonl")) if l.strip()]
for r in runs:
    r["data"] = json.load(open(os.path.join(out, r["file"]))) if r["status"] == "ok" else None


def mib(v):
    if v is None:
        return "-"
    return "%.2fGi" % (v / 2**30) if v >= 2**30 else "%.0fMi" % (v / 2**20)


def fmt_tuned(t):
    if not isinstance(t, dict):
        return "-"
    parts = []
    for k in ("workers", "queue_bytes", "fetch_parallel", "fetch_part_size"):
        if k in t:
            v = t[k]
            parts.append("%s %s" % (k, mib(v) if k in ("queue_bytes", "fetch_part_size") and isinstance(v, (int, float)) else v))
    parts += ["%s %s" % (k, v) for k, v in t.items() if k not in ("workers", "queue_bytes", "fetch_parallel", "fetch_part_size")]
    return ", ".join(parts)


def med(xs):
    return statistics.median(xs) if xs else None


def ratio(a, b):
    return a / b if a is not None and b else None


def f2(v, f="%.2f"):
    return "-" if v is None else f % v


lines = []
p = lines.append
p("bench-autotune: scale %s, %d runs (grid points %d each), grid --workers %s x --queue-bytes %s x --fetch-parallel %s, "
  "--memory %s, seed %d, %s cores (%s), %s, git %s, load at end %s" % (
      env["scale"], env["runs"], env["grid_runs"], "/".join(env["grid_workers"]), "/".join(env["grid_queue"]),
      "/".join(env["grid_parallel"]), env["memory"], env["seed"], env["cores"], env["cpu"], env["go"], env["git"],
      " ".join(env["loadavg_at_end"])))
p("autotuning off with: %s; more flags: %s" % (env["autotune_off"], env["sl_flags"] or "(none)"))
summary = {"env": env, "cases": {}}
ad_ratios = {}
for c in env["cases"]:
    cr = [r for r in runs if r["case"] == c]
    if not cr:
        continue
    try:
        info = json.load(open(os.path.join(out, c + ".case.json")))
    except OSError:
        info = {}
    ok = [r for r in cr if r["data"] is not None]
    skipped = [r for r in cr if r["status"] == "over-budget"]
    bad = [r for r in cr if r["data"] is None and r["status"] != "over-budget"]
    sps = lambda rs: [r["data"]["samples_per_sec"] for r in rs if r["data"] is not None]
    auto = [r for r in cr if r["kind"] == "autotune"]
    defs = [r for r in cr if r["kind"] == "defaults"]
    points = {}
    for r in cr:
        if r["kind"] == "grid":
            points.setdefault(r["point"], []).append(r)
    grid = []
    for name, rs in points.items():
        v = med(sps(rs))
        grid.append({"point": name, "flags": rs[0]["flags"], "samples_per_sec": v,
                     "runs": len(rs), "failed": sum(1 for r in rs if r["data"] is None and r["status"] != "over-budget"),
                     "over_budget": sum(1 for r in rs if r["status"] == "over-budget"),
                     "peak_rss_bytes": max((r["data"].get("peak_rss_bytes") or 0 for r in rs if r["data"]), default=None)})
    grid.sort(key=lambda g: -(g["samples_per_sec"] or -1))
    measured = [g for g in grid if g["samples_per_sec"] is not None]
    best = measured[0] if measured else None
    a_med, d_med = med(sps(auto)), med(sps(defs))
    r_best = ratio(a_med, best["samples_per_sec"] if best else None)
    r_def = ratio(a_med, d_med)
    if r_def is not None:
        ad_ratios[c] = r_def
    # Memory: every run's peak RSS against its own budget + overhead.
    over, unknown, peak = [], 0, None
    for r in ok:
        d = r["data"]
        rss, b, o = d.get("peak_rss_bytes"), d.get("memory_budget_bytes"), d.get("memory_overhead_bytes")
        if rss is not None and (peak is None or rss > peak[0]):
            peak = (rss, r, b, o)
        if rss is None or b is None or o is None:
            unknown += 1
        elif rss > b + o:
            over.append((r, rss, b + o))
    if over:
        rss_check = "FAIL"
    elif unknown or not ok:
        rss_check = "n/a"
    else:
        rss_check = "PASS"
    best_check = "n/a" if r_best is None else ("PASS" if r_best >= 0.95 else "FAIL")
    runs_check = "PASS" if not bad else "FAIL"
    checks = [best_check, rss_check, runs_check]
    verdict = "FAIL" if "FAIL" in checks else ("PASS" if all(x == "PASS" for x in checks) else "INCOMPLETE")

    def label(r):
        return "%s%s #%d" % (r["kind"], " " + r["point"] if r["point"] else "", r["run"])

    p("")
    p("== %s: %s shards, %s samples, %.1f MB stored, %s epochs, %s%s" % (
        c, info.get("shards", "?"), info.get("samples", "?"), info.get("bytes", 0) / 1e6, info.get("epochs", "?"),
        info.get("pattern", "?"), " via latencyproxy --delay %s" % env["delay"] if c == "latency" else ""))
    if best:
        p("  best grid point   %-52s %8.0f samples/s  (of %d measured points; worst %.0f at %s)" % (
            best["flags"].replace(env["autotune_off"] + " ", "") if env["autotune_off"] != "(none)" else best["flags"],
            best["samples_per_sec"], len(measured), measured[-1]["samples_per_sec"], measured[-1]["point"]))
    else:
        p("  best grid point   -")
    for name, rs, m in (("defaults", defs, d_med), ("autotune", auto, a_med)):
        p("  %-17s median of %d ok   %8s samples/s  (runs: %s)" % (
            name, len(sps(rs)), f2(m, "%.0f"),
            " ".join("%.0f" % r["data"]["samples_per_sec"] if r["data"] else "FAILED" for r in rs) or "-"))
    p("  autotune / best grid:  %s   (target >= 0.95)" % f2(r_best))
    p("  autotune / defaults:   %s" % f2(r_def))
    p("  tuned (autotune runs): %s" % ("; ".join("#%d %s" % (r["run"], fmt_tuned(r["data"].get("tuned")) if r["data"] else "FAILED")
                                             for r in auto) or "-"))
    if peak:
        rss, r, b, o = peak
        p("  peak RSS: max %s (%s), its budget %s + overhead %s = %s; runs over budget + overhead: %s" % (
            mib(rss), label(r), mib(b), mib(o), mib(b + o) if b is not None and o is not None else "-",
            ", ".join("%s (%s > %s)" % (label(x), mib(y), mib(z)) for x, y, z in over) if over
            else ("none" if not unknown else "none known (%d of %d runs lack a field)" % (unknown, len(ok)))))
    else:
        p("  peak RSS: -")
    wall = sum(r["wall_seconds"] for r in cr)
    p("  runs: %d ok, %d failed, %d grid runs refused as over --memory; %.0fs in all" % (len(ok), len(bad), len(skipped), wall))
    for r in bad:
        p("    FAILED %s: %s" % (label(r), r["status"]))
    p("  grid (samples/s, peak RSS):")
    for g in grid:
        p("    %-20s %8s  %6s%s%s" % (g["point"], f2(g["samples_per_sec"], "%.0f"), mib(g["peak_rss_bytes"]),
                                     "  (%d of %d runs failed)" % (g["failed"], g["runs"]) if g["failed"] else "",
                                     "  (does not fit --memory %s)" % env["memory"] if g["over_budget"] else ""))
    p("  %s: %s  (autotune >= 0.95 x best grid: %s %s; RSS within budget + overhead: %s; all runs ok: %s)" % (
        c, verdict, best_check, f2(r_best), rss_check, runs_check))
    summary["cases"][c] = {
        "info": info, "best_grid": best, "grid": grid,
        "autotune_median_samples_per_sec": a_med, "defaults_median_samples_per_sec": d_med,
        "autotune_samples_per_sec": sps(auto), "defaults_samples_per_sec": sps(defs),
        "autotune_over_best_grid": r_best, "autotune_over_defaults": r_def,
        "tuned": [r["data"].get("tuned") if r["data"] else None for r in auto],
        "max_peak_rss_bytes": peak[0] if peak else None,
        "max_peak_rss_run": label(peak[1]) if peak else None,
        "runs_over_budget": [{"run": label(x), "peak_rss_bytes": y, "budget_plus_overhead": z} for x, y, z in over],
        "runs_missing_memory_fields": unknown,
        "failed_runs": [{"run": label(r), "status": r["status"]} for r in bad],
        "over_budget_runs": [label(r) for r in skipped],
        "wall_seconds": wall,
        "checks": {"autotune_vs_best_grid": best_check, "rss_within_budget": rss_check, "all_runs_ok": runs_check},
        "verdict": verdict,
    }
p("")
if ad_ratios:
    top = max(ad_ratios, key=ad_ratios.get)
    overall = "PASS" if ad_ratios[top] >= 1.3 else "FAIL"
    p("overall: %s  (largest autotune/defaults ratio >= 1.3: %.2f on %s)" % (overall, ad_ratios[top], top))
else:
    overall = "n/a"
    p("overall: n/a  (no autotune/defaults ratio)")
summary["overall"] = {"largest_autotune_over_defaults": max(ad_ratios.values()) if ad_ratios else None,
                      "case": max(ad_ratios, key=ad_ratios.get) if ad_ratios else None, "check": overall}
json.dump(summary, open(os.path.join(out, "summary.json"), "w"), indent=1)
print("\n".join(lines))
PY
log "results in $out"
if ((failed)); then
	echo "bench-autotune: $failed run(s) failed (see the summary)" >&2
	exit 1
fi
