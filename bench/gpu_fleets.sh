#!/usr/bin/env bash
# Two bounded fleets side by side on one GPU machine (issue 15's GPU figures): HalfCheetah-v5 (Ape-X DPG) and
# ALE/Pong-v5 (Ape-X DQN), each `apexrl launch` with its defaults but --num-actors, each pinned to half the cores
# (taskset), both learners on the one GPU (--device auto picks CUDA). Each fleet is bench/fleet_run.py: frames/s,
# learner updates/s, wall time and the greedy return over time, as a table and a JSON file.
#
#   bash bench/gpu_fleets.sh OUT_DIR [MAX_SECONDS] [ACTORS_PER_FLEET]      # defaults: 420 s, 5 actors
#
# Needs python3 with torch (CUDA), and apexrl with its train, atari and mujoco extras importable; where they are not
# installed, wheels in .whl/ (the apexrl wheel among them) are installed to /tmp/site first. Stops early, with the
# fleets' logs, when the GPU or an environment is missing or a learner has not trained 150 s after its launch
# (REQUIRE_CUDA=0 lets it run on CPUs alone: a dry run of the script itself).
set -uo pipefail
out=${1:?usage: gpu_fleets.sh OUT_DIR [MAX_SECONDS] [ACTORS_PER_FLEET]}
max_seconds=${2:-420}
actors=${3:-5}
mkdir -p "$out"
out=$(cd "$out" && pwd)
export PYTHONUNBUFFERED=1
if [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        || exit 1
    export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH
fi
bench=$(cd "$(dirname "$0")" && pwd)
cd /tmp || exit 1  # the repository's own apexrl/ folder would shadow the installed package
python3 - <<'EOF' || exit 1
import torch, gymnasium
from apexrl.common.environments import make_env
import os
if os.environ.get("REQUIRE_CUDA", "1") == "1":
    assert torch.cuda.is_available(), "no CUDA device"
    print("torch", torch.__version__, torch.cuda.get_device_name(0))
for env_id in ("HalfCheetah-v5", "ALE/Pong-v5"):
    env = make_env(env_id)
    print(env_id, env.observation_space.shape, env.action_space)
    env.close()
EOF
cores=$(nproc)
half=$((cores / 2))
smi=
if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv -l 10 >"$out/gpu.csv" 2>&1 &
    smi=$!
fi
run_fleet() {  # name env cpu-list
    taskset -c "$3" python3 "$bench/fleet_run.py" --env "$2" --max-seconds "$max_seconds" --num-actors "$actors" \
        --run-dir "/tmp/run-$1" --json "$out/$1.json" >"$out/$1.txt" 2>"$out/$1.progress.txt"
}
run_fleet halfcheetah HalfCheetah-v5 "0-$((half - 1))" &
cheetah=$!
run_fleet pong ALE/Pong-v5 "$half-$((cores - 1))" &
pong=$!
# A learner that has not trained 150 s in means a broken fleet: stop both, keep the logs, spend no more GPU time.
trained() {
    python3 - <<'EOF'
import csv, sys
for run in ("halfcheetah", "pong"):
    try:
        with open(f"/tmp/run-{run}/progress.csv", newline="") as f:
            rows = list(csv.DictReader(f))
    except OSError:
        sys.exit(1)
    if not rows or not float(rows[-1]["updates"] or 0):
        sys.exit(1)
EOF
}
ok=0
for _ in $(seq 30); do
    sleep 5
    if trained; then
        ok=1
        break
    fi
done
if [ "$ok" = 0 ]; then
    echo "a learner had not trained 150 s in: stopping both fleets" >&2
    pkill -TERM -f "apexrl.launcher launch"  # each launcher stops its roles and prints its JSON line
fi
wait $cheetah
cheetah_rc=$?
wait $pong
pong_rc=$?
[ -n "$smi" ] && kill "$smi" 2>/dev/null
for run in halfcheetah pong; do
    tar -czf "$out/$run-logs.tgz" -C /tmp "run-$run/logs" "run-$run/progress.csv" "run-$run/episodes.csv" \
        "run-$run/config.json" 2>/dev/null
    echo "== $run"
    cat "$out/$run.txt"
done
echo "exit: halfcheetah $cheetah_rc, pong $pong_rc"
