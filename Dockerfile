# syntax=docker/dockerfile:1
# apexrl container images: one recipe, two targets.
#
#   docker build --target replay -t REGISTRY/apexrl-replay:0.1.0 .   # replay shards (and the SDK): no torch
#   docker build --target train  -t REGISTRY/apexrl-train:0.1.0 .    # actors, learner, launcher: CPU torch
#   docker build --target train --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128 \
#       -t REGISTRY/apexrl-train:0.1.0-cuda .                        # the GPU learner (k8s/components/gpu-learner)
#
# Every install step lives in docker/install.sh, which the test suite also runs into a fresh prefix
# (tests/integration/deploy/test_image_recipe.py), so the recipe is exercised where no engine can build it.
# scripts/build_images.sh builds both targets with podman from this file, unchanged but for PYTHON_IMAGE (a Debian
# base it makes where no registry is reachable; tests/integration/containers/ run the images).
# Build, push and deploy: docs/deploy-kubernetes.md.

# Pin the base by digest for a release (PYTHON_IMAGE=python:3.11-slim-bookworm@sha256:...; docs/deploy-kubernetes.md
# says how to find it): the label org.opencontainers.image.base.name then names exactly the base used.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS base
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# What the dependencies are read from: pyproject.toml and the install script, nothing else, so that the layers
# installing them (torch: minutes) are rebuilt only when pyproject.toml changes, not with every change of the source.
FROM base AS requirements
WORKDIR /src
COPY pyproject.toml ./
COPY docker/install.sh docker/install.sh

# The source, and nothing else: what `pip install .` needs (see .dockerignore for what never enters the context).
FROM requirements AS source
COPY README.md ./
COPY protos/apexrl/proto/ protos/apexrl/proto/
COPY apexrl/ apexrl/
COPY common/ common/
COPY replay_server/ replay_server/
COPY parameter_server/ parameter_server/
COPY actor/ actor/
COPY learner/ learner/
COPY algorithms/ algorithms/
COPY launcher/ launcher/

# A virtual environment in /opt/apexrl holding apexrl's core dependencies only: first those (from pyproject.toml),
# then apexrl itself over them.
FROM requirements AS dependencies-replay
RUN sh docker/install.sh --dependencies replay /opt/apexrl /src

FROM dependencies-replay AS build-replay
COPY --from=source /src /src
RUN sh docker/install.sh replay /opt/apexrl /src

# The same plus torch (CPU build unless TORCH_INDEX_URL names another index), gymnasium and matplotlib.
# install.sh reads both build arguments from the environment.
FROM requirements AS dependencies-train
ARG TORCH_SPEC=torch==2.13.0
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
RUN sh docker/install.sh --dependencies train /opt/apexrl /src

FROM dependencies-train AS build-train
COPY --from=source /src /src
RUN sh docker/install.sh train /opt/apexrl /src

# What both images share: a fixed non-root user (Kubernetes pods run as 10001 with a read-only root filesystem;
# its home is /tmp, the one writable place), the environment on PATH, `apexrl` as the entry point.
FROM base AS runtime
ARG PYTHON_IMAGE
ARG VERSION=0.1.0
ARG REVISION=unknown
ARG CREATED=unknown
ARG SOURCE=unknown
RUN groupadd --system --gid 10001 apexrl \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /tmp --shell /usr/sbin/nologin apexrl
ENV PATH=/opt/apexrl/bin:$PATH
LABEL org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}" \
      org.opencontainers.image.source="${SOURCE}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.base.name="${PYTHON_IMAGE}"
WORKDIR /tmp
USER 10001:10001
ENTRYPOINT ["apexrl"]
CMD ["--help"]

FROM runtime AS replay
COPY --from=build-replay /opt/apexrl /opt/apexrl
LABEL org.opencontainers.image.title="apexrl-replay" \
      org.opencontainers.image.description="apexrl replay shard (apexrl replay) and parameter service; no torch"
# gRPC ReplayService, Prometheus /metrics
EXPOSE 7000 9000

FROM runtime AS train
COPY --from=build-train /opt/apexrl /opt/apexrl
LABEL org.opencontainers.image.title="apexrl-train" \
      org.opencontainers.image.description="apexrl learner (with its parameter service), actors, evaluator, launcher"
# learner's parameter service (gRPC), learner /metrics, actor /metrics
EXPOSE 7200 9200 9300
