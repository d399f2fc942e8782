#!/bin/sh
# Install apexrl into PREFIX, a virtual environment (created when missing). This is the container image's only
# install step: the Dockerfile runs it in its build stages, and tests/integration/deploy/test_image_recipe.py runs
# it into a fresh prefix and starts the entry points from there, so the recipe is exercised without an engine.
#
#   sh docker/install.sh replay PREFIX [SOURCE]   the core install only (numpy, grpcio, ...): replay shards, SDK
#   sh docker/install.sh train  PREFIX [SOURCE]   + torch, gymnasium (MuJoCo too), matplotlib: actors, learner, launcher
#   sh docker/install.sh --dependencies TARGET PREFIX [SOURCE]
#                                                 what TARGET needs but apexrl itself, read from SOURCE/pyproject.toml
#                                                 alone: the Dockerfile's first layer, so that a change of the source
#                                                 rebuilds only the layer that installs apexrl (seconds), not torch
#
# SOURCE is the apexrl source tree (default: the folder above this script). Environment:
#   TORCH_SPEC       torch requirement of the train target (default torch==2.13.0)
#   TORCH_INDEX_URL  index torch is installed from (default the CPU-only index, so no CUDA build is pulled;
#                    empty: pip's own configuration). A CUDA image: TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128
#   PYTHON           interpreter that creates the environment (default python3)
#   PIP_ARGS         extra arguments for every pip install (the tests pass --no-compile: bytecode is the one thing
#                    they skip, to save minutes of CPU; images keep it, their root filesystem is read-only)
set -eu

usage() { echo "usage: install.sh [--dependencies] replay|train PREFIX [SOURCE]" >&2; exit 2; }
only_dependencies=0
if [ "${1:-}" = --dependencies ]; then
    only_dependencies=1
    shift
fi
[ $# -ge 2 ] || usage
target=$1
prefix=$2
source_dir=${3:-$(cd "$(dirname "$0")/.." && pwd)}
torch_spec=${TORCH_SPEC:-torch==2.13.0}
torch_index=${TORCH_INDEX_URL-https://download.pytorch.org/whl/cpu}
case $target in replay|train) ;; *) usage ;; esac

[ -x "$prefix/bin/python" ] || "${PYTHON:-python3}" -m venv "$prefix"
prefix=$(cd "$prefix" && pwd)
py=$prefix/bin/python
pip_args=${PIP_ARGS:-}
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1

if [ "$target" = train ]; then
    # torch first, from its own index: a plain 'torch' requirement from PyPI is the multi-GB CUDA build.
    if [ -n "$torch_index" ]; then
        "$py" -m pip install --quiet $pip_args --index-url "$torch_index" "$torch_spec"
    else
        "$py" -m pip install --quiet $pip_args "$torch_spec"
    fi
fi
extras=
[ "$target" = train ] && extras=train,mujoco
if [ "$only_dependencies" = 1 ]; then
    # The requirements of apexrl[$extras] from pyproject.toml (its own extras, such as apexrl[compression], expanded),
    # one per line; pip installs them as it would for apexrl, which is then installed over them.
    "$py" - "$source_dir/pyproject.toml" "$extras" > "$prefix/apexrl-requirements.txt" <<'PY'
import sys, tomllib

project = tomllib.load(open(sys.argv[1], "rb"))["project"]
name, optional = project["name"], project.get("optional-dependencies", {})
wanted, seen, requirements = [e for e in sys.argv[2].split(",") if e], set(), list(project["dependencies"])
while wanted:
    extra = wanted.pop()
    if extra in seen:
        continue
    seen.add(extra)
    for requirement in optional[extra]:
        if requirement.startswith(name + "["):
            wanted += requirement[len(name) + 1 : requirement.index("]")].split(",")
        else:
            requirements.append(requirement)
print("\n".join(dict.fromkeys(requirements)))
PY
    "$py" -m pip install --quiet $pip_args --requirement "$prefix/apexrl-requirements.txt"
    rm "$prefix/apexrl-requirements.txt"
    echo "install.sh: the dependencies of apexrl ($target) installed in $prefix"
    exit 0
fi
"$py" -m pip install --quiet $pip_args "$source_dir${extras:+[$extras]}"

# Check what was installed: the replay image must not carry torch or gymnasium (checked by the module finder,
# without importing anything heavy), the train image must import both; both must run the CLI. From the prefix, not
# the source tree: `python -c` puts the working directory first on sys.path, where SOURCE's own apexrl/ folder (the
# public API's __init__.py alone) would hide the installed package's subpackages.
cd "$prefix"
if [ "$target" = replay ]; then
    "$py" -c 'import importlib.util as u, sys; extra = [m for m in ("torch", "gymnasium") if u.find_spec(m)]; sys.exit(f"replay install carries {extra}" if extra else 0)'
else
    "$py" -c 'import torch, gymnasium, apexrl.learner.learner, apexrl.actor.apex_actor'
fi
"$prefix/bin/apexrl" --help >/dev/null
echo "install.sh: apexrl ($target) installed in $prefix"
