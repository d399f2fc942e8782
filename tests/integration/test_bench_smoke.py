"""Both benchmarks run end to end in their quick modes (real shard processes, the real learner) and report
every figure with a positive value. No speed is asserted: speed is measured in bench/, never in tests."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"

INSERT_SHAPES = [f"{w}_{rows}" for w in ("cartpole", "atari") for rows in (64, 256)]
# Every gRPC figure and the raw-gRPC ceiling it is compared with (grpc_cycle has none).
COMPARED = {
    **{f"grpc_insert_{s}": f"ceiling_stream_{s}" for s in INSERT_SHAPES},
    "grpc_sample": "ceiling_unary_sample",
    "grpc_sample_window": "ceiling_unary_sample_window",
    "grpc_update": "ceiling_unary_update",
    "grpc_update_window": "ceiling_unary_update_window",
    "grpc_update_stream": "ceiling_stream_update",
    # 4 batches per Sample answer (--sample-batches), in batches/s: the ceiling is calls/s x 4
    "grpc_sample_multi": "ceiling_grpc_sample_multi",
    "grpc_sample_multi_window": "ceiling_grpc_sample_multi_window",
}
# Pixel figures (real Pong frames): bytes per stored transition are read from the shards, not timed.
PIXEL_BYTES = {f"pixels_bytes_{kind}" for kind in ("raw", "zstd", "lz4")}
PIXEL_FIGURES = {
    "pixels_compress_zstd",
    "pixels_compress_lz4",
    "pixels_decompress_256",
    "pixels_data_path_raw",
    "pixels_data_path_zstd",
    *(f"pixels_insert_{kind}_{rows}" for kind in ("raw", "zstd") for rows in (64, 256)),
    *PIXEL_BYTES,
}
REPLAY_FIGURES = {
    *COMPARED,
    *COMPARED.values(),
    *(f"ceiling_acked_{s}" for s in INSERT_SHAPES),
    "grpc_cycle",
    "aio_ceiling_unary_sample",  # the same shapes on grpc.aio, the shard's runtime (informational)
    "aio_ceiling_unary_sample_window",
    "aio_ceiling_bidi_update",
    "tree_update",
    "tree_sample",
    "table_sample",
    "table_update",
    "table_cycle",
    *(f"table_insert_{s}" for s in INSERT_SHAPES),
    *PIXEL_FIGURES,
}


def run_quick(script: str, tmp_path: Path) -> dict:
    out = tmp_path / f"{script}.json"
    proc = subprocess.run(
        [sys.executable, str(BENCH / script), "--quick", "--json", str(out)],
        timeout=120,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.mark.timeout(150)
def test_replay_bench_quick_mode_reports_every_figure(tmp_path):
    data = run_quick("replay_bench.py", tmp_path)
    figures = data["figures"]
    assert set(figures) == REPLAY_FIGURES
    for key, f in figures.items():
        assert f["value"] > 0, key
        if key in PIXEL_BYTES:  # compared with raw rows, and under the 2,000 B target when compressed
            assert f["ceiling_name"] == "raw" and (key == "pixels_bytes_raw" or f["met"]), key
            continue
        assert f["calls"] > 0 and f["seconds"] > 0, key
        assert f["client_cpu"] is not None and f["client_cpu"] > 0, key
    # Every apexrl figure over gRPC is reported next to its raw-gRPC ceiling, as a ratio.
    for key, ceiling in COMPARED.items():
        f = figures[key]
        # to transitions/s, or to batches/s
        rows = (
            int(key.rsplit("_", 1)[1])
            if key.startswith("grpc_insert_")
            else 4
            if key.startswith("grpc_sample_multi")
            else 1
        )
        assert f["ceiling"] == pytest.approx(figures[ceiling]["value"] * rows) and f["ceiling"] > 0, key
        assert f["ratio"] == f["value"] / f["ceiling"] and f["ceiling_name"], key
        assert f["server_cpu"] > 0, key
    assert data["fill_rows_per_s"] is None or data["fill_rows_per_s"] > 0  # None: the inserts filled it
    assert data["meta"]["grpcio"] and len(data["load_average_1min"]) == 2


@pytest.mark.timeout(150)
def test_learner_bench_quick_mode_reports_every_figure(tmp_path):
    data = run_quick("learner_bench.py", tmp_path)
    assert data["contents"]["identical"] and data["contents"]["same_first_batch"]
    phases = data["phases"]
    assert [p["mode"] for p in phases] == ["grpc", "grpc-thread", "inprocess", "reference"]
    for p in phases:
        assert p["updates"] > 0 and p["updates_per_s"] > 0 and p["seconds"] > 0, p["mode"]
        assert p["train_step_ms"] > 0 and p["learner_cpu_s"] > 0, p["mode"]
        assert len(p["shard_cpu_s"]) == 2
    assert all(
        cpu > 0 for p in phases[:2] for cpu in p["shard_cpu_s"]
    )  # the gRPC phases kept both shards busy
    summary = data["summary"]
    assert set(summary["per_mode"]) == {"grpc", "grpc-thread", "inprocess", "reference"}
    for mode, m in summary["per_mode"].items():
        assert m["updates_per_s"] > 0 and m["learner_cpu_ms_per_update"] > 0, mode
    assert summary["ratio"] > 0 and len(summary["round_ratios"]) == 1
    assert set(summary["share_of_reference"]) == {"grpc", "grpc-thread", "inprocess"}
    assert data["meta"]["torch"] and data["fill_seconds"] > 0


@pytest.mark.timeout(240)
def test_sequence_insert_ab_quick_mode_measures_every_configuration(tmp_path):
    data = run_quick("sequence_insert_ab.py", tmp_path)
    medians = data["medians"]
    assert len(medians) == 4 and sum(name.startswith("baseline") for name in medians) == 1
    for name, m in medians.items():
        assert m["items_per_s"] > 0 and m["writer_us_per_item"] > 0 and m["shard_us_per_item"] > 0, name
    assert all(len(runs) == 2 for runs in data["rounds"].values())


@pytest.mark.timeout(150)
def test_sequence_throughput_quick_mode_reports_every_figure(tmp_path):
    data = run_quick("sequence_throughput.py", tmp_path)
    figures = data["figures"]
    assert set(figures) == {
        "insert_items",
        "sample_blocking",
        "sample_learner_draw",
        "learner_process",
        "learner_thread",
        "learner_reference",
    }
    for key, f in figures.items():
        assert f["value"] > 0 and f["calls"] > 0 and f["seconds"] > 0, key
        assert f["client_cpu"] > 0 and f["server_cpu"] is not None, key
    for key in ("insert_items", "sample_blocking", "sample_learner_draw"):
        assert figures[key]["target"] is not None and figures[key]["met"] is not None, key
    for key in ("learner_process", "learner_thread"):  # fed / sampling-free, measured in the same run
        f = figures[key]
        assert (
            f["ceiling"] == figures["learner_reference"]["value"] and f["ratio"] == f["value"] / f["ceiling"]
        )
    assert [p["feed"] for p in data["learner_phases"]] == ["process", "thread", "reference"]
    assert data["metadata"]["grpcio"]


@pytest.mark.timeout(120)
def test_writers_bench_reports_throughput_and_latency_per_writer_count(tmp_path):
    out = tmp_path / "writers.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(BENCH / "writers_bench.py"),
            "--writers",
            "1",
            "8",
            "--seconds",
            "1",
            "--json",
            str(out),
        ],
        timeout=100,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(out.read_text())["results"]
    assert [r["writers"] for r in results] == [1, 8]
    for r in results:
        assert r["rows_per_s"] > 0 and r["batches"] > 0 and r["sample_calls"] > 0
        assert r["sample_p99_ms"] > 0 and r["info_p99_ms"] > 0


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_solve_race_quick_mode_times_the_default_launch(tmp_path):
    """The apexrl half of bench/solve_race.py (the SB3 half needs its own venv, ~30 s to create: run by hand)."""
    out = tmp_path / "race.json"
    proc = subprocess.run(
        [sys.executable, str(BENCH / "solve_race.py"), "--quick", "--systems", "apexrl", "--json", str(out)],
        timeout=220,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads(out.read_text())
    (run,) = data["runs"]
    # Learning itself is the local-fleet test's job; here the race must run the launch and report it.
    assert run["system"] == "apexrl" and run["seconds"] > 0 and run["env_steps"] > 1000, run
    assert data["summary"]["apexrl"]["median_seconds"] == run["seconds"]
    assert "apexrl median" in proc.stdout and "Load average" in proc.stdout


@pytest.mark.timeout(150)
def test_checkpoint_bench_quick_mode_reports_every_figure(tmp_path):
    data = run_quick("checkpoint_bench.py", tmp_path)
    assert [p["pace_mb_per_s"] for p in data["paces"]] == [200.0, 0.0]
    for part in data["paces"]:
        for phase in ("baseline", "checkpointing"):
            figures = part[phase]
            assert figures["insert_rows_per_s"] > 0 and figures["insert_max_ack_gap_ms"] > 0, phase
            for call in ("insert", "sample", "update"):
                assert figures[f"{call}_calls"] > 0 and figures[f"{call}_max_ms"] > 0, (phase, call)
        assert part["checkpoints"] and all(
            c["bytes"] > 0 and c["rows"] == data["capacity"] for c in part["checkpoints"]
        )
    assert data["restore"]["rows"] == data["capacity"] and data["restore"]["restore_s"] >= 0
    assert data["wal"]["with_rows_per_s"] > 0 and data["wal"]["without_rows_per_s"] > 0


@pytest.mark.timeout(150)
def test_scaling_model_quick_mode_measures_every_cost_and_models_every_shard_count(tmp_path):
    out = tmp_path / "scaling.json"
    proc = subprocess.run(
        [sys.executable, str(BENCH / "scaling_model.py"), "--quick", "--json", str(out)],
        timeout=120,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads(out.read_text())
    costs = data["costs"]
    assert costs["insert_row"] > 0 and costs["train_step"] > 0
    for name in ("sample", "sample_client", "update"):
        fixed, per_row = costs[name]
        assert fixed >= 0 and per_row >= 0 and fixed + per_row > 0, name
    assert [r["shards"] for r in data["model"]] == [1, 2, 4, 8]
    for r in data["model"]:
        assert r["updates_per_s"] == min(r["bounds"].values()) > 0 and r["bound"] in r["bounds"]
    assert "MODEL (not a measurement)" in proc.stdout


def test_the_dqn_digest_runs_and_is_reproducible():
    """bench/dqn_digest.py compares checkouts bit for bit: it must run, name the checkout it imported (this one),
    and give the same lines twice."""
    runs = [
        subprocess.run(
            [sys.executable, str(BENCH / "dqn_digest.py")], timeout=120, capture_output=True, text=True
        )
        for _ in range(2)
    ]
    assert all(r.returncode == 0 for r in runs), runs[0].stderr[-3000:]
    lines = runs[0].stdout.splitlines()
    assert [line.split(":")[0] for line in lines] == ["code", "learner", "actor", "pixel learner"]
    assert lines[0] == f"code: {BENCH.parent}" and runs[1].stdout == runs[0].stdout


def test_the_dpg_digest_runs_and_is_reproducible():
    """bench/dpg_digest.py, dqn_digest.py's twin for Ape-X DPG: the same checks."""
    runs = [
        subprocess.run(
            [sys.executable, str(BENCH / "dpg_digest.py")], timeout=120, capture_output=True, text=True
        )
        for _ in range(2)
    ]
    assert all(r.returncode == 0 for r in runs), runs[0].stderr[-3000:]
    lines = runs[0].stdout.splitlines()
    assert [line.split(":")[0] for line in lines] == ["code", "learner", "actor"]
    assert lines[0] == f"code: {BENCH.parent}" and runs[1].stdout == runs[0].stdout


@pytest.mark.timeout(150)
def test_access_bench_quick_mode_measures_both_modes(tmp_path):
    data = run_quick("access_bench.py", tmp_path)
    assert len(data["medians"]) == 3 and next(iter(data["medians"])).startswith("baseline ")
    for mode in data["medians"]:
        assert set(data["medians"][mode]) == {"insert rows/s", "sample(256)/s", "update(256)/s"}
        assert all(value > 0 for value in data["medians"][mode].values()), data["medians"]


@pytest.mark.timeout(150)
def test_startup_bench_times_every_role_of_a_launch_and_a_restart(tmp_path):
    """bench/startup_bench.py on this checkout alone (a baseline commit doubles the time): every role's process
    start and its ready milestone, the fleet's first environment step, and a killed shard back."""
    out = tmp_path / "startup.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(BENCH / "startup_bench.py"),
            "--quick",
            "--restart",
            "shard-0",
            "--json",
            str(out),
        ],
        timeout=120,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run,) = json.loads(out.read_text())["runs"]["this checkout"]
    ready = {"shard": "serving", "learner": "serving", "actor": "first step", "evaluator": "weights"}
    assert {role.split("-")[0] for role in run["roles"]} == set(ready), run["roles"]
    for role, marks in run["roles"].items():
        assert 0 < marks["process"] < marks[ready[role.split("-")[0]]], (role, marks)
        assert run["cpu_seconds_at_ready"][role] > 0, role
    assert 0 < run["first_step"] <= run["all_ready"] and run["first_episode"] > 0
    assert run["launcher"]["roles started"] > 0 and run["restart_seconds"]["shard-0"] > 0
    assert "first env step" in proc.stdout and "Load average" in proc.stdout


def test_r2d2_burn_in_bench_runs_both_variants(tmp_path):
    """bench/r2d2_burn_in.py --quick: one short R2D2 launch with the burn-in's gradient stopped and one without,
    each reported (learning is the benchmark's, run by hand; here both launches must run and report)."""
    out = tmp_path / "burn_in.json"
    proc = subprocess.run(
        [sys.executable, str(BENCH / "r2d2_burn_in.py"), "--quick", "--json", str(out)],
        timeout=240,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = json.loads(out.read_text())
    assert [r["variant"] for r in runs] == ["stop", "no-stop"]
    assert all(r["env_steps"] > 0 and r["wall_seconds"] > 0 for r in runs), runs
    assert "median wall" in proc.stdout


def test_r2d2_update_bench_times_both_unrolls_and_breaks_one_update_down():
    """bench/r2d2_update.py, one short round: both unrolls timed, their medians and each phase of an update."""
    proc = subprocess.run(
        [
            sys.executable,
            str(BENCH / "r2d2_update.py"),
            "--rounds",
            "1",
            "--seconds",
            "0.3",
            "--breakdown-calls",
            "2",
        ],
        timeout=240,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "round 1 fused" in proc.stdout and "round 1 stepwise" in proc.stdout, proc.stdout
    assert "median: fused" in proc.stdout, proc.stdout
    for phase in ("online", "target", "backward", "clip+adam"):
        assert phase in proc.stdout, (phase, proc.stdout)
