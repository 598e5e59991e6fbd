#!/usr/bin/env bash
# The compose demo end to end (`make compose`): builds the images when missing or out
# of date (scripts/images.sh), runs docker-compose.yml detached (MinIO, a dataset
# written and indexed, `shardload serve`, two trainer ranks reading one epoch through
# the socket volume, and check.py), waits for the check, prints what the ranks and
# the check said, and removes the project's containers, network and volumes
# (`down -v`) however it ends. Exit status: the check's (0: every sample read once).
#
#   scripts/compose.sh [--no-build]
#
# Uses `docker compose` when the plugin is there, else docker-compose (1.29 or later).
# SHARDLOAD_COMPOSE_TIMEOUT bounds the wait for the check (seconds, default 600).
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ ${1:-} != --no-build ]]; then
	scripts/images.sh >/dev/null
fi
if docker compose version >/dev/null 2>&1; then
	compose=(docker compose)
elif command -v docker-compose >/dev/null; then
	compose=(docker-compose)
else
	echo "compose: neither 'docker compose' nor docker-compose is installed" >&2
	exit 1
fi
project=shardload-demo
compose+=(-p "$project" -f docker-compose.yml)

logs() {
	local s id
	for s in "$@"; do
		id=$("${compose[@]}" ps -a -q "$s" 2>/dev/null || true)
		[[ -n $id ]] && docker logs "$id" 2>&1 | sed "s/^/$s | /"
	done
	return 0
}
down() { "${compose[@]}" down -v --remove-orphans >/dev/null 2>&1 || true; }
trap down EXIT

# memlock: unlimited where the daemon may raise it, else its own limit.
if ! docker run --rm --network none --ulimit memlock=-1 --entrypoint /bin/true shardload:local 2>/dev/null; then
	kib=$(docker run --rm --network none --entrypoint /bin/sh shardload:local -c 'ulimit -Hl')
	if [[ $kib =~ ^[0-9]+$ ]]; then
		export SHARDLOAD_MEMLOCK=$((kib * 1024))
		echo "compose: this Docker daemon may not raise memlock beyond $((kib / 1024)) MiB: serve runs with that (slabs beyond it unlocked)"
	fi
fi

down # a run killed before its cleanup left things behind
t0=$SECONDS
if ! "${compose[@]}" up -d >/dev/null 2>"${TMPDIR:-/tmp}/compose-up.$$"; then
	cat "${TMPDIR:-/tmp}/compose-up.$$" >&2
	rm -f "${TMPDIR:-/tmp}/compose-up.$$"
	echo "compose: up failed; the services' logs:" >&2
	logs minio dataset upload index serve rank0 rank1 check >&2
	exit 1
fi
rm -f "${TMPDIR:-/tmp}/compose-up.$$"
check=$("${compose[@]}" ps -a -q check)
code=$(timeout "${SHARDLOAD_COMPOSE_TIMEOUT:-600}" docker wait "$check") || code=124
logs dataset upload index rank0 rank1 check
if [[ $code != 0 ]]; then
	echo "compose: check exited $code; serve's log:" >&2
	logs serve >&2
fi
echo "compose: the demo took $((SECONDS - t0))s (check exited $code)"
[[ $code == 0 ]]
