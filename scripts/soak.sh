#!/usr/bin/env bash
# Soak test (not run by make test): one "shardload serve" and two trainer ranks
# (bench/soak_trainer.py) reading epochs for SOAK_SECONDS (default 3600), with a kill
# every SOAK_KILL_EVERY seconds (default 60) taking turns: the server (SIGKILL, then
# started again), rank 0, rank 1 (SIGKILL, then started again from their logs). Every
# SOAK_SAMPLE_EVERY seconds (default 10) it prints the server's resident memory, open
# files, goroutines and sessions, and the batches the ranks have taken (each rank
# steps SOAK_STEP_MS per batch, default 20). At the end it
# checks every complete epoch: each sample exactly once across the ranks (but the
# fewer than world left to no rank), none twice in any epoch, and prints a summary.
#
#   scripts/soak.sh [WORKDIR]      (default: a new temporary directory)
#
# Exit status 0 when every epoch was exact.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=${SOAK_SECONDS:-3600}
kill_every=${SOAK_KILL_EVERY:-60}
sample_every=${SOAK_SAMPLE_EVERY:-10}
step_ms=${SOAK_STEP_MS:-20}
work=${1:-$(mktemp -d /tmp/shardload-soak.XXXXXX)}
mkdir -p "$work"
py=${PYTHON:-/usr/bin/python3}

make build > /dev/null
# Its own copy of the binary: a rebuild while the soak runs must not change what it
# restarts.
cp bin/shardload "$work/shardload"
bin=$work/shardload
data=$work/data
if [[ ! -f $data/shardload.index ]]; then
	$bin gen --shards 16 --samples 400 "$data" > /dev/null
	$bin index --output "$data/" "$data/train-{000000..000015}.tar" 2> /dev/null
fi
pattern="$data/train-{000000..000015}.tar"
sock=$work/run/loader.sock
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
metrics=127.0.0.1:$port
rm -f "$work"/rank-*.log

serve_pid=
start_serve() {
	$bin serve --socket "$sock" --memory 256MiB --metrics "$metrics" --no-index-store "$pattern" >> "$work/serve.out" 2>> "$work/serve.log" &
	serve_pid=$!
	for ((i = 0; i < 100; i++)); do
		[[ -S $sock ]] && curl -fs "http://$metrics/metrics" > /dev/null && return 0
		sleep 0.1
	done
	echo "soak: serve did not start" >&2
	tail "$work/serve.log" >&2
	exit 1
}

declare -a rank_pid
start_rank() {
	$py bench/soak_trainer.py --socket "$sock" --rank "$1" --world 2 --log "$work/rank-$1.log" --step-ms "$step_ms" \
		>> "$work/rank-$1.out" 2>&1 &
	rank_pid[$1]=$!
}

cleanup() {
	kill -9 "${rank_pid[@]}" "$serve_pid" 2> /dev/null || true
	wait 2> /dev/null || true
}
trap cleanup EXIT

# metric NAME: a metric's value from serve's /metrics, or nothing.
metric() {
	local out
	out=$(curl -fs "http://$metrics/metrics" 2> /dev/null) || return 0
	awk -v m="$1" '$1 == m && !done {print $2; done = 1}' <<< "$out"
}

start_serve
start_rank 0
start_rank 1
echo "soak: $seconds s, a kill every $kill_every s, in $work"
printf "%8s %8s %8s %10s %8s %10s %s\n" seconds rss_mib fds goroutines sessions batches event
t0=$(date +%s)
next_kill=$kill_every
next_sample=0
turn=0
event=start
while :; do
	now=$(($(date +%s) - t0))
	((now >= seconds)) && break
	if ((now >= next_sample)); then
		rss=$(awk '/VmRSS/ {printf "%.0f", $2/1024}' "/proc/$serve_pid/status" 2> /dev/null || echo -)
		fds=$(ls "/proc/$serve_pid/fd" 2> /dev/null | wc -l)
		gor=$(metric go_goroutines)
		ses=$(metric shardload_sessions)
		batches=$(cat "$work"/rank-*.log 2> /dev/null | grep -c '"keys"' || true)
		printf "%8d %8s %8s %10s %8s %10s %s\n" "$now" "$rss" "$fds" "${gor:--}" "${ses:--}" "$batches" "$event"
		event=
		next_sample=$((next_sample + sample_every))
	fi
	if ((now >= next_kill)); then
		case $((turn % 3)) in
		0)
			kill -9 "$serve_pid" 2> /dev/null || true
			wait "$serve_pid" 2> /dev/null || true
			start_serve
			event="killed serve"
			;;
		*)
			r=$(((turn % 3) - 1))
			kill -9 "${rank_pid[$r]}" 2> /dev/null || true
			wait "${rank_pid[$r]}" 2> /dev/null || true
			start_rank "$r"
			event="killed rank $r"
			;;
		esac
		turn=$((turn + 1))
		next_kill=$((next_kill + kill_every))
	fi
	for r in 0 1; do
		if ! kill -0 "${rank_pid[$r]}" 2> /dev/null; then
			echo "soak: rank $r exited on its own:" >&2
			tail "$work/rank-$r.out" >&2
			exit 1
		fi
	done
	sleep 1
done
cleanup
trap - EXIT

# Every complete epoch: each sample once across the ranks.
$py - "$work" << 'EOF'
import collections, glob, json, sys
work = sys.argv[1]
per = collections.defaultdict(collections.Counter)   # epoch -> key -> times
last = {}
for path in sorted(glob.glob(f"{work}/rank-*.log")):
    with open(path, "rb") as f:
        for line in f:
            if not line.endswith(b"\n"):
                continue
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            for k in rec["keys"]:
                per[rec["epoch"]][k] += 1
            last[path] = rec["epoch"]
total = 16 * 400
done = min(last.values()) if last else 0   # epochs every rank has finished
bad = 0
for e in sorted(per):
    c = per[e]
    twice = sum(1 for n in c.values() if n > 1)
    if twice:
        bad += 1
        print(f"epoch {e}: {twice} samples read more than once")
    if e < done and len(c) != total - total % 2:
        bad += 1
        print(f"epoch {e}: {len(c)} distinct samples, want {total - total % 2}")
print(f"soak: {len(per)} epochs ({done} complete on every rank), {sum(sum(c.values()) for c in per.values())} samples taken; "
      f"{'every epoch exact' if not bad else f'{bad} epochs wrong'}")
sys.exit(1 if bad else 0)
EOF
