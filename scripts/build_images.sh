#!/usr/bin/env bash
# Build apexrl's container images with podman from the repository's Dockerfile, as they are built for a cluster,
# on a machine that reaches no image registry: only the base image argument (PYTHON_IMAGE) differs.
#
#   bash scripts/build_images.sh                    # both targets: apexrl-replay, apexrl-train
#   bash scripts/build_images.sh --target replay    # one (repeat --target for several)
#
# What it does:
#   1. The base image. $APEXRL_BASE_IMAGE (default localhost/apexrl-base:bookworm-python3.11) is used when it
#      exists; the default one is otherwise made here from Debian's packages: mmdebstrap writes a minimal Debian
#      bookworm root filesystem with python3 (3.11), python3-venv and ca-certificates into a tarball, and
#      `podman import` makes it an image (about 35 s; 176 MB). The base is given to the Dockerfile pinned by its
#      digest (PYTHON_IMAGE=NAME@sha256:...), so the label org.opencontainers.image.base.name names exactly it.
#   2. torch for the train target. With TORCH_INDEX_URL set, the Dockerfile installs TORCH_SPEC from that index
#      (its default is the CPU index, https://download.pytorch.org/whl/cpu). Without it, the image gets the very
#      wheel `pip install $APEXRL_TORCH` (scripts/setup.sh's requirement, default torch==2.13.0) resolves to on this
#      machine: a local file is mounted into the build (read-only, never part of an image) and installed by path,
#      a remote one by URL. A resolution that is not a CPU build (+cpu) is refused: it would pull CUDA.
#   3. `podman build` of each target with the OCI labels' build arguments (VERSION from pyproject.toml, REVISION
#      the commit, CREATED the commit's time, so unchanged sources reuse every cached layer, SOURCE the origin
#      remote without credentials), tagged localhost/apexrl-TARGET:VERSION and :latest (fully qualified: podman
#      would resolve a short name to any local image of that name, e.g. registry.example.com/apexrl/...); sizes.
#
# Engine settings (podman 4.3 as Debian ships it, as root): RUN steps use the host's network (never podman's
# bridge) and this machine's CA bundle, bind-mounted for the build only (pip trusts what this machine trusts, e.g.
# an intercepting proxy; nothing of it lands in an image); runc (crun fails on hybrid cgroups here) and explicit
# nofile/nproc ulimits (the defaults fail with "setrlimit: Operation not permitted"). APEXRL_OCI_RUNTIME overrides
# the runtime. Layers are cached between runs (podman's default).
set -euo pipefail
cd "$(dirname "$0")/.."

usage() { echo "usage: scripts/build_images.sh [--target replay|train]..." >&2; exit 2; }
die() { echo "build_images: $*" >&2; exit 1; }
targets=()
while [ $# -gt 0 ]; do
  case $1 in
    --target) [ $# -ge 2 ] || usage; case $2 in replay|train) targets+=("$2") ;; *) usage ;; esac; shift 2 ;;
    --target=*) case ${1#--target=} in replay|train) targets+=("${1#--target=}") ;; *) usage ;; esac; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 0 ;;
    *) usage ;;
  esac
done
[ ${#targets[@]} -gt 0 ] || targets=(replay train)

command -v podman >/dev/null 2>&1 || die "podman is not installed (Debian: apt-get install -y podman runc; scripts/setup.sh does)"
DEFAULT_BASE=localhost/apexrl-base:bookworm-python3.11
BASE=${APEXRL_BASE_IMAGE:-$DEFAULT_BASE}
MIRROR=${APEXRL_DEBIAN_MIRROR:-http://deb.debian.org/debian}
SECURITY_MIRROR=${APEXRL_DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}
VENV=${APEXRL_VENV:-.venv}
TORCH=${APEXRL_TORCH:-torch==2.13.0}
VERSION=$(sed -n 's/^version = "\(.*\)"$/\1/p' pyproject.toml | head -n 1)
TAG=${APEXRL_IMAGE_TAG:-$VERSION}
ENGINE=(--runtime "${APEXRL_OCI_RUNTIME:-runc}" --ulimit nofile=1024:1024 --ulimit nproc=1024:1024)
BUILD=(podman build "${ENGINE[@]}" --network host --layers)
CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt
[ -f "$CA_BUNDLE" ] && BUILD+=(--volume "$CA_BUNDLE:$CA_BUNDLE:ro")

seconds() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$(seconds)" 'BEGIN { printf "%.0f", b - a }'; }

# --- 1. the base image --------------------------------------------------------------------------------------------
if ! podman image exists "$BASE"; then
  [ "$BASE" = "$DEFAULT_BASE" ] || die "base image $BASE does not exist (pull or build it first)"
  command -v mmdebstrap >/dev/null 2>&1 || die "mmdebstrap is not installed (apt-get install -y mmdebstrap; scripts/setup.sh does)"
  started=$(seconds)
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  echo "build_images: making $BASE with mmdebstrap from $MIRROR (Debian bookworm, python3, python3-venv, ca-certificates)"
  # minbase: Essential and Priority required packages (with passwd: the Dockerfile's useradd) and apt; no docs,
  # man pages or translations. SOURCE_DATE_EPOCH fixes the files' times: the same package versions give the same
  # tarball.
  SOURCE_DATE_EPOCH=1735689600 mmdebstrap --quiet --variant=minbase \
      --include=python3,python3-venv,ca-certificates \
      --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
      --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/info/*' \
      --dpkgopt='path-exclude=/usr/share/locale/*' --aptopt='Acquire::Retries "3"' \
      bookworm "$work/rootfs.tar" \
      "deb $MIRROR bookworm main" "deb $MIRROR bookworm-updates main" "deb $SECURITY_MIRROR bookworm-security main" \
    || die "mmdebstrap failed (is $MIRROR reachable?)"
  podman import --quiet \
      --change 'ENV LANG=C.UTF-8' --change 'CMD ["/usr/bin/python3"]' \
      --change 'LABEL org.opencontainers.image.title="apexrl-base" org.opencontainers.image.description="Debian bookworm minbase, python3, python3-venv, ca-certificates (scripts/build_images.sh)"' \
      --message "mmdebstrap --variant=minbase bookworm (scripts/build_images.sh)" \
      "$work/rootfs.tar" "$BASE" >/dev/null
  rm -rf "$work"
  trap - EXIT
  echo "build_images: $BASE made in $(elapsed "$started") s"
fi
if [[ $BASE == *@sha256:* ]]; then
  PINNED=$BASE
else
  digest=$(podman image inspect --format '{{.Digest}}' "$BASE")
  PINNED="${BASE%:*}@$digest"
  [[ ${BASE##*/} == *:* ]] || PINNED="$BASE@$digest"
fi
echo "build_images: base $BASE pinned as $PINNED"

# --- the labels' build arguments ----------------------------------------------------------------------------------
REVISION=unknown CREATED=unknown SOURCE=unknown
if git rev-parse --git-dir >/dev/null 2>&1; then
  REVISION=$(git rev-parse HEAD)
  CREATED=$(TZ=UTC git log -1 --date=format-local:%Y-%m-%dT%H:%M:%SZ --format=%cd)
  # The remote's URL without user or token (https://user:token@host/x -> https://host/x).
  SOURCE=$(git remote get-url origin 2>/dev/null | sed -E 's#^([a-z+]+://)[^/@]*@#\1#') || true
  [ -n "$SOURCE" ] || SOURCE=unknown
  git diff --quiet HEAD -- 2>/dev/null \
    || echo "build_images: WARNING: uncommitted changes; the images say revision $REVISION all the same" >&2
fi
LABELS=(--build-arg "VERSION=$VERSION" --build-arg "REVISION=$REVISION" --build-arg "CREATED=$CREATED"
        --build-arg "SOURCE=$SOURCE" --build-arg "PYTHON_IMAGE=$PINNED")

# --- 2. torch for the train target --------------------------------------------------------------------------------
torch_args() {
  if [ -n "${TORCH_INDEX_URL:-}" ]; then
    TORCH_ARGS=(--build-arg "TORCH_INDEX_URL=$TORCH_INDEX_URL" --build-arg "TORCH_SPEC=$TORCH")
    echo "build_images: torch: $TORCH from $TORCH_INDEX_URL"
    return
  fi
  local py=$VENV/bin/python resolved version url path spec
  [ -x "$py" ] || py=python3
  resolved=$("$py" -m pip install --dry-run --ignore-installed --no-deps --quiet --report - "$TORCH" 2>/dev/null \
    | "$py" -c 'import json, sys; i = json.load(sys.stdin)["install"][0]; print(i["metadata"]["version"], i["download_info"]["url"])') \
    || die "pip could not resolve $TORCH on this machine; set TORCH_INDEX_URL (e.g. https://download.pytorch.org/whl/cpu)"
  version=${resolved%% *} url=${resolved#* }
  [[ $version == *+cpu ]] \
    || die "$TORCH resolves to torch $version here, not a CPU build; set TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu"
  if [[ $url == file://* ]]; then
    path=$("$py" -c 'import sys, urllib.parse as u; print(u.unquote(u.urlparse(sys.argv[1]).path))' "$url")
    spec=/run/apexrl-torch-wheel/$(basename "$path")
    TORCH_ARGS=(--volume "$(dirname "$path"):/run/apexrl-torch-wheel:ro")
  else
    spec=$url
    TORCH_ARGS=()
  fi
  # An empty TORCH_INDEX_URL: install.sh installs TORCH_SPEC (a path or URL) with pip's own configuration.
  TORCH_ARGS+=(--build-arg "TORCH_SPEC=$spec" --build-arg TORCH_INDEX_URL=)
  echo "build_images: torch: $TORCH resolves to torch $version here ($url); the build installs $spec"
}

# --- 3. the images ------------------------------------------------------------------------------------------------
built=()
for target in "${targets[@]}"; do
  extra=()
  if [ "$target" = train ]; then
    torch_args
    extra=("${TORCH_ARGS[@]}")
  fi
  started=$(seconds)
  echo "build_images: podman build --target $target -> apexrl-$target:$TAG"
  "${BUILD[@]}" "${LABELS[@]}" "${extra[@]}" --target "$target" \
      --tag "localhost/apexrl-$target:$TAG" --tag "localhost/apexrl-$target:latest" --file Dockerfile . \
    || die "podman build --target $target failed"
  echo "build_images: apexrl-$target:$TAG built in $(elapsed "$started") s"
  built+=("apexrl-$target:$TAG")
done

# Old build layers: any change to the sources invalidates the install steps (their COPYs come first), so each
# build of a new revision leaves about 2.5 GB of untagged layers of the previous one (the train environment, in its
# build stage and in the image). Remove this script's untagged images older than an hour (not this run's cache);
# APEXRL_KEEP_OLD_LAYERS=1 keeps them.
if [ -z "${APEXRL_KEEP_OLD_LAYERS:-}" ]; then
  for title in apexrl-base apexrl-replay apexrl-train; do
    podman image prune --force --filter "label=org.opencontainers.image.title=$title" --filter until=1h \
      >/dev/null 2>&1 || true
  done
fi

echo "build_images: done"
for image in "${built[@]}"; do
  podman image inspect --format "{{.Size}} $image {{.Id}}" "localhost/$image" \
    | awk '{ printf "  %-24s %7.0f MB  %s\n", $2, $1 / 1e6, substr($3, 1, 12) }'
done
