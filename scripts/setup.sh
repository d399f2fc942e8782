#!/usr/bin/env bash
# Create .venv (or reuse it) and install apexrl with everything needed to train and test.
#   bash scripts/setup.sh           # train + atari + mujoco + box2d + render + video + onnx + gym26 + dev +
#                                   # monitoring extras
#   APEXRL_EXTRAS=train bash scripts/setup.sh
# torch is pinned to the CPU build first: a plain 'torch' requirement would otherwise pull a multi-GB CUDA build.
# Set APEXRL_TORCH to choose another torch requirement (e.g. a CUDA build on a GPU machine).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${APEXRL_VENV:-.venv}
EXTRAS=${APEXRL_EXTRAS:-train,atari,mujoco,box2d,render,video,onnx,gym26,dev,monitoring}
TORCH=${APEXRL_TORCH:-torch==2.13.0}

if [ ! -x "$VENV/bin/python" ]; then
  echo "setup: creating $VENV"
  python3 -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip install --quiet --disable-pip-version-check)
echo "setup: installing $TORCH"
"${PIP[@]}" "$TORCH" 2>&1 | grep -v "^WARNING: Location" || true
"$VENV/bin/python" -c "import torch" 2>/dev/null || { echo "setup: torch failed to install" >&2; exit 1; }
echo "setup: installing apexrl[$EXTRAS] (editable)"
"${PIP[@]}" -e ".[$EXTRAS]" 2>&1 | grep -v "^WARNING: Location" || true
"$VENV/bin/python" -c "import apexrl.replay_server, apexrl.actor, apexrl.learner" \
  || { echo "setup: apexrl failed to install" >&2; exit 1; }
# Prometheus (promtool and the server) for monitoring/'s rule tests and tests/e2e/test_prometheus.py: Debian's
# package, best effort (those tests skip without it; the rest of the suite does not need it).
if ! command -v promtool >/dev/null 2>&1; then
  if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    echo "setup: installing Debian's prometheus package (promtool, prometheus)"
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus; } \
      >/dev/null 2>&1 || echo "setup: WARNING: apt-get install prometheus failed; the Prometheus tests will skip" >&2
  else
    echo "setup: WARNING: promtool not found (Debian: apt-get install prometheus); the Prometheus tests will skip" >&2
  fi
fi
# A container engine for tests/integration/containers/ (images built by scripts/build_images.sh, run as pods would
# run them, the manifests through `podman kube play`): Debian's podman with runc (crun fails on hybrid cgroups),
# catatonit (the pods' pause image) and mmdebstrap (the base image). Best effort: without podman those tests skip
# (under CI=true they fail).
if ! { command -v podman && command -v runc && command -v catatonit && command -v mmdebstrap; } >/dev/null 2>&1; then
  if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    echo "setup: installing Debian's podman, runc, catatonit, mmdebstrap (container tests)"
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq podman runc catatonit mmdebstrap; } \
      >/dev/null 2>&1 || echo "setup: WARNING: apt-get install podman runc catatonit mmdebstrap failed; the container tests will skip" >&2
  else
    echo "setup: WARNING: podman not found (Debian: apt-get install podman runc catatonit mmdebstrap); the container tests will skip" >&2
  fi
fi
# The other tools the tests run (under CI=true a test that skips for want of one fails, tests/allowed_skips.py):
# ip (network namespaces), systemd-analyze and systemd-sysusers (the deploy examples), node and npm (the Node.js
# client). Debian's packages, best effort. kubectl (k8s/ rendered by kustomize) has no recent Debian package: the
# machine must bring it (1.27 or newer).
missing=()
for tool in ip:iproute2 systemd-analyze:systemd node:nodejs npm:npm; do  # systemd-sysusers: in systemd
  command -v "${tool%%:*}" >/dev/null 2>&1 || missing+=("${tool#*:}")
done
if [ ${#missing[@]} -gt 0 ]; then
  if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    echo "setup: installing Debian's ${missing[*]}"
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"; } \
      >/dev/null 2>&1 || echo "setup: WARNING: apt-get install ${missing[*]} failed; the tests that need them skip (fail under CI=true)" >&2
  else
    echo "setup: WARNING: not found: ${missing[*]} (Debian packages); the tests that need them skip (fail under CI=true)" >&2
  fi
fi
command -v kubectl >/dev/null 2>&1 \
  || echo "setup: WARNING: kubectl not found; the k8s/ tests skip (fail under CI=true)" >&2
# The Node.js reference client (examples/node) is run by tests/integration/test_node_client.py.
if command -v npm >/dev/null 2>&1; then
  echo "setup: installing the Node.js reference client's packages (examples/node)"
  npm ci --prefix examples/node --no-audit --no-fund --silent \
    || { echo "setup: npm ci in examples/node failed" >&2; exit 1; }
else
  echo "setup: WARNING: npm not found; install Node.js >= 18 and run 'npm ci --prefix examples/node'," \
    "or tests/integration/test_node_client.py fails" >&2
fi
echo "setup: done ($("$VENV/bin/python" -c 'import torch, grpc, numpy; print(f"torch {torch.__version__}, grpcio {grpc.__version__}, numpy {numpy.__version__}")'))"
