# A CPU trainer for the compose demo and the multi-node test: Debian's Python 3 with
# numpy (a debootstrap root, shardload-base/python) and the client package from
# client/python, with the scripts of docker/trainer. No PyTorch: the client yields
# numpy views of the slabs without it. A GPU trainer is an image of your own with
# CUDA and PyTorch and the client installed (pip install ./client/python); see
# examples/k8s.
#
# Built by scripts/images.sh (`make images`) in a context of the client package
# (python/shardload) and the scripts:
#
#   docker build -f docker/trainer.Dockerfile --build-arg BASE=shardload-base/python:bookworm-KEY CONTEXT
#
# It runs as uid 65532, the user of the shardload image: the client talks only to a
# server of its own user (or root), and the server accepts only its own user unless
# given --allow-uid. Mount the server's socket volume at /run/shardload.

ARG BASE=shardload-base/python
FROM ${BASE}
RUN groupadd --system --gid 65532 trainer && \
	useradd --system --uid 65532 --gid 65532 --home-dir /home/trainer --create-home --shell /usr/sbin/nologin trainer && \
	install -d -o 65532 -g 65532 -m 0750 /results
COPY python /opt/shardload/python
COPY *.py /opt/shardload/
ENV PYTHONPATH=/opt/shardload/python PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 \
	SHARDLOAD_SOCKET=/run/shardload/loader.sock
USER 65532:65532
WORKDIR /home/trainer
ENTRYPOINT ["python3"]
CMD ["-c", "import shardload, numpy; print('shardload client', shardload.__version__, 'numpy', numpy.__version__)"]
