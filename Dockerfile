# The shardload image: the loader (`shardload serve`, and every other command) on a
# Debian root made with debootstrap, with libjpeg-turbo, running as uid 65532.
#
# Built by scripts/images.sh (`make images`), not by `docker build .` alone: no
# registry is assumed, so there is no base image to pull and no Go toolchain image to
# compile in. The script makes the base root (shardload-base/runtime: Debian minbase
# with libturbojpeg0, libjpeg62-turbo and ca-certificates, imported with `docker import`), builds the
# binary on the host with cgo (it loads libjpeg-turbo, and libcuda for
# `bench --device cuda`, at run time: a static binary cannot), and builds this file
# in a context that holds only that binary:
#
#   docker build -f Dockerfile --build-arg BASE=shardload-base/runtime:bookworm-KEY CONTEXT
#
# `shardload doctor` in the image says "libjpeg-turbo: loaded"; image fields are
# decoded with it (`--image-decoder auto`), about 3.5x faster than Go's decoder.
#
# The user: uid and gid 65532 ("shardload"). The server accepts trainers of its own
# uid only (SO_PEERCRED), and the Python client talks only to a server of its own uid
# or root, so trainers run as 65532 too (the trainer image does), or the server is
# started with --allow-uid UID and the trainers with SHARDLOAD_TRUST_UIDS=65532.
#
# SHARDLOAD_SOCKET=/run/shardload/loader.sock is the server's socket and the client's
# default; the node's index store is /var/cache/shardload/index and the shard cache
# goes in /var/cache/shardload/shards (--cache-dir). Both directories exist in the
# image, owned by 65532 with the modes the server wants (0700 for the socket's
# directory), so a named volume mounted there starts with that owner and mode.
#
# VERSION and REVISION are what `shardload version` prints (the script passes
# `git describe` and the commit); they also go into the image's labels.

ARG BASE=shardload-base/runtime
FROM ${BASE}
ARG VERSION=unknown
ARG REVISION=unknown
RUN groupadd --system --gid 65532 shardload && \
	useradd --system --uid 65532 --gid 65532 --home-dir /home/shardload --create-home \
		--shell /usr/sbin/nologin shardload && \
	install -d -o 65532 -g 65532 -m 0700 /run/shardload && \
	install -d -o 65532 -g 65532 -m 0750 /var/cache/shardload /var/cache/shardload/index /var/cache/shardload/shards
COPY shardload /usr/local/bin/shardload
ENV SHARDLOAD_SOCKET=/run/shardload/loader.sock \
	SHARDLOAD_INDEX_DIR=/var/cache/shardload/index
LABEL org.opencontainers.image.title="shardload" \
	org.opencontainers.image.version="${VERSION}" \
	org.opencontainers.image.revision="${REVISION}" \
	org.opencontainers.image.source="https://github.com/shardload/shardload"
USER 65532:65532
WORKDIR /home/shardload
ENTRYPOINT ["/usr/local/bin/shardload"]
CMD ["help"]
