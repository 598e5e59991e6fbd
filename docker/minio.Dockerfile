# MinIO for the compose demo and the multi-node test: the binary scripts/tools.sh
# builds for the tests from the Go module proxy at MINIO_VERSION (MinIO publishes no
# community images for new releases), on the same debootstrap root as the loader
# (shardload-base/runtime). Built by scripts/images.sh (`make images`) in a context
# that holds only the binary:
#
#   docker build -f docker/minio.Dockerfile --build-arg BASE=shardload-base/runtime:bookworm-KEY CONTEXT
#
# Runs as uid 1000 with its data in /data (a volume). The root has bash and no curl:
# the compose healthcheck asks /minio/health/live through bash's /dev/tcp.

ARG BASE=shardload-base/runtime
FROM ${BASE}
ARG MINIO_VERSION=v0.0.0-20260212201848-7aac2a2c5b7c
RUN groupadd --gid 1000 minio && \
	useradd --uid 1000 --gid 1000 --home-dir /home/minio --create-home --shell /usr/sbin/nologin minio && \
	install -d -o 1000 -g 1000 -m 0750 /data
COPY minio /usr/local/bin/minio
ENV MINIO_BROWSER=off MINIO_UPDATE=off
LABEL org.opencontainers.image.title="minio (built from source, ${MINIO_VERSION})"
USER 1000:1000
VOLUME /data
EXPOSE 9000
ENTRYPOINT ["/usr/local/bin/minio"]
CMD ["server", "/data", "--address", ":9000"]
