# syntax=docker/dockerfile:1
#
# The shardload image. Two final targets:
#
#   docker build -t shardload .                  # "static" (the default, the last stage)
#   docker build --target cgo -t shardload:cgo .
#
# static: a CGO_ENABLED=0 binary on distroless/static (no shell, no libc), non-root
#   (uid 65532). Without cgo there is no dlopen, so two things are unavailable:
#   libjpeg-turbo (image fields, `--field NAME=jpg:image:...`, are decoded with Go's
#   image/jpeg, about 3.5x slower; `--image-decoder libjpeg-turbo` fails at start) and
#   the CUDA copy stage (`bench --device cuda`). Use it for `serve` with raw, npy, int,
#   text or json fields (tokens, labels, encoded bytes the trainer decodes), and for
#   `warm`, `index`, `ls`, `cat`: `serve` itself never touches a GPU (trainers copy
#   their batches to it), so most nodes want this one.
#
# cgo: the same binary built with cgo on debian:bookworm-slim with libturbojpeg0,
#   non-root (uid 65532). Use it when the server decodes JPEG image fields (libjpeg-turbo
#   is picked by `--image-decoder auto`), or for `bench --device cuda` on a GPU node
#   (libcuda comes from the NVIDIA container runtime; no CUDA SDK is needed).
#
# Version: the build context has no .git (see .dockerignore), so the binary has no VCS
# information of its own: VERSION and REVISION (docker build --build-arg
# VERSION=v1.2.3 --build-arg REVISION=$(git rev-parse HEAD) ...) are linked into it
# (what "shardload version" prints) and go into the image's OCI labels.
#
# Both images set SHARDLOAD_SOCKET=/run/shardload/loader.sock (the server's --socket
# and the Python client's default) and keep the node's index store under
# /var/cache/shardload/index. /run/shardload and /var/cache/shardload exist in the
# image, owned by uid 65532 (a volume mounted there starts with that owner); give
# the shard cache with --cache-dir /var/cache/shardload/shards.

ARG GO_VERSION=1.26

# ---- src: the module's sources and dependencies ----
FROM golang:${GO_VERSION}-bookworm AS src
WORKDIR /src
ENV GOFLAGS=-buildvcs=false
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
# The directories the images own: copied below with --chown, keeping these modes (the
# server refuses a socket directory that others may write to).
RUN install -d -m 0700 /out/run/shardload && \
	install -d -m 0750 /out/cache/shardload /out/cache/shardload/index

# ---- the two binaries; BuildKit builds only the one the target needs ----
# VERSION and REVISION (e.g. --build-arg VERSION=$(git describe --tags)
# --build-arg REVISION=$(git rev-parse HEAD)) are what "shardload version" prints:
# the build context has no .git to read them from.
FROM src AS build-static
ARG VERSION=unknown
ARG REVISION=
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
	CGO_ENABLED=0 go build -trimpath -ldflags="-s -w -X main.version=${VERSION} -X main.revision=${REVISION}" -o /out/shardload ./cmd/shardload

FROM src AS build-cgo
ARG VERSION=unknown
ARG REVISION=
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
	CGO_ENABLED=1 go build -trimpath -ldflags="-s -w -X main.version=${VERSION} -X main.revision=${REVISION}" -o /out/shardload ./cmd/shardload

# ---- cgo: Debian with libjpeg-turbo, for JPEG image fields and the CUDA stage ----
FROM debian:bookworm-slim AS cgo
ARG VERSION=unknown
ARG REVISION=unknown
RUN apt-get update && \
	apt-get install -y --no-install-recommends libturbojpeg0 ca-certificates && \
	rm -rf /var/lib/apt/lists/* && \
	groupadd --system --gid 65532 shardload && \
	useradd --system --uid 65532 --gid 65532 --home-dir /home/shardload --create-home \
		--shell /usr/sbin/nologin shardload
COPY --from=src --chown=65532:65532 /out/run/ /run/
COPY --from=src --chown=65532:65532 /out/cache/ /var/cache/
COPY --from=build-cgo /out/shardload /usr/local/bin/shardload
ENV SHARDLOAD_SOCKET=/run/shardload/loader.sock \
	SHARDLOAD_INDEX_DIR=/var/cache/shardload/index
LABEL org.opencontainers.image.title="shardload (cgo: libjpeg-turbo, CUDA stage)" \
	org.opencontainers.image.version="${VERSION}" \
	org.opencontainers.image.revision="${REVISION}" \
	org.opencontainers.image.source="https://github.com/shardload/shardload"
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/shardload"]
CMD ["help"]

# ---- static (default): distroless, no libc ----
FROM gcr.io/distroless/static-debian12:nonroot AS static
ARG VERSION=unknown
ARG REVISION=unknown
COPY --from=src --chown=65532:65532 /out/run/ /run/
COPY --from=src --chown=65532:65532 /out/cache/ /var/cache/
COPY --from=build-static /out/shardload /usr/local/bin/shardload
ENV SHARDLOAD_SOCKET=/run/shardload/loader.sock \
	SHARDLOAD_INDEX_DIR=/var/cache/shardload/index
LABEL org.opencontainers.image.title="shardload" \
	org.opencontainers.image.version="${VERSION}" \
	org.opencontainers.image.revision="${REVISION}" \
	org.opencontainers.image.source="https://github.com/shardload/shardload"
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/shardload"]
CMD ["help"]
