#!/usr/bin/env bash
# Reads one object from MinIO on loopback three ways, alternating them, and prints
# the medians and ratios:
#   1 stream    the Fetcher with --parallel 1 (one GET)
#   parallel    the Fetcher with ranged parts (8 MiB, 4 in flight by default)
#   curl x4     4 parallel curl range requests covering the same object
#
#   scripts/bench-fetch.sh [SIZE_MIB] [RUNS] [PARALLEL]    (defaults: 512, 5, 4)
#
# Needs curl (7.75 or later, for --aws-sigv4) and bc; builds MinIO with
# scripts/tools.sh if it is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/bench-lib.sh
size_mib=${1:-512}
runs=${2:-5}
parallel=${3:-4}

go build -o bin/fetchbench ./tools/fetchbench

work=$(mktemp -d)
cleanup() {
	stop_minio
	rm -rf "$work"
}
trap cleanup EXIT
start_minio "$work"

bytes=$((size_mib << 20))
head -c "$bytes" /dev/urandom > "$work/obj"
s3curl -X PUT "$AWS_ENDPOINT_URL/bench" > /dev/null
s3curl -T "$work/obj" -H "x-amz-content-sha256: UNSIGNED-PAYLOAD" "$AWS_ENDPOINT_URL/bench/obj" > /dev/null
rm "$work/obj"

curl4() { # 4 parallel range requests covering the object
	local q=$(((bytes + 3) / 4)) i pids=()
	for ((i = 0; i < 4; i++)); do
		local a=$((i * q)) b=$(((i + 1) * q - 1))
		((b >= bytes)) && b=$((bytes - 1))
		s3curl -H "x-amz-content-sha256: UNSIGNED-PAYLOAD" -r "$a-$b" -o /dev/null "$AWS_ENDPOINT_URL/bench/obj" &
		pids+=($!)
	done
	for p in "${pids[@]}"; do wait "$p"; done
}

# last_read ARGS...: seconds of the last read of fetchbench -repeat 2 (a running
# process: connections and part buffers of the first read reused).
last_read() { bin/fetchbench -repeat 2 "$@" | tail -n 1 | awk '{print $3}'; }
one=() par=() cu=() one2=() par2=()
for ((i = 0; i < runs; i++)); do
	one+=("$(secs bin/fetchbench -parallel 1 s3://bench/obj)")
	par+=("$(secs bin/fetchbench -parallel "$parallel" s3://bench/obj)")
	cu+=("$(secs curl4)")
	one2+=("$(last_read -parallel 1 s3://bench/obj)")
	par2+=("$(last_read -parallel "$parallel" s3://bench/obj)")
done
m1=$(printf '%s\n' "${one[@]}" | median)
mp=$(printf '%s\n' "${par[@]}" | median)
mc=$(printf '%s\n' "${cu[@]}" | median)
m12=$(printf '%s\n' "${one2[@]}" | median)
mp2=$(printf '%s\n' "${par2[@]}" | median)
rate() { echo "$bytes/1000000/$1" | bc -l; }
printf 'object: %d MiB on MinIO at 127.0.0.1, %d runs each, medians (process start included)\n' "$size_mib" "$runs"
printf '1 stream:                     %.3fs  %.0f MB/s\n' "$m1" "$(rate "$m1")"
printf 'parallel parts (8 MiB x %d):   %.3fs  %.0f MB/s\n' "$parallel" "$mp" "$(rate "$mp")"
printf 'curl x4 range requests:       %.3fs  %.0f MB/s\n' "$mc" "$(rate "$mc")"
printf 'parallel / 1 stream:          %.2f\n' "$(echo "$m1/$mp" | bc -l)"
printf 'parallel / curl x4:           %.2f (target >= 0.90)\n' "$(echo "$mc/$mp" | bc -l)"
printf 'in a running process (the second read of fetchbench -repeat 2):\n'
printf '1 stream:                     %.3fs  %.0f MB/s\n' "$m12" "$(rate "$m12")"
printf 'parallel parts (8 MiB x %d):   %.3fs  %.0f MB/s\n' "$parallel" "$mp2" "$(rate "$mp2")"
printf 'parallel / curl x4:           %.2f\n' "$(echo "$mc/$mp2" | bc -l)"
