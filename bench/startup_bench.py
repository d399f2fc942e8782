"""Start-up of the default `apexrl launch`: per role, the seconds from the launch to its process starting, to serving
(shards, learner), to its first weights (actors, evaluator) and to its first environment step (actors), and the
fleet's time to its first environment step; optionally how long a killed role takes to be back; this checkout
alone, or against another commit, alternating, in one run.

    .venv/bin/python bench/startup_bench.py                              # this checkout, 3 launches, ~1 minute
    .venv/bin/python bench/startup_bench.py --baseline HEAD --rounds 5   # the working tree against its last commit
    .venv/bin/python bench/startup_bench.py --restart learner shard-0    # + each killed once (SIGKILL) when ready
    .venv/bin/python bench/startup_bench.py --quick                      # smoke run: 1 launch

Each launch is `python -m apexrl.launcher launch --env ENV --seed 0` with every other default, in a temporary run
directory, started from a directory without an apexrl/ folder (the baseline's code comes first on PYTHONPATH:
harness/baseline.py). Once every role is ready (shards and learner: serving; exploring actors: first environment
step; evaluator: first weights; at most `--bound` seconds) it waits up to `--settle` seconds for the milestones past
that (actors that act before their first weights: the weights), then stops the launch (SIGTERM). How each instant is observed
(bench/startup_watch.py): process start from /proc; milestones from the role's own log line, stamped when it
reaches its log (polled every 20 ms); the first episode from the actors' episodes CSVs. The launcher's stderr lines
("started N roles", "learner serving") are stamped as they arrive. With `--restart ROLE`, once the launch is ready
ROLE is killed with SIGKILL and timed until its ready line comes again (the launcher's restart backoff, 1 s for a
first restart, included). The table gives the median over rounds per side and the ratio this checkout / baseline.
Start-up is CPU-bound on a small machine: run it idle (the footer gives the load average).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness.baseline import ROOT, baseline_pythonpath, describe, imported_from  # noqa: E402
from harness.report import load_line, metadata, progress, render_table, write_json  # noqa: E402
from startup_watch import READY, LaunchWatcher, kind_of  # noqa: E402

NEW = "this checkout"


def launch_argv(env: str, run_dir: Path, max_seconds: float, extra: list[str]) -> list[str]:
    """`apexrl launch` with its defaults, `extra` flags (each text split on spaces) appended."""
    return [
        sys.executable,
        "-m",
        "apexrl.launcher",
        "launch",
        "--env",
        env,
        "--seed",
        "0",
        "--max-seconds",
        str(max_seconds),
        "--run-dir",
        str(run_dir),
        *(a for text in extra for a in text.split()),
    ]


def one_launch(side: str, round_: int, env: dict[str, str], args, workdir: Path) -> dict:
    """Launch, wait until ready (or the bound), time the restarts asked for, stop; the figures of this launch."""
    run_dir = workdir / f"{side.replace(' ', '-')}-{round_}"
    extra = [*args.arg, *(args.new_arg if side == NEW else [])]
    max_seconds = args.bound + 30 * (1 + len(args.restart))
    watcher = LaunchWatcher(launch_argv(args.env, run_dir, max_seconds, extra), run_dir, env, str(workdir))
    try:
        ready = watcher.wait(watcher.ready, args.bound)
        if (
            ready
        ):  # the milestones past being ready (actors acting before their weights: the weights), if they come
            watcher.wait(watcher.complete, time.time() - watcher.watch.t0 + args.settle)
        watcher.record_cpu()
        restarts = {role: watcher.restart_seconds(role, args.bound) for role in args.restart if ready}
    finally:
        watcher.stop()
    watch = watcher.watch
    marks = watch.milestones()
    acting = [m["first step"] for role, m in marks.items() if kind_of(role) == "actor" and m["first step"]]
    result = {
        "side": side,
        "round": round_,
        "ready": ready,
        "roles": marks,
        "launcher": watch.launcher,
        "cpu_seconds_at_ready": watch.cpu,
        "first_step": min(acting) if acting else None,
        "first_episode": watcher.first_episode(),
        "all_ready": max((m[READY[kind_of(r)]] or 0.0) for r, m in marks.items()) if ready else None,
        "restart_seconds": restarts,
    }
    if not ready:
        progress(f"{side} round {round_}: not ready within {args.bound:g}s; launcher stderr:")
        progress(watcher.stderr_tail())
    else:
        progress(
            f"{side} round {round_}: first env step {result['first_step']:.2f}s, every role ready "
            f"{result['all_ready']:.2f}s"
            + "".join(f", {role} back in {_fmt(s)}s" for role, s in restarts.items())
        )
    return result


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def table_rows(runs: dict[str, list[dict]]) -> list[tuple[str, str, dict[str, list[float]]]]:
    """(what, milestone, side -> values over rounds) for every figure of the table, the fleet's first."""
    rows = []

    def values(get) -> dict[str, list[float]]:
        return {side: [v for r in rs if (v := get(r)) is not None] for side, rs in runs.items()}

    rows.append(("fleet", "first env step", values(lambda r: r["first_step"])))
    rows.append(("fleet", "first episode end", values(lambda r: r["first_episode"])))
    rows.append(("fleet", "every role ready", values(lambda r: r["all_ready"])))
    for name in ("roles started", "learner serving"):
        rows.append(("launcher", name, values(lambda r, n=name: r["launcher"].get(n))))
    sample = next(r for rs in runs.values() for r in rs)
    for role, marks in sample["roles"].items():
        for milestone in marks:
            rows.append(
                (role, milestone, values(lambda r, a=role, m=milestone: r["roles"].get(a, {}).get(m)))
            )
        rows.append((role, "CPU s used", values(lambda r, a=role: r["cpu_seconds_at_ready"].get(a))))
    for role in sample["restart_seconds"]:
        rows.append((role, "back after SIGKILL", values(lambda r, a=role: r["restart_seconds"].get(a))))
    return rows


def summarize(runs: dict[str, list[dict]]) -> tuple[list[list[str]], dict]:
    """The table's lines (median per side, ratio this checkout / baseline) and the same figures for the JSON."""
    lines, figures = [], {}
    for what, milestone, by_side in table_rows(runs):
        medians = {side: statistics.median(v) if v else None for side, v in by_side.items()}
        base = medians.get("baseline")
        ratio = medians[NEW] / base if "baseline" in medians and base and medians[NEW] is not None else None
        figures[f"{what} {milestone}"] = {"values": by_side, "medians": medians, "ratio": ratio}
        cells = [_fmt(medians[side]) for side in runs]
        lines.append([what, milestone, *cells] + ([_fmt(ratio)] if "baseline" in runs else []))
    return lines, figures


def environments(args, workdir: Path) -> dict[str, dict[str, str]]:
    """side -> the launcher's environment; the baseline's puts its commit's code first, checked by importing."""
    envs = {NEW: dict(os.environ)}
    if args.baseline:
        path = baseline_pythonpath(args.baseline, workdir / "baseline")
        pythonpath = os.pathsep.join(filter(None, [path, os.environ.get("PYTHONPATH")]))
        envs = {"baseline": {**os.environ, "PYTHONPATH": pythonpath}, **envs}
    for side, home in (("baseline", workdir), (NEW, ROOT)):
        if side in envs and not imported_from(
            "apexrl.launcher.fleet", envs[side], str(workdir)
        ).is_relative_to(home):
            raise RuntimeError(f"the {side} launch would not import its code from {home}")
    return envs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--env", default="CartPole-v1", help="the launch's --env")
    parser.add_argument("--baseline", default=None, help="git ref to compare with (alternating rounds)")
    parser.add_argument("--rounds", type=int, default=3, help="launches per side")
    parser.add_argument("--bound", type=float, default=60.0, help="seconds a launch may take to be ready")
    parser.add_argument(
        "--settle",
        type=float,
        default=15.0,
        help="seconds to wait after every role is ready for the milestones past it (actors' first weights)",
    )
    parser.add_argument("--restart", nargs="*", default=[], metavar="ROLE", help="roles to kill once ready")
    parser.add_argument("--arg", action="append", default=[], help="more `apexrl launch` flags, both sides")
    parser.add_argument(
        "--new-arg",
        action="append",
        default=[],
        help="more flags for this checkout's launches only (to take one change out: "
        "--new-arg=--actor-arg=--no-act-before-weights)",
    )
    parser.add_argument("--quick", action="store_true", help="a smoke run: one round")
    parser.add_argument("--json", default=None, help="write every figure here")
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds = 1
    baseline = describe(args.baseline) if args.baseline else None
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        envs = environments(args, workdir)
        runs: dict[str, list[dict]] = {side: [] for side in envs}
        for round_ in range(args.rounds):
            for side in list(envs) if round_ % 2 == 0 else list(envs)[::-1]:
                runs[side].append(one_launch(side, round_, envs[side], args, workdir))
    lines, figures = summarize(runs)
    headers = ["role", "milestone (s from launch)"]
    headers += [f"baseline {baseline}" if side == "baseline" else side for side in runs]
    for line in render_table(headers + (["new / base"] if baseline else []), lines, left={0, 1}):
        print(line)
    print(
        f"{args.env}, median of {args.rounds} launch(es) per side; CPU s used: by the role when all were ready"
    )
    print(load_line(load_before, os.getloadavg()[0]))
    if args.json:
        write_json(
            args.json, {"meta": {**metadata(args), "baseline": baseline}, "figures": figures, "runs": runs}
        )
    return 0 if all(r["ready"] for rs in runs.values() for r in rs) else 1


if __name__ == "__main__":
    sys.exit(main())
