# syntax=docker/dockerfile:1
#
# A CPU trainer for the examples: Python with PyTorch, the shardload client and
# examples/train.py. Built from the repository root (its own ignore file,
# trainer.Dockerfile.dockerignore, sends only client/python and examples/train.py):
#
#   docker build -f docker/trainer.Dockerfile -t shardload-trainer .
#
# It runs as uid 65532, the user of the shardload image: the client talks only to a
# server of its own user (or root), and the server accepts only its own user unless
# given --allow-uid. Mount the server's socket directory at /run/shardload; /ckpt is
# the trainer's (a volume mounted there starts owned by it) for --checkpoint.

ARG PYTHON_VERSION=3.12
FROM python:${PYTHON_VERSION}-slim
ARG TORCH_VERSION=2.8.0
RUN pip install --no-cache-dir --index-url https://download.pytorch.org/whl/cpu "torch==${TORCH_VERSION}" && \
	pip install --no-cache-dir numpy
COPY client/python /tmp/shardload-client
RUN pip install --no-cache-dir /tmp/shardload-client && rm -rf /tmp/shardload-client && \
	groupadd --system --gid 65532 trainer && \
	useradd --system --uid 65532 --gid 65532 --home-dir /home/trainer --create-home trainer && \
	install -d -o 65532 -g 65532 -m 0750 /ckpt
COPY --chmod=0755 examples/train.py /usr/local/bin/train.py
ENV SHARDLOAD_SOCKET=/run/shardload/loader.sock PYTHONUNBUFFERED=1
USER 65532:65532
WORKDIR /home/trainer
ENTRYPOINT ["python3", "/usr/local/bin/train.py"]
