# syntax=docker/dockerfile:1
#
# MinIO and its client mc, built from source through the Go module proxy, because
# MinIO publishes no community images for new releases. MINIO_VERSION is the version
# scripts/tools.sh builds for the tests (docker-compose.yml passes the same, and
# examples/validate checks that the three agree); MC_VERSION is mc's latest version on
# the proxy when this was written (the tests need no mc). Two targets:
#
#   docker build -f docker/minio.Dockerfile --target minio docker/   # the server
#   docker build -f docker/minio.Dockerfile --target mc docker/      # the client
#
# The runtime is Alpine: a shell and busybox's wget, which the compose healthcheck
# uses (MinIO's image had curl; this one has none). Both run as uid 1000.

ARG GO_VERSION=1.26
ARG ALPINE_VERSION=3.22

# Outside any module, as scripts/tools.sh builds them; each target builds only its own.
FROM golang:${GO_VERSION}-bookworm AS build-minio
ARG MINIO_VERSION=v0.0.0-20260212201848-7aac2a2c5b7c
WORKDIR /tmp
ENV CGO_ENABLED=0 GOFLAGS=-mod=mod GOWORK=off GOBIN=/out
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
	go install -trimpath "github.com/minio/minio@${MINIO_VERSION}"

FROM golang:${GO_VERSION}-bookworm AS build-mc
ARG MC_VERSION=v0.0.0-20250313080218-cf909e1063a9
WORKDIR /tmp
ENV CGO_ENABLED=0 GOFLAGS=-mod=mod GOWORK=off GOBIN=/out
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
	go install -trimpath "github.com/minio/mc@${MC_VERSION}"

FROM alpine:${ALPINE_VERSION} AS minio
RUN adduser -D -u 1000 -h /home/minio minio && install -d -o minio -g minio -m 0750 /data
COPY --from=build-minio /out/minio /usr/local/bin/minio
USER 1000:1000
VOLUME /data
EXPOSE 9000 9001
ENTRYPOINT ["/usr/local/bin/minio"]
CMD ["server", "/data", "--address", ":9000", "--console-address", ":9001"]

FROM alpine:${ALPINE_VERSION} AS mc
RUN adduser -D -u 1000 -h /home/mc mc
COPY --from=build-mc /out/mc /usr/local/bin/mc
USER 1000:1000
WORKDIR /home/mc
ENTRYPOINT ["/usr/local/bin/mc"]
