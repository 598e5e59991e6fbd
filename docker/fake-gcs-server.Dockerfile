# syntax=docker/dockerfile:1
#
# fake-gcs-server (a GCS emulator) built from source through the Go module proxy at
# the version scripts/tools.sh builds for the tests (FAKE_GCS_VERSION; docker-compose.yml
# passes the same, and examples/validate checks that they agree):
#
#   docker build -f docker/fake-gcs-server.Dockerfile docker/
#
# Alpine runtime (busybox wget for the compose healthcheck), uid 1000. Objects live in
# /storage (the filesystem backend); each folder of /data is loaded as a bucket at start.

ARG GO_VERSION=1.26
ARG ALPINE_VERSION=3.22

FROM golang:${GO_VERSION}-bookworm AS build
ARG FAKE_GCS_VERSION=v1.56.1
WORKDIR /tmp
ENV CGO_ENABLED=0 GOFLAGS=-mod=mod GOWORK=off GOBIN=/out
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
	go install -trimpath "github.com/fsouza/fake-gcs-server@${FAKE_GCS_VERSION}"

FROM alpine:${ALPINE_VERSION}
RUN adduser -D -u 1000 -h /home/gcs gcs && install -d -o gcs -g gcs -m 0750 /storage /data
COPY --from=build /out/fake-gcs-server /usr/local/bin/fake-gcs-server
USER 1000:1000
EXPOSE 4443
ENTRYPOINT ["/usr/local/bin/fake-gcs-server"]
CMD ["-scheme", "http", "-port", "4443", "-backend", "filesystem", "-filesystem-root", "/storage", "-data", "/data"]
