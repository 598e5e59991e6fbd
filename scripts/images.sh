#!/usr/bin/env bash
# Builds the project's container images on this machine, from nothing a registry holds:
# the root file systems are made with debootstrap from Debian's packages and imported
# with `docker import`; the binaries are built here with Go (shardload with cgo, so that
# it loads libjpeg-turbo; MinIO by scripts/tools.sh at its pinned version).
#
#   scripts/images.sh            build every image that is missing or out of date
#   scripts/images.sh roots      only the debootstrap roots
#   scripts/images.sh sizes      print each image's size
#   scripts/images.sh tags       print the image names (NAME=IMAGE per line)
#
# Images:
#   shardload:local                 the loader (Dockerfile): libjpeg-turbo, uid 65532
#   shardload-minio:MINIO_VERSION   MinIO (docker/minio.Dockerfile), uid 1000
#   shardload-trainer:local         Python 3, numpy and the client (docker/trainer.Dockerfile), uid 65532
#   shardload-base/runtime:SUITE-KEY  and  shardload-base/python:SUITE-KEY: the debootstrap roots
#
# Caching: a root is built only when no image of its tag exists (the tag's KEY is a
# digest of the suite, the package list and this script's recipe), and debootstrap's
# downloaded packages are kept in ${XDG_CACHE_HOME:-$HOME/.cache}/shardload/debootstrap,
# so the first run takes minutes and later ones seconds; the other images are rebuilt
# each run from Docker's layer cache (a changed binary or client is one small layer).
# SHARDLOAD_DEBIAN_MIRROR picks the mirror (default http://deb.debian.org/debian).
# Needs root (or sudo) for debootstrap, Docker, and Go; installs debootstrap with apt
# when it is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

# The suite of the roots: this machine's own Debian release when it is Debian (the
# cgo binary built here then finds the C library it was linked against), else bookworm.
suite=bookworm
if [[ -r /etc/os-release ]]; then
	# shellcheck disable=SC1091
	. /etc/os-release
	if [[ ${ID:-} == debian && -n ${VERSION_CODENAME:-} ]]; then
		suite=$VERSION_CODENAME
	fi
fi
mirror=${SHARDLOAD_DEBIAN_MIRROR:-http://deb.debian.org/debian}
cache="${XDG_CACHE_HOME:-$HOME/.cache}/shardload"
# Bump when the way a root is made changes, so that old roots are not reused.
recipe=1

# The packages of each root (minbase: dpkg, apt, coreutils, bash and little more).
# The python root is the runtime root plus python_pkgs, installed into a copy of it
# with apt in a chroot (one debootstrap, not two).
runtime_pkgs=libturbojpeg0,libjpeg62-turbo,ca-certificates
python_pkgs=python3,python3-numpy

MINIO_VERSION=$(sed -n 's/^MINIO_VERSION=//p' scripts/tools.sh)
LOADER=shardload:local
MINIO=shardload-minio:$MINIO_VERSION
TRAINER=shardload-trainer:local

sudo=()
[[ $(id -u) -eq 0 ]] || sudo=(sudo)

key() { printf '%s|%s|%s' "$suite" "$1" "$recipe" | sha256sum | cut -c1-12; }
RUNTIME_BASE=shardload-base/runtime:$suite-$(key "$runtime_pkgs")
PYTHON_BASE=shardload-base/python:$suite-$(key "$runtime_pkgs+$python_pkgs")

log() { echo "images: $*" >&2; }

have_image() { docker image inspect "$1" >/dev/null 2>&1; }

# root TAG PACKAGES: debootstrap a minbase root with PACKAGES and import it as TAG,
# unless TAG exists.
root() {
	local tag=$1 pkgs=$2 dir
	if have_image "$tag"; then
		log "$tag: cached"
		return
	fi
	if ! command -v debootstrap >/dev/null; then
		log "installing debootstrap"
		DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends debootstrap >/dev/null ||
			{ "${sudo[@]}" apt-get update -qq && DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends debootstrap >/dev/null; }
	fi
	mkdir -p "$cache/debootstrap"
	dir=$(mktemp -d "$cache/.root.XXXXXX")
	# shellcheck disable=SC2064
	trap "${sudo[*]} rm -rf '$dir'" EXIT
	log "$tag: debootstrap $suite with $pkgs (minutes the first time)..."
	local t0=$SECONDS
	"${sudo[@]}" debootstrap --variant=minbase --include="$pkgs" --cache-dir="$cache/debootstrap" \
		"$suite" "$dir/root" "$mirror" >"$dir/debootstrap.log" 2>&1 ||
		{ tail -30 "$dir/debootstrap.log" >&2; exit 1; }
	import_root "$dir/root" "$tag" "debootstrap --variant=minbase --include=$pkgs $suite"
	"${sudo[@]}" rm -rf "$dir"
	trap - EXIT
	log "$tag: built in $((SECONDS - t0))s"
}

# import_root DIR TAG MESSAGE: trim a root and import it as the image TAG.
import_root() {
	local r=$1
	# What an image needs no copy of: package lists and caches, documentation, logs.
	"${sudo[@]}" rm -rf "$r"/var/lib/apt/lists/* "$r"/var/cache/apt/*.bin "$r"/var/cache/apt/archives/*.deb \
		"$r"/usr/share/doc/* "$r"/usr/share/man/* "$r"/usr/share/info/* "$r"/var/log/* "$r"/tmp/* \
		"$r"/root/.bash_history
	"${sudo[@]}" tar --numeric-owner --xattrs -C "$r" -c . |
		docker import --change 'CMD ["/bin/bash"]' --change 'ENV LANG=C.UTF-8' -m "$3" - "$2" >/dev/null
}

# derive TAG FROM PACKAGES: the root of the image FROM plus PACKAGES (apt-get in a
# chroot of a copy of it), imported as TAG, unless TAG exists.
derive() {
	local tag=$1 from=$2 pkgs=$3 dir cid
	if have_image "$tag"; then
		log "$tag: cached"
		return
	fi
	local t0=$SECONDS
	log "$tag: $from with ${pkgs//,/ }..."
	dir=$(mktemp -d "$cache/.root.XXXXXX")
	# shellcheck disable=SC2064
	trap "${sudo[*]} rm -rf '$dir'" EXIT
	mkdir "$dir/root"
	cid=$(docker create "$from" /bin/true)
	docker export "$cid" | "${sudo[@]}" tar --numeric-owner -C "$dir/root" -x
	docker rm "$cid" >/dev/null
	"${sudo[@]}" cp /etc/resolv.conf "$dir/root/etc/resolv.conf"
	{
		"${sudo[@]}" chroot "$dir/root" apt-get update -qq &&
			DEBIAN_FRONTEND=noninteractive "${sudo[@]}" chroot "$dir/root" \
				apt-get install -y -qq --no-install-recommends ${pkgs//,/ } &&
			"${sudo[@]}" chroot "$dir/root" apt-get clean
	} >"$dir/apt.log" 2>&1 || { tail -30 "$dir/apt.log" >&2; exit 1; }
	: | "${sudo[@]}" tee "$dir/root/etc/resolv.conf" >/dev/null # Docker writes its own
	import_root "$dir/root" "$tag" "$from + apt-get install ${pkgs//,/ }"
	"${sudo[@]}" rm -rf "$dir"
	trap - EXIT
	log "$tag: built in $((SECONDS - t0))s"
}

# build TAG DOCKERFILE CONTEXT ARGS...: docker build with the legacy builder's layer
# cache, quietly.
build() {
	local tag=$1 file=$2 ctx=$3
	shift 3
	local t0=$SECONDS
	local out
	# Quiet unless it fails (the legacy builder's deprecation notice included).
	out=$(docker build -q -t "$tag" -f "$file" "$@" "$ctx" 2>&1) || { echo "$out" >&2; exit 1; }
	log "$tag: built in $((SECONDS - t0))s"
}

# stage NAME: a fresh build context directory for one image.
stage() {
	local d="$cache/images/$1"
	rm -rf "$d"
	mkdir -p "$d"
	echo "$d"
}

roots() {
	command -v docker >/dev/null || { log "docker is not installed"; exit 1; }
	docker info >/dev/null 2>&1 || { log "docker does not answer (is the daemon running, may this user use it?)"; exit 1; }
	root "$RUNTIME_BASE" "$runtime_pkgs"
	derive "$PYTHON_BASE" "$RUNTIME_BASE" "$python_pkgs"
}

all() {
	roots

	# The loader: shardload built here with cgo (dlopen of libjpeg-turbo and libcuda).
	local ctx version revision
	ctx=$(stage loader)
	version=$(git describe --tags --always --dirty 2>/dev/null || echo unknown)
	revision=$(git rev-parse HEAD 2>/dev/null || echo unknown)
	CGO_ENABLED=1 GOFLAGS=-buildvcs=false go build -trimpath \
		-ldflags="-s -w -X main.version=$version -X main.revision=$revision" -o "$ctx/shardload" ./cmd/shardload
	build "$LOADER" Dockerfile "$ctx" --build-arg "BASE=$RUNTIME_BASE" \
		--build-arg "VERSION=$version" --build-arg "REVISION=$revision"

	# MinIO: the binary the tests run, from scripts/tools.sh's cache (built there
	# first when missing).
	local minio
	minio=$(scripts/tools.sh path minio)
	[[ -x $minio ]] || scripts/tools.sh >&2
	ctx=$(stage minio)
	cp "$minio" "$ctx/minio"
	build "$MINIO" docker/minio.Dockerfile "$ctx" --build-arg "BASE=$RUNTIME_BASE" --build-arg "MINIO_VERSION=$MINIO_VERSION"

	# The trainer: the client package and the scripts the compose demo and the
	# multi-node test run.
	ctx=$(stage trainer)
	mkdir -p "$ctx/python"
	cp -r client/python/shardload "$ctx/python/shardload"
	find "$ctx/python" -name __pycache__ -prune -exec rm -rf {} +
	cp docker/trainer/*.py "$ctx/"
	build "$TRAINER" docker/trainer.Dockerfile "$ctx" --build-arg "BASE=$PYTHON_BASE"
	sizes
}

sizes() {
	for img in "$LOADER" "$MINIO" "$TRAINER" "$RUNTIME_BASE" "$PYTHON_BASE"; do
		if have_image "$img"; then
			printf '%-48s %4d MB\n' "$img" "$(($(docker image inspect -f '{{.Size}}' "$img") / 1000000))"
		fi
	done
}

case ${1:-} in
"") all ;;
roots) roots ;;
sizes) sizes ;;
tags) printf 'LOADER=%s\nMINIO=%s\nTRAINER=%s\n' "$LOADER" "$MINIO" "$TRAINER" ;;
-h | --help | help) sed -n '2,26s/^# \{0,1\}//p' "$0" ;;
*) echo "usage: $0 [sizes|tags]" >&2; exit 2 ;;
esac
