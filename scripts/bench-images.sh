#!/usr/bin/env bash
# Measures image decoding against the PyTorch DataLoader in one run, on one machine
# state: real-sized JPEGs decoded and transformed to uint8 3x224x224 with their labels,
# read from MinIO on 127.0.0.1, with the two transforms of an image-classification job
# (BENCH_TRANSFORMS, both by default):
#   eval:  torchvision's Resize(256) + CenterCrop(224) (bilinear, as PIL);
#          shardload's img=jpg:image:uint8:3x224x224:resize=256
#   train: RandomResizedCrop(224) + RandomHorizontalFlip();
#          shardload's img=jpg:image:uint8:3x224x224:random-crop,flip
#
#   - one dataset, generated once by bench/make_image_shards.py and reused: photo-like
#     JPEGs of about 500x375 (some portrait, some other sizes between 300 and 640),
#     ~110 KB each, + cls; 2,000 samples in 8 shards at scale 1;
#   - MinIO (scripts/bench-lib.sh's start_minio: native, loopback, fresh credentials),
#     the shards uploaded with curl (SigV4) into a bucket made public-read, and an
#     index written by `shardload ls --summary --json`;
#   - interleaved, BENCH_RUNS times, for each transform:
#       (a) shardload bench --field img=jpg:image:uint8:3x224x224:OPTIONS --field cls
#           --image-decoder libjpeg-turbo   (s3:// URLs)
#       (b) the same with --image-decoder go (only with BENCH_GO=1)
#       (b') the same as (a) over the shards as local files (only with BENCH_LOCAL=1):
#           the field's rate with no store on the cores, against its ceiling
#       (c) bench/dataloader_images.py --transform T --image 224 --workers 2 (HTTP
#           GETs of the same objects; PIL + the torchvision transform, PILToTensor:
#           bench/dataloader_baseline.py with the transform replaced)
#       (d) the same with --workers 1 (only with BENCH_BASELINE_W1=1)
#     Every run is a child of a small Python wrapper that reads its rusage
#     (RUSAGE_CHILDREN: the process and every descendant it waited for, DataLoader
#     workers included) so that CPU time is measured the same way for all; the tools'
#     own cpu_seconds is reported beside it when they print one.
#   - the ceilings, in each round of runs for each transform: tools/jpegrate on every
#     core, the JPEGs in memory: libjpeg-turbo's decode alone, and decode + resize +
#     crop as the transform's field does (the same field spec as the shardload runs);
#   - medians per kind of run: samples/s, CPU seconds per sample, peak RSS; the ratios
#     shardload / DataLoader per transform; PASS or FAIL for the two targets, for each
#     transform: shardload with libjpeg-turbo delivers at least 2x the samples/s of the
#     DataLoader with 2 workers, and at least 0.9x the field's own ceiling.
#
#   scripts/bench-images.sh [-h|--help]
#
# Environment: BENCH_WORK (default .demo/bench-images: the dataset and MinIO's data),
# BENCH_OUT (default WORK/results/TIMESTAMP), BENCH_SCALE (default 1; samples and
# shards scale with it, at least 4 shards; 0.05 for a quick trial), BENCH_RUNS (3),
# BENCH_EPOCHS (1: the epochs of each run, shardload's and the DataLoader's alike),
# BENCH_REUSE (1: keep the MinIO data an earlier run left in WORK/s3, so nothing is
# uploaded again; the dataset itself is always reused when complete),
# BENCH_SHARDLOAD (a shardload binary to measure instead of building bin/shardload),
# BENCH_PYTHON (the interpreter of the baseline and the generator; default: python3 or
# /usr/bin/python3, whichever imports torch, torchvision, numpy and PIL),
# BENCH_TRANSFORMS (default "eval train"), BENCH_GO (1: also run shardload with the Go
# decoder; default 0), BENCH_LOCAL (1: also run shardload over the shards as local
# files; default 0), BENCH_BASELINE_W1 (1: also run the baseline with 1 worker;
# default 0),
# BENCH_SL_FLAGS (more flags for shardload bench), BENCH_RUN_TIMEOUT (600: seconds one
# measured run may take before it is killed and counted as failed).
# Needs: go, curl (with --aws-sigv4), python3; torch, torchvision, numpy and PIL for
# the baseline and the generator (scripts/deps.sh installs them).
# Results in the output directory: KIND.I.json (the tool's JSON), KIND.I.json.rusage.json,
# KIND.I.json.err (stderr, kept when not empty), ceiling-T.I.json (tools/jpegrate, for
# each transform T), dataset.json, summary.json and
# summary.txt (the command that made it on its first line). A run that fails is
# reported as failed and not repeated; the rest go on, and the script then exits 1.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
. scripts/bench-lib.sh

# The command as it was given, for the summary (BENCH_* variables first).
cmdline=$(
	for v in $(compgen -e | grep '^BENCH_' | sort); do printf '%s=%q ' "$v" "${!v}"; done
	printf 'scripts/bench-images.sh'
	for a in "$@"; do printf ' %q' "$a"; done
)
case ${1:-} in
"") ;;
-h | --help) sed -n '2,62s/^# \{0,1\}//p' "$0"; exit 0 ;;
*) echo "bench-images: unknown argument $1 (see --help)" >&2; exit 2 ;;
esac

work=${BENCH_WORK:-.demo/bench-images}
out=${BENCH_OUT:-}
scale=${BENCH_SCALE:-1}
runs=${BENCH_RUNS:-3}
epochs=${BENCH_EPOCHS:-1}
run_timeout=${BENCH_RUN_TIMEOUT:-600}
sl_flags=${BENCH_SL_FLAGS:-}
with_w1=${BENCH_BASELINE_W1:-0}
with_go=${BENCH_GO:-0}
with_local=${BENCH_LOCAL:-0}
transforms=${BENCH_TRANSFORMS:-eval train}
for tr in $transforms; do
	[[ $tr == eval || $tr == train ]] || { echo "bench-images: BENCH_TRANSFORMS holds eval and train, not $tr" >&2; exit 2; }
done
if ! [[ $scale =~ ^([0-9]+\.?[0-9]*|\.[0-9]+)$ ]] || ! awk -v f="$scale" 'BEGIN {exit !(f > 0)}'; then
	echo "bench-images: BENCH_SCALE must be a positive number, not $scale" >&2
	exit 2
fi
[[ $runs =~ ^[1-9][0-9]*$ ]] || { echo "bench-images: BENCH_RUNS must be a positive integer" >&2; exit 2; }
[[ $epochs =~ ^[1-9][0-9]*$ ]] || { echo "bench-images: BENCH_EPOCHS must be a positive integer" >&2; exit 2; }
bench_dirs
# jfmt FILE KEY [FORMAT]: a number from a JSON file, printf-formatted (default %.1f; "-" if absent).
jfmt() { python3 -c 'import json,sys; v=json.load(open(sys.argv[1])).get(sys.argv[2]); print("-" if v is None else sys.argv[3] % v)' "$1" "$2" "${3:-%.1f}"; }
command -v curl > /dev/null || { echo "bench-images: curl not found (scripts/deps.sh installs it)" >&2; exit 1; }
command -v python3 > /dev/null || { echo "bench-images: python3 not found (scripts/deps.sh installs it)" >&2; exit 1; }
curl --help all 2> /dev/null | grep -q -- --aws-sigv4 || { echo "bench-images: this curl has no --aws-sigv4 (need 7.75 or later)" >&2; exit 1; }

failed=() # what failed but let the rest run; the script then exits 1

# --- Python and shardload ------------------------------------------------------------
# The first of $BENCH_PYTHON, python3 on PATH and Debian's /usr/bin/python3 that
# imports what the baseline and the generator need.
py=
for cand in ${BENCH_PYTHON:-python3 /usr/bin/python3}; do
	if "$cand" -c 'import torch, torchvision, numpy, PIL' 2> /dev/null; then
		py=$cand
		break
	fi
done
[[ -n $py ]] || { echo "bench-images: no python3 that imports torch, torchvision, numpy and PIL (scripts/deps.sh installs them; or set BENCH_PYTHON)" >&2; exit 1; }
log "Python: $py ($("$py" -c 'import sys, torch, torchvision, PIL; print("Python", sys.version.split()[0], "torch", torch.__version__, "torchvision", torchvision.__version__, "PIL", PIL.__version__)'))"

sl=
if [[ -n ${BENCH_SHARDLOAD:-} ]]; then
	sl=$(command -v "$BENCH_SHARDLOAD") || { echo "bench-images: BENCH_SHARDLOAD=$BENCH_SHARDLOAD not found" >&2; exit 1; }
	log "using $sl (BENCH_SHARDLOAD)"
else
	log "building bin/shardload"
	if go build -o bin/shardload ./cmd/shardload; then
		sl=$root/bin/shardload
	else
		log "go build ./cmd/shardload failed: the shardload runs are not made (BENCH_SHARDLOAD=BINARY measures a binary built before)"
		failed+=("go build ./cmd/shardload")
	fi
fi
have_decoder_flag=0
if [[ -n $sl ]] && "$sl" bench --help 2>&1 | grep -q -- '--image-decoder'; then
	have_decoder_flag=1
elif [[ -n $sl ]]; then
	log "NOTE: this shardload bench has no --image-decoder: run (a) uses its default decoder and (b) is not made"
fi

# --- dataset ---------------------------------------------------------------------------
# size N F: round(N*F), at least 1.
size() { awk -v n="$1" -v f="$2" 'BEGIN {v = int(n*f + 0.5); print (v < 1 ? 1 : v)}'; }
shards=$(size 8 "$scale")
((shards >= 4)) || shards=4
per=$(size 2000 "$scale")
per=$(((per + shards - 1) / shards))
name=images-${shards}x$per
ds=$work/$name
if [[ -f $ds/.complete ]]; then
	log "dataset: reusing $ds"
else
	log "dataset: generating $shards shards x $per samples in $ds"
	rm -rf "$ds"
	"$py" bench/make_image_shards.py "$ds" --shards "$shards" --samples-per-shard "$per" --seed 1 > "$ds.pattern"
	mv "$ds.pattern" "$ds/.complete"
fi
pattern=$(cat "$ds/.complete")
files=$(find "$ds" -maxdepth 1 -name 'images-*.tar' -type f | sort)
nfiles=$(wc -l <<< "$files")
bytes=$(xargs stat -c %s <<< "$files" | awk '{s += $1} END {print s}')
log "dataset: $nfiles shards, $(awk -v b="$bytes" 'BEGIN {printf "%.1f", b/1e6}') MB; $(python3 -c 'import json,sys; s=json.load(open(sys.argv[1])); print("%d samples, jpg mean %.1f KB, %d landscape / %d portrait" % (s["samples"], s["image_bytes_mean"]/1e3, s["orientation"]["landscape"], s["orientation"]["portrait"]))' "$ds/stats.json")"

# --- MinIO ---------------------------------------------------------------------------
s3=$work/s3
bench_workdir "$s3"
trap stop_minio EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
start_minio "$s3"
echo "$AWS_ACCESS_KEY_ID $AWS_SECRET_ACCESS_KEY" > "$s3/creds"
endpoint=$AWS_ENDPOINT_URL
bucket=bench
log "MinIO ready at $endpoint (data in $s3)"
urls=$out/urls
# shellcheck disable=SC2001 # one URL per line of $files
sed "s|^.*/|$endpoint/$bucket/$name/|" <<< "$files" > "$urls"
if [[ -z $reuse ]] || ! curl -fsS -m 60 -o /dev/null -r 0-0 "$(tail -n 1 "$urls")" 2> /dev/null; then
	s3curl -X PUT -o /dev/null "$endpoint/$bucket" 2> /dev/null || true # there already when reused
	policy=$(printf '{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Principal":{"AWS":["*"]},"Action":["s3:GetObject"],"Resource":["arn:aws:s3:::%s/*"]}]}' "$bucket")
	# As bench-pipeline.sh: send the body's SHA-256 (curl signs it but does not send
	# it) and write "?policy=" (how curl 7.88 canonicalizes a bare query key differs).
	s3curl -X PUT -o /dev/null -H 'Content-Type: application/json' \
		-H "x-amz-content-sha256: $(printf %s "$policy" | sha256sum | cut -d' ' -f1)" \
		--data-binary "$policy" "$endpoint/$bucket?policy="
	t0=$(date +%s.%N)
	# shellcheck disable=SC2016 # expanded by sh, from its arguments and the environment
	xargs -P 2 -I{} sh -c 'curl -fsS -m 600 --aws-sigv4 "aws:amz:us-east-1:s3" --user "$AWS_ACCESS_KEY_ID:$AWS_SECRET_ACCESS_KEY" \
		-H "x-amz-content-sha256: UNSIGNED-PAYLOAD" -o /dev/null -T "$1" "$2/$(basename "$1")"' sh {} "$endpoint/$bucket/$name" <<< "$files"
	log "uploaded in $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN {printf "%.1f", b-a}')s"
else
	log "reusing the objects in MinIO (BENCH_REUSE=1)"
fi
# The public-read policy works: a plain GET of one object.
curl -fsS -m 60 -o /dev/null -r 0-0 "$(head -n 1 "$urls")"
s3pat=s3://$bucket/$name/$(basename "$pattern")
index=$out/index.jsonl
if [[ -n $sl ]]; then
	if ! "$sl" ls --summary --json "$s3pat" > "$index" 2> "$out/index.err"; then
		log "shardload ls failed (see $out/index.err); the shardload runs go without an index"
		failed+=("shardload ls --summary --json")
		index=
	fi
fi
python3 -c 'import json, sys; s = json.load(open(sys.argv[1])); s.update(name=sys.argv[2], dir=sys.argv[3], s3_pattern=sys.argv[4], urls_file=sys.argv[5]); json.dump(s, open(sys.argv[6], "w"), indent=1)' \
	"$ds/stats.json" "$name" "$ds" "$s3pat" "$urls" "$out/dataset.json"

# --- measurements ----------------------------------------------------------------------
# measured DEST CMD...: runs CMD (under timeout) with stdout to DEST and stderr to
# DEST.err; writes DEST.rusage.json: its exit status, wall seconds and the rusage of
# its process tree (user and system CPU of it and of every descendant that was waited
# for; the largest single RSS). Returns CMD's status.
measured() {
	local dest=$1
	shift
	python3 -c '
import json, resource, subprocess, sys, time
dest, cmd = sys.argv[1], sys.argv[2:]
t0 = time.perf_counter()
with open(dest, "wb") as out, open(dest + ".err", "wb") as err:
    rc = subprocess.call(cmd, stdout=out, stderr=err)
wall = time.perf_counter() - t0
ru = resource.getrusage(resource.RUSAGE_CHILDREN)
with open(dest + ".rusage.json", "w") as f:
    json.dump({"rc": rc, "wall_seconds": wall, "cpu_user": ru.ru_utime, "cpu_system": ru.ru_stime,
               "cpu_seconds": ru.ru_utime + ru.ru_stime, "max_rss_one_process_bytes": ru.ru_maxrss * 1024}, f)
sys.exit(rc if 0 <= rc < 256 else 1)' "$dest" timeout -k 10 "$run_timeout" "$@"
}

# check_json DEST WHAT: keeps DEST's last line if it is a JSON object with "seconds"
# and "samples"; else logs, moves it to DEST.bad and returns 1.
check_json() {
	local dest=$1 what=$2
	if [[ -s $dest ]]; then
		tail -n 1 "$dest" > "$dest.tmp" && mv "$dest.tmp" "$dest"
	fi
	if ! python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); float(d["seconds"]); int(d["samples"])' "$dest" 2> /dev/null; then
		log "$what printed no JSON object with \"seconds\" and \"samples\" (kept as $dest.bad)"
		mv "$dest" "$dest.bad"
		return 1
	fi
	[[ -s $dest.err ]] || rm -f "$dest.err"
}

# KIND -> a description, and whether it still runs (a kind that fails is not repeated).
# A kind is shardload-turbo, shardload-go, shardload-local, baseline-w2 or baseline-w1,
# then -TRANSFORM.
kinds=()
declare -A DESC OK
for tr in $transforms; do
	if [[ -n $sl ]]; then
		if ((have_decoder_flag)); then
			kinds+=(shardload-turbo-$tr)
			DESC[shardload-turbo-$tr]="shardload bench, --image-decoder libjpeg-turbo, $tr"
			if [[ $with_go == 1 ]]; then
				kinds+=(shardload-go-$tr)
				DESC[shardload-go-$tr]="shardload bench, --image-decoder go, $tr"
			fi
			if [[ $with_local == 1 ]]; then
				kinds+=(shardload-local-$tr)
				DESC[shardload-local-$tr]="shardload bench, --image-decoder libjpeg-turbo, local files, $tr"
			fi
		else
			kinds+=(shardload-turbo-$tr)
			DESC[shardload-turbo-$tr]="shardload bench (default decoder: no --image-decoder flag), $tr"
		fi
	fi
	kinds+=(baseline-w2-$tr)
	DESC[baseline-w2-$tr]="DataLoader baseline, 2 workers, $tr"
	if [[ $with_w1 == 1 ]]; then
		kinds+=(baseline-w1-$tr)
		DESC[baseline-w1-$tr]="DataLoader baseline, 1 worker, $tr"
	fi
done
for k in "${kinds[@]}"; do OK[$k]=1; done
printf '%s\n' "${kinds[@]}" > "$out/kinds"

# field_opts TRANSFORM: the image field's options for it.
field_opts() {
	case $1 in
	eval) echo resize=256 ;;
	train) echo random-crop,flip ;;
	esac
}

# run_kind KIND I: one measured run.
run_kind() {
	local kind=$1 i=$2 dest=$out/$1.$2.json
	local -a cmd
	local tr=${kind##*-} base=${kind%-*} opts
	opts=$(field_opts "$tr")
	case $base in
	shardload-turbo | shardload-go | shardload-local)
		cmd=("$sl" bench --json --batch-size 32 --epochs "$epochs" --step-time 0
			--field "img=jpg:image:uint8:3x224x224:$opts" --field cls)
		if [[ $base == shardload-local ]]; then
			cmd+=(--no-index-store --image-decoder libjpeg-turbo)
			# shellcheck disable=SC2206
			cmd+=($sl_flags "$pattern")
		else
			[[ -z $index ]] || cmd+=(--index "$index")
			if ((have_decoder_flag)); then
				cmd+=(--image-decoder "$([[ $base == shardload-turbo ]] && echo libjpeg-turbo || echo go)")
			fi
			# shellcheck disable=SC2206
			cmd+=($sl_flags "$s3pat")
		fi
		;;
	baseline-w2 | baseline-w1)
		cmd=("$py" bench/dataloader_images.py --transform "$tr" --json --urls-file "$urls" --epochs "$epochs" --batch-size 32
			--workers "${base#baseline-w}" --step-time 0 --image 224 --image-field jpg)
		;;
	esac
	if ! measured "$dest" "${cmd[@]}"; then
		log "$kind run $i FAILED (exit $(jfmt "$dest.rusage.json" rc %d); stderr in $dest.err):"
		tail -n 5 "$dest.err" | sed 's/^/    /' >&2
		mv "$dest" "$dest.bad" 2> /dev/null || true
		failed+=("$kind run $i: ${DESC[$kind]}")
		OK[$kind]=0
		return 1
	fi
	if ! check_json "$dest" "$kind run $i"; then
		failed+=("$kind run $i: no JSON result")
		OK[$kind]=0
		return 1
	fi
	log "$kind run $i: $(jfmt "$dest" samples %d) samples, $(jfmt "$dest" samples_per_sec %.0f) samples/s, CPU $(python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); d=json.load(open(sys.argv[2])); print("%.2f ms/sample" % (1e3*r["cpu_seconds"]/max(d["samples"],1)))' "$dest.rusage.json" "$dest"), peak RSS $(jfmt "$dest" peak_rss_bytes %.0f | awk '{printf "%.0f MiB", $1/1048576}')$([[ $kind == shardload-* ]] && echo ", decoder $(jfmt "$dest" image_decoder %s)")"
}

# The ceilings on this machine's cores, the same work with no store and no I/O
# (tools/jpegrate), for each transform: libjpeg-turbo decoding every JPEG at full
# size (the call PIL makes too), and decoding each as the transform's image field
# (decode, resize, crop), the spec the shardload runs use. Measured in each round of
# runs, interleaved with them, so that the ratio sees the same machine states.
jpegrate=
if (cd "$root" && go build -o "$out/jpegrate" ./tools/jpegrate); then
	jpegrate=$out/jpegrate
else
	failed+=("go build ./tools/jpegrate")
fi
# run_ceiling TRANSFORM I: one measured run of tools/jpegrate (3 rounds, their median).
run_ceiling() {
	local tr=$1 i=$2 dest=$out/ceiling-$1.$2.json
	if ! "$jpegrate" --rounds 3 --field "img=jpg:image:uint8:3x224x224:$(field_opts "$tr")" "$ds"/*.tar > "$dest" 2> "$dest.err"; then
		log "jpegrate ($tr) run $i FAILED: $(tail -n 3 "$dest.err" 2> /dev/null)"
		failed+=("ceiling $tr run $i (tools/jpegrate)")
		rm -f "$dest"
		return 1
	fi
	[[ -s $dest.err ]] || rm -f "$dest.err"
	log "ceiling-$tr run $i: $(jfmt "$dest" field_per_sec %.0f) images/s as the field, $(jfmt "$dest" decode_per_sec %.0f) decode alone"
}

for ((i = 1; i <= runs; i++)); do
	for k in "${kinds[@]}"; do
		[[ ${OK[$k]} == 1 ]] || continue
		run_kind "$k" "$i" || true
	done
	if [[ -n $jpegrate ]]; then
		for tr in $transforms; do run_ceiling "$tr" "$i" || true; done
	fi
done

# --- summary -------------------------------------------------------------------------
EPOCHS=$epochs "$py" - "$out" "$cmdline" "$runs" "$scale" "$endpoint" \
	"$(git rev-parse --short HEAD 2> /dev/null || echo unknown)$(git diff --quiet HEAD -- 2> /dev/null || echo -dirty)" \
	"$(go env GOVERSION 2> /dev/null || echo unknown)" "$([[ -n $sl ]] && "$sl" version 2> /dev/null | head -n 1 || echo none)" \
	"${failed[@]}" << 'EOF' | tee "$out/summary.txt"
import json, os, statistics, sys

out, cmdline, runs, scale, endpoint, git, go, slversion = sys.argv[1:9]
epochs = int(os.environ.get("EPOCHS", "1"))
failed = sys.argv[9:]
runs = int(runs)
kinds = open(os.path.join(out, "kinds")).read().split()
base_desc = {
    "shardload-turbo": "shardload, libjpeg-turbo",
    "shardload-go": "shardload, Go decoder",
    "shardload-local": "shardload, libjpeg-turbo, local files",
    "baseline-w2": "DataLoader, 2 workers",
    "baseline-w1": "DataLoader, 1 worker",
}
transforms = []
for k in kinds:
    tr = k.rsplit("-", 1)[1]
    if tr not in transforms:
        transforms.append(tr)


def desc(kind):
    base, tr = kind.rsplit("-", 1)
    return f"{base_desc.get(base, base)}, {tr}"


def load(p):
    try:
        with open(p) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def row(kind, i):
    d = load(os.path.join(out, f"{kind}.{i}.json"))
    r = load(os.path.join(out, f"{kind}.{i}.json.rusage.json"))
    if d is None:
        return None
    n = d.get("samples") or 0
    res = {
        "run": i,
        "samples": n,
        "seconds": d.get("seconds"),
        "samples_per_sec": d.get("samples_per_sec"),
        "cpu_seconds_rusage": r and r.get("cpu_seconds"),
        "cpu_ms_per_sample": (1e3 * r["cpu_seconds"] / n) if r and n else None,
        "cpu_seconds_tool": d.get("cpu_seconds"),
        "cpu_ms_per_sample_tool": (1e3 * d["cpu_seconds"] / n) if d.get("cpu_seconds") is not None and n else None,
        # The CPU of the run itself: the tool's cpu_seconds (read at its end, before the
        # process exits) less its start-up (the baseline's cpu_seconds_startup: the
        # interpreter and imports; shardload reports none, its start-up is
        # milliseconds); the process tree's rusage less the start-up when the tool
        # reports no cpu_seconds.
        "cpu_ms_per_sample_run": (1e3 * ((d["cpu_seconds"] if d.get("cpu_seconds") is not None else r["cpu_seconds"])
                                         - (d.get("cpu_seconds_startup") or 0.0)) / n)
        if n and (d.get("cpu_seconds") is not None or r) else None,
        "peak_rss_bytes": d.get("peak_rss_bytes"),
        "wall_seconds_process": r and r.get("wall_seconds"),
        "first_batch_seconds": d.get("first_batch_seconds"),
        "image_decoder": d.get("image_decoder"),
    }
    if "cpu_seconds_startup" in d:
        res["cpu_seconds_startup"] = d["cpu_seconds_startup"]
    if "workers_reaped" in d:
        res["workers_reaped"] = d["workers_reaped"]
    return res


def med(rows, key):
    v = [r[key] for r in rows if isinstance(r.get(key), (int, float)) and not isinstance(r.get(key), bool)]
    return statistics.median(v) if v else None


def f(v, spec="{:.1f}"):
    return "-" if v is None else spec.format(v)


results = {}
for k in kinds:
    rows = [r for r in (row(k, i) for i in range(1, runs + 1)) if r is not None]
    m = {key: med(rows, key) for key in ("samples", "seconds", "samples_per_sec", "cpu_ms_per_sample",
                                         "cpu_ms_per_sample_run", "cpu_ms_per_sample_tool",
                                         "peak_rss_bytes", "first_batch_seconds")}
    m["runs"] = len(rows)
    decoders = sorted({r["image_decoder"] for r in rows if r.get("image_decoder")})
    m["image_decoder"] = ",".join(decoders) or None
    results[k] = {"runs": rows, "median": m}

ds = load(os.path.join(out, "dataset.json")) or {}
lines = [f"command: {cmdline}", ""]
lines.append(f"dataset: {ds.get('samples')} samples in {ds.get('shards')} shards ({(ds.get('tar_bytes') or 0) / 1e6:.1f} MB), "
             f"jpg mean {(ds.get('image_bytes_mean') or 0) / 1e3:.1f} KB, "
             f"{ds.get('orientation', {}).get('landscape')} landscape / {ds.get('orientation', {}).get('portrait')} portrait; "
             f"read from MinIO at {endpoint}")
lines.append("transforms: decode to RGB, then eval: shorter side to 256 (bilinear, antialiased as PIL), center crop 224 "
             "(torchvision Resize(256) + CenterCrop(224)); train: RandomResizedCrop(224) + RandomHorizontalFlip(); "
             f"uint8 3x224x224 + cls; batch 32, {epochs} epoch(s) a run")
lines.append(f"runs: {runs} of each kind, interleaved; medians of each column. CPU: user + system seconds of the "
             "process tree (rusage of the run's process and the descendants it waited for), start-up and exit included; "
             "'run only' is the tool's own cpu_seconds less its start-up (the baseline's cpu_seconds_startup: "
             "interpreter and torch import, about 1 s; the baseline's exit, about 0.3 s, is not in it either): the "
             "steady cost that a long run converges to; 'tool' is the tool's cpu_seconds as it reports it")
lines.append("")
hdr = (f"{'':46} {'samples/s':>10} {'CPU ms/sample':>14} {'run only':>9} {'tool':>7} {'peak RSS MiB':>13} "
       f"{'first batch s':>14} {'runs':>5}")
lines.append(hdr)
for k in kinds:
    m = results[k]["median"]
    name = desc(k) + (f" [{m['image_decoder']}]" if k.startswith("shardload") and m["image_decoder"] else "")
    lines.append(f"{name:46.46} {f(m['samples_per_sec'], '{:.0f}'):>10} {f(m['cpu_ms_per_sample'], '{:.2f}'):>14} "
                 f"{f(m['cpu_ms_per_sample_run'], '{:.2f}'):>9} {f(m['cpu_ms_per_sample_tool'], '{:.2f}'):>7} "
                 f"{f(m['peak_rss_bytes'] / 2**20 if m['peak_rss_bytes'] else None, '{:.0f}'):>13} "
                 f"{f(m['first_batch_seconds'], '{:.2f}'):>14} {m['runs']:>5}")
lines.append("")
lines.append("per run:")
for k in kinds:
    for r in results[k]["runs"]:
        lines.append(f"  {k:22} run {r['run']}: {f(r['samples'], '{:d}')} samples in {f(r['seconds'], '{:.2f}')}s, "
                     f"{f(r['samples_per_sec'], '{:.0f}')} samples/s, CPU {f(r['cpu_ms_per_sample'], '{:.2f}')} ms/sample "
                     f"(run only {f(r['cpu_ms_per_sample_run'], '{:.2f}')}, "
                     f"tool {f(r['cpu_ms_per_sample_tool'], '{:.2f}')}), peak RSS "
                     f"{f(r['peak_rss_bytes'] / 2**20 if r['peak_rss_bytes'] else None, '{:.0f}')} MiB")
lines.append("")


def ratio(a, b, key):
    x = results.get(a, {}).get("median", {}).get(key)
    y = results.get(b, {}).get("median", {}).get(key)
    return x / y if x and y else None


ratios = {}
for tr in transforms:
    for a0 in ("shardload-turbo", "shardload-go"):
        for b0 in ("baseline-w2", "baseline-w1"):
            a, b = f"{a0}-{tr}", f"{b0}-{tr}"
            if a not in results or b not in results:
                continue
            ratios[f"{a}/{b}"] = {
                "samples_per_sec": ratio(a, b, "samples_per_sec"),
                "cpu_per_sample": ratio(a, b, "cpu_ms_per_sample"),
                "cpu_per_sample_run": ratio(a, b, "cpu_ms_per_sample_run"),
                "peak_rss": ratio(a, b, "peak_rss_bytes"),
            }
            # The ratio of each run to the baseline run made just after it (the same
            # machine state), and their median: steadier than the ratio of medians.
            per = []
            for ra in results[a]["runs"]:
                rb = next((r for r in results[b]["runs"] if r["run"] == ra["run"]), None)
                if rb and ra.get("samples_per_sec") and rb.get("samples_per_sec"):
                    per.append(ra["samples_per_sec"] / rb["samples_per_sec"])
            ratios[f"{a}/{b}"]["samples_per_sec_paired"] = per
            ratios[f"{a}/{b}"]["samples_per_sec_paired_median"] = statistics.median(per) if per else None
lines.append("ratios (medians):")
for k, v in ratios.items():
    lines.append(f"  {k:42} samples/s x{f(v['samples_per_sec'], '{:.2f}')} "
                 f"(paired runs: median x{f(v['samples_per_sec_paired_median'], '{:.2f}')}, "
                 f"{' '.join('x%.2f' % x for x in v['samples_per_sec_paired'])}), CPU per sample x{f(v['cpu_per_sample'], '{:.2f}')} "
                 f"(run only x{f(v['cpu_per_sample_run'], '{:.2f}')}), peak RSS x{f(v['peak_rss'], '{:.2f}')}")
ceilings = {}
for tr in transforms:
    rounds = [c for c in (load(os.path.join(out, f"ceiling-{tr}.{i}.json")) for i in range(1, runs + 1)) if c]
    if rounds:
        ceilings[tr] = {"field": rounds[0]["field"], "threads": rounds[0]["threads"], "runs": len(rounds),
                        "rounds": rounds[0]["rounds"], "per_run": rounds,
                        **{k: statistics.median(c[k] for c in rounds)
                           for k in ("decode_per_sec", "decode_cpu_ms", "field_per_sec", "field_cpu_ms")}}
for tr, ceiling in ceilings.items():
    base = results.get(f"baseline-w2-{tr}", {}).get("median", {}).get("samples_per_sec")
    if not ceiling:
        continue
    vs = (lambda v: f": x{v / base:.2f} the {tr} DataLoader's samples/s") if base else (lambda v: "")
    lines.append("")
    lines.append(f"ceiling ({tr}; the field {ceiling['field']}) on {ceiling['threads']} threads, the JPEGs in memory "
                 f"(no store, no I/O; medians of {ceiling['runs']} runs interleaved with the others, each the median of "
                 f"{ceiling['rounds']} rounds; field images/s by run: {' '.join('%.0f' % c['field_per_sec'] for c in ceiling['per_run'])}):")
    lines.append(f"  libjpeg-turbo decode alone (the call PIL makes): {ceiling['decode_per_sec']:.0f} images/s, "
                 f"{ceiling['decode_cpu_ms']:.2f} ms CPU each{vs(ceiling['decode_per_sec'])}")
    lines.append(f"  decode + resize + crop as the field:              {ceiling['field_per_sec']:.0f} images/s, "
                 f"{ceiling['field_cpu_ms']:.2f} ms CPU each{vs(ceiling['field_per_sec'])}")


def verdict_of(r, want, tr):
    turbo_decoder = results.get(f"shardload-turbo-{tr}", {}).get("median", {}).get("image_decoder")
    if r is None:
        return "NOT MEASURED"
    if turbo_decoder not in (None, "libjpeg-turbo"):
        return f"NOT MEASURED (the run used decoder {turbo_decoder})"
    return "PASS" if r >= want else "FAIL"


def against_ceiling(kind, tr):
    """The median samples/s of kind's runs over transform tr's ceiling (None when
    either is missing), and each run over the ceiling measured in its round."""
    rate = results.get(kind, {}).get("median", {}).get("samples_per_sec")
    ceiling = ceilings.get(tr)
    c = rate / ceiling["field_per_sec"] if rate and ceiling and ceiling.get("field_per_sec") else None
    paired = []
    for ra in results.get(kind, {}).get("runs", []):
        cr = load(os.path.join(out, f"ceiling-{tr}.{ra['run']}.json"))
        if cr and ra.get("samples_per_sec") and cr.get("field_per_sec"):
            paired.append(ra["samples_per_sec"] / cr["field_per_sec"])
    return c, paired


verdicts = {}
for tr in transforms:
    r = ratio(f"shardload-turbo-{tr}", f"baseline-w2-{tr}", "samples_per_sec")
    c, paired = against_ceiling(f"shardload-turbo-{tr}", tr)
    verdicts[tr] = {"dataloader_ratio": r, "dataloader_verdict": verdict_of(r, 2.0, tr),
                    "ceiling_ratio": c, "ceiling_ratio_paired": paired, "ceiling_verdict": verdict_of(c, 0.9, tr)}
    lines.append("")
    lines.append(f"target ({tr}): shardload with libjpeg-turbo >= 2x the DataLoader's (2 workers) samples/s: "
                 f"{verdicts[tr]['dataloader_verdict']}" + (f" (x{r:.2f})" if r is not None else ""))
    lines.append(f"target ({tr}): shardload with libjpeg-turbo >= 0.9x the field's ceiling (decode + resize + crop "
                 f"in memory): {verdicts[tr]['ceiling_verdict']}" + (f" (x{c:.2f}; paired runs: "
                 f"{' '.join('x%.2f' % x for x in paired)})" if c is not None else ""))
    lc, lp = against_ceiling(f"shardload-local-{tr}", tr)
    if lc is not None:
        verdicts[tr]["local_ceiling_ratio"], verdicts[tr]["local_ceiling_ratio_paired"] = lc, lp
        lines.append(f"  the same, the shards as local files (no store on the cores): x{lc:.2f} "
                     f"(paired runs: {' '.join('x%.2f' % x for x in lp)})")
if failed:
    lines.append("")
    lines.append("failed: " + "; ".join(failed))
print("\n".join(lines))

env = {
    "command": cmdline, "scale": float(scale), "runs": runs, "epochs": epochs, "endpoint": endpoint, "git": git, "go": go,
    "shardload_version": slversion, "loadavg_at_end": open("/proc/loadavg").read().split()[:3],
    "cpu": next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), ""),
    "cores": os.cpu_count(),
}
with open(os.path.join(out, "summary.json"), "w") as fh:
    json.dump({"env": env, "dataset": ds, "results": results, "ratios": ratios, "ceilings": ceilings,
               "target": {"what": "shardload-turbo-T samples/s >= 2 x baseline-w2-T and >= 0.9 x ceiling-T field_per_sec, for each transform T",
                          "by_transform": verdicts},
               "failed": failed}, fh, indent=1)
EOF
log "results in $out"
if ((${#failed[@]})); then
	printf 'bench-images: FAILED: %s\n' "${failed[@]}" >&2
	exit 1
fi
