#!/usr/bin/env bash
# Builds the servers the tests run against (MinIO for S3, fake-gcs-server for GCS), at
# pinned versions, from the Go module proxy into a per-user cache, skipping those
# already there.
#
#   scripts/tools.sh              build every tool that is missing
#   scripts/tools.sh path NAME    print where tool NAME lives (built or not)
#
# Cache: ${XDG_CACHE_HOME:-$HOME/.cache}/shardload/tools/NAME-VERSION/NAME.
# internal/testutil computes the same paths; keep the versions there in step.
# A build goes to a temporary directory first, so an interrupted one leaves nothing.
set -euo pipefail

MINIO_VERSION=v0.0.0-20260212201848-7aac2a2c5b7c
FAKE_GCS_VERSION=v1.56.1

cache="${XDG_CACHE_HOME:-$HOME/.cache}/shardload/tools"
tmp=

# tool NAME: sets pkg and version for a tool, or fails.
tool() {
	case $1 in
	minio) pkg=github.com/minio/minio version=$MINIO_VERSION ;;
	fake-gcs-server) pkg=github.com/fsouza/fake-gcs-server version=$FAKE_GCS_VERSION ;;
	*) echo "tools.sh: unknown tool: $1 (known: minio fake-gcs-server)" >&2; exit 2 ;;
	esac
}

path() {
	tool "$1"
	echo "$cache/$1-$version/$1"
}

build() {
	local name=$1 dest
	tool "$name"
	dest=$(path "$name")
	if [[ -x $dest ]]; then
		echo "$name $version: cached $dest"
		return
	fi
	mkdir -p "$cache"
	tmp=$(mktemp -d "$cache/.build-$name.XXXXXX")
	# Remove the temporary directory however this build ends.
	trap 'rm -rf "$tmp"' EXIT
	echo "$name $version: building (this takes minutes the first time)..." >&2
	# Outside any module, so that no go.mod or go.work around us takes part.
	(cd "$tmp" && GOBIN="$tmp/bin" GOFLAGS=-mod=mod GOWORK=off go install "$pkg@$version")
	mkdir -p "$(dirname "$dest")"
	mv "$tmp/bin/$name" "$dest" # same file system: an atomic rename
	rm -rf "$tmp"
	trap - EXIT
	echo "$name $version: built $dest"
}

case ${1:-} in
"") build minio && build fake-gcs-server ;;
path)
	[[ $# -eq 2 ]] || { echo "usage: $0 path NAME" >&2; exit 2; }
	path "$2"
	;;
-h | --help | help) sed -n '2,10s/^# \{0,1\}//p' "$0" ;;
*) echo "usage: $0 [path NAME]" >&2; exit 2 ;;
esac
