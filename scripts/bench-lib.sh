# Helpers the benchmark scripts source: timing, medians, and a MinIO on loopback.
# shellcheck shell=bash

# secs CMD...: the seconds one command takes, with its output to /dev/null.
secs() {
	local t0 t1
	t0=$(date +%s.%N)
	"$@" > /dev/null
	t1=$(date +%s.%N)
	echo "$t1 - $t0" | bc -l
}

# median: the median of the numbers on stdin, one a line.
median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

# free_port: a TCP port on 127.0.0.1 that was free a moment ago.
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# start_minio DIR: starts the MinIO that scripts/tools.sh builds, with its data and
# log under DIR, on free loopback ports with fresh credentials; exports the AWS_*
# variables that point the SDK and s3curl at it, sets minio_pid, and waits until it
# is live. stop_minio ends it.
start_minio() {
	local dir=$1 minio port console
	bash scripts/tools.sh >&2
	minio=${SHARDLOAD_MINIO_BIN:-$(bash scripts/tools.sh path minio)}
	port=$(free_port)
	console=$(free_port)
	# Fresh credentials, unless the caller set BENCH_MINIO_USER and BENCH_MINIO_SECRET
	# (to reopen a data directory an earlier run filled).
	export AWS_ACCESS_KEY_ID=${BENCH_MINIO_USER:-bench-$RANDOM$RANDOM} AWS_SECRET_ACCESS_KEY=${BENCH_MINIO_SECRET:-bench-secret-$RANDOM$RANDOM$RANDOM}
	export AWS_REGION=us-east-1 AWS_ENDPOINT_URL=http://127.0.0.1:$port AWS_EC2_METADATA_DISABLED=true
	MINIO_ROOT_USER=$AWS_ACCESS_KEY_ID MINIO_ROOT_PASSWORD=$AWS_SECRET_ACCESS_KEY MINIO_BROWSER=off MINIO_UPDATE=off \
		"$minio" server --address "127.0.0.1:$port" --console-address "127.0.0.1:$console" "$dir/minio" > "$dir/minio.log" 2>&1 &
	minio_pid=$!
	# Ready, and answering S3: a bucket created right after the health check alone
	# was once refused with 503 (the server still initializing).
	for ((i = 0; i < 300; i++)); do
		curl -fs "$AWS_ENDPOINT_URL/minio/health/ready" > /dev/null && s3curl "$AWS_ENDPOINT_URL/" > /dev/null 2>&1 && return 0
		sleep 0.1
	done
	echo "MinIO did not start:" >&2
	tail "$dir/minio.log" >&2
	return 1
}

stop_minio() {
	if [[ -n ${minio_pid:-} ]]; then
		kill "$minio_pid" 2> /dev/null || true
		wait "$minio_pid" 2> /dev/null || true
		minio_pid=
	fi
}

# s3curl ARGS...: curl signed with the MinIO's credentials.
s3curl() { curl -fsS --aws-sigv4 "aws:amz:us-east-1:s3" --user "$AWS_ACCESS_KEY_ID:$AWS_SECRET_ACCESS_KEY" "$@"; }

# bench_workdir DIR: with BENCH_REUSE=1 and a MinIO data directory an earlier run left
# in DIR, keeps it (its datasets and objects), removes the earlier results and sets
# reuse=1 and the credentials start_minio reopens it with; otherwise empties DIR and
# leaves reuse empty, for the caller to generate and upload its datasets.
bench_workdir() {
	local work=$1
	reuse=
	if [[ ${BENCH_REUSE:-} == 1 && -f $work/creds && -d $work/minio ]]; then
		reuse=1
		read -r BENCH_MINIO_USER BENCH_MINIO_SECRET < "$work/creds"
		export BENCH_MINIO_USER BENCH_MINIO_SECRET
		rm -rf "$work"/*.json "$work"/*.log "$work"/store-*
	else
		rm -rf "$work"
		mkdir -p "$work"
	fi
}

# bench_dirs: makes $work absolute (creating it) and $out (default
# WORK/results/TIMESTAMP) an absolute, existing directory; keeps every request on
# this machine (no proxy for anything); defines log.
bench_dirs() {
	work=$(mkdir -p "$work" && cd "$work" && pwd)
	out=${out:-$work/results/$(date +%Y%m%dT%H%M%S)}
	mkdir -p "$out"
	out=$(cd "$out" && pwd)
	export NO_PROXY=127.0.0.1,localhost no_proxy=127.0.0.1,localhost
	unset HTTP_PROXY HTTPS_PROXY http_proxy https_proxy ALL_PROXY all_proxy
}

log() { printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

# start_store DIR WORK: serves the files of DIR over HTTP with tools/latencyproxy (no
# delay, counting the bytes it sends), its output under WORK; sets store (its base
# URL) and proxy_pid, and stops it on exit. sent prints the bytes sent so far.
start_store() {
	local dir=$1 work=$2 i
	bin/latencyproxy --dir "$dir" --delay 0 --count > "$work/proxy.out" 2> "$work/proxy.log" &
	proxy_pid=$!
	trap stop_store EXIT
	for ((i = 0; i < 100; i++)); do
		[[ -s $work/proxy.out ]] && break
		sleep 0.1
	done
	store=$(head -n 1 "$work/proxy.out")
}

stop_store() { [[ -n ${proxy_pid:-} ]] && kill "$proxy_pid" 2> /dev/null && wait "$proxy_pid" 2> /dev/null || true; }

sent() { curl -fsS "$store/.latencyproxy/count" | python3 -c 'import json,sys; print(json.load(sys.stdin)["bytes"])'; }
