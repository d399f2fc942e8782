#!/usr/bin/env python
"""A bounded fleet run: `apexrl launch --env ENV` for `--max-seconds`, and its figures read from the fleet itself
(frames/s, updates/s, bytes per stored transition, greedy return over time). Written for Pong (issue 10, item 4:
the whole pixel pipeline), used for any environment (issue 15: HalfCheetah-v5 and Pong on a GPU machine).

    .venv/bin/python bench/fleet_run.py --json /tmp/pong_run.json                 # Pong, 240 s (+ start-up and stop)
    .venv/bin/python bench/fleet_run.py --max-seconds 60 --run-dir /tmp/pong60    # a smoke run
    .venv/bin/python bench/fleet_run.py --num-actors 2 --learner-arg='--batch-size 32'   # flags go to the launcher
    .venv/bin/python bench/fleet_run.py --env HalfCheetah-v5 --evaluation-episodes 10 --json /tmp/hc.json

Flags this script does not know are appended to the launch command (write pass-through values with '=', as
`apexrl launch` asks). What it reports:
- env steps of the exploring actors (the launcher's final JSON; the evaluator's are listed apart, scraped) and
  frames (x 4, Atari's frame skip, for ALE/* environments; a frame per step for the others), per second over the
  whole wall time and since the actors' first step;
- learner updates, per second over the wall time and since the first update (progress.csv);
- bytes per stored transition: the shards' `apexrl_replay_stored_bytes` /
  `apexrl_replay_size_rows`, scraped from the /metrics endpoints in RUN_DIR/prometheus/targets.json every
  `--scrape-seconds` while the fleet runs (the last scrape is reported), and the shards' own count at stop (their
  logs), next to a raw Atari row (56,472 B);
- evaluation return over time: the evaluator's greedy episodes (episodes.csv) grouped by the weights version they
  were played with, against wall time and the fleet's env steps then.
The table goes to stdout, then one JSON line (the last line); the launcher's progress lines go to stderr.

`--evaluation-episodes` is the launcher's default (10 for Atari: 100 side-by-side Pong episodes would not finish a
round within a few minutes on 2 cores; 100 for the others).
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from harness.report import load_line, metadata, progress, render_table, write_json

DEFAULT_ENV = "ALE/Pong-v5"
# A raw Atari row (AtariPreprocessing's 4 stacked 84x84 frames, twice): what compression is measured against.
RAW_ROW_BYTES = 2 * 4 * 84 * 84 + 8 + 4 + 4 + 8  # obs, next_obs, action, reward, discount, weight_version
STOPPED = re.compile(r"replay shard stopped: (\d+) rows held, (\d+) inserted.*?; (\d+) bytes held")


@dataclass
class Scrape:
    """The shards' and the evaluator's counters at one moment of the run (summed over shards)."""

    wall_seconds: float
    shards: int
    stored_bytes: float
    rows: float
    inserted: float
    evaluator_env_steps: float | None


@dataclass
class Fleet:
    """What the launcher left: its final JSON, the scrapes taken while it ran, its exit status."""

    result: dict
    returncode: int
    scrapes: list[Scrape] = field(default_factory=list)


# ------------------------------------------------------------------------------------------------- the run


def launch_command(args: argparse.Namespace, extra: list[str]) -> list[str]:
    return [
        sys.executable,
        "-m",
        "apexrl.launcher",
        "launch",
        "--env",
        args.env,
        "--max-seconds",
        str(args.max_seconds),
        "--run-dir",
        str(args.run_dir),
        "--seed",
        str(args.seed),
        *(["--evaluation-episodes", str(args.evaluation_episodes)] if args.evaluation_episodes else []),
        *extra,
    ]


def run_fleet(args: argparse.Namespace, extra: list[str]) -> Fleet:
    """Launch, echo its progress lines to stderr, scrape the shards until it exits; stop it if we are stopped."""
    command = launch_command(args, extra)
    progress(f"running {shlex.join(command)}")
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    lines: list[str] = []
    reader = threading.Thread(target=_echo, args=(proc.stdout, lines), name="launch-stdout", daemon=True)
    reader.start()
    scrapes: list[Scrape] = []
    started = time.monotonic()
    try:
        while proc.poll() is None:
            scrape = scrape_fleet(Path(args.run_dir), time.monotonic() - started)
            if scrape is not None:
                scrapes.append(scrape)
            _wait(proc, args.scrape_seconds)
    finally:
        if proc.poll() is None:  # interrupted: the launcher stops its roles on SIGTERM
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)
    reader.join(timeout=10)
    if not lines or not lines[-1].startswith("{"):
        raise RuntimeError(
            f"the launcher exited with {proc.returncode} without its JSON line; see its stderr above"
        )
    return Fleet(json.loads(lines[-1]), proc.returncode, scrapes)


def _echo(stream, lines: list[str]) -> None:
    for line in stream:
        lines.append(line.rstrip("\n"))
        print(line, end="", file=sys.stderr, flush=True)


def _wait(proc: subprocess.Popen, seconds: float) -> None:
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=seconds)


def metrics_urls(run_dir: Path) -> dict[str, list[str]]:
    """Prometheus job -> the /metrics URLs the launcher listed (empty until it has written the file)."""
    try:
        groups = json.loads((run_dir / "prometheus" / "targets.json").read_text())
    except (OSError, ValueError):
        return {}
    urls: dict[str, list[str]] = {}
    for group in groups:
        urls.setdefault(group["labels"]["job"], []).extend(f"http://{t}/metrics" for t in group["targets"])
    return urls


def scrape_fleet(run_dir: Path, wall_seconds: float) -> Scrape | None:
    """The shards' stored bytes, rows and inserts, and the evaluator's env steps; None unless every shard
    answered (a partial sum would understate the bytes or the rows)."""
    from apexrl.launcher.progress import scrape

    urls = metrics_urls(run_dir)
    try:
        shards = [scrape(url) for url in urls.get("apexrl-replay", [])]
    except (OSError, ValueError):
        return None
    if not shards:
        return None
    evaluator = None
    for url in urls.get("apexrl-evaluator", []):
        try:
            evaluator = (evaluator or 0.0) + scrape(url).get("apexrl_actor_env_steps_total", 0.0)
        except (OSError, ValueError):
            evaluator = None
            break
    return Scrape(
        wall_seconds,
        len(shards),
        sum(s.get("apexrl_replay_stored_bytes", 0.0) for s in shards),
        sum(s.get("apexrl_replay_size_rows", 0.0) for s in shards),
        sum(s.get("apexrl_replay_inserted_rows_total", 0.0) for s in shards),
        evaluator,
    )


# --------------------------------------------------------------------------------------------- the figures


def read_csv(path: Path) -> list[dict[str, str]]:
    try:
        with open(path, newline="") as f:
            return list(csv.DictReader(f))
    except OSError:
        return []


def _num(value: str | None) -> float | None:
    return float(value) if value not in (None, "") else None


def _points(rows: list[dict[str, str]], column: str) -> list[tuple[float, float]]:
    return [(float(r["wall_seconds"]), _num(r[column]) or 0.0) for r in rows]


def _rate(start: tuple[float, float], end: tuple[float, float]) -> float | None:
    return (end[1] - start[1]) / (end[0] - start[0]) if end[0] > start[0] else None


def rate_since_start(rows: list[dict[str, str]], column: str) -> tuple[float | None, float | None]:
    """(rate, started at): the counter's growth per second from the last progress row where it was still 0 to
    the last row, i.e. without the start-up; (None, None) when it never moved."""
    points = _points(rows, column)
    moved = [i for i, (_, value) in enumerate(points) if value > 0]
    if not moved:
        return None, None
    start = points[max(0, moved[0] - 1)]
    return _rate(start, points[-1]), start[0]


def rate_second_half(rows: list[dict[str, str]], column: str) -> float | None:
    """The counter's growth per second over the second half of the run: the steady state, once the replay ratio
    (samples per insert) ties the actors to the learner."""
    points = _points(rows, column)
    if len(points) < 2:
        return None
    half = points[-1][0] / 2
    return _rate(max((p for p in points if p[0] <= half), default=points[0]), points[-1])


def steps_at(rows: list[dict[str, str]], seconds: float) -> int:
    """The fleet's env steps at the last progress row not after `seconds` into the run."""
    steps = 0
    for row in rows:
        if float(row["wall_seconds"]) > seconds:
            break
        steps = int(float(row["env_steps"]))
    return steps


def evaluation_rounds(run_dir: Path, rows: list[dict[str, str]]) -> list[dict]:
    """The evaluator's episodes grouped by the weights version they ended with, in order: seconds into the run
    (of the group's last episode), the fleet's env steps then, episodes and their mean return."""
    if not rows:
        return []
    start = float(rows[0]["unix_time"]) - float(rows[0]["wall_seconds"])
    rounds: list[dict] = []
    for episode in read_csv(run_dir / "episodes.csv"):
        if episode["role"] != "evaluate":
            continue
        version, seconds = int(episode["weight_version"]), float(episode["wall_time"]) - start
        if not rounds or rounds[-1]["weight_version"] != version:
            rounds.append({"weight_version": version, "returns": []})
        rounds[-1].update(seconds=round(seconds, 1), env_steps=steps_at(rows, seconds))
        rounds[-1]["returns"].append(float(episode["return"]))
    return [
        {
            "seconds": r["seconds"],
            "env_steps": r["env_steps"],
            "weight_version": r["weight_version"],
            "episodes": len(r["returns"]),
            "mean_return": sum(r["returns"]) / len(r["returns"]),
        }
        for r in rounds
    ]


def bytes_at_stop(run_dir: Path) -> dict | None:
    """The shards' own count when they stopped (their last log line): rows held, inserted, bytes held."""
    rows = inserted = stored = shards = 0
    for log in sorted((run_dir / "logs").glob("shard-*.log")):
        found = STOPPED.findall(log.read_text(errors="replace"))
        if found:
            held, ins, held_bytes = map(int, found[-1])
            rows, inserted, stored, shards = rows + held, inserted + ins, stored + held_bytes, shards + 1
    if not shards or not rows:
        return None
    return {
        "shards": shards,
        "rows": rows,
        "inserted": inserted,
        "stored_bytes": stored,
        "bytes_per_row": stored / rows,
    }


def figures(args: argparse.Namespace, fleet: Fleet) -> dict:
    """Everything the run reports, as one JSON-ready dict."""
    from apexrl.common.environments import ATARI_FRAME_SKIP

    atari = args.env.startswith("ALE/")
    frame_skip = ATARI_FRAME_SKIP if atari else 1
    raw_bytes = RAW_ROW_BYTES if atari else None
    run_dir = Path(args.run_dir)
    rows = read_csv(run_dir / "progress.csv")
    result = fleet.result
    wall = result["wall_seconds"]
    steps = result["env_steps"]
    steps_rate, steps_from = rate_since_start(rows, "env_steps")
    updates_rate, updates_from = rate_since_start(rows, "updates")
    half_rate = rate_second_half(rows, "env_steps")
    last = next((s for s in reversed(fleet.scrapes) if s.rows), None)
    per_row = last.stored_bytes / last.rows if last else None
    return {
        "env": args.env,
        "max_seconds": args.max_seconds,
        "wall_seconds": wall,
        "reason": result["reason"],
        "restarts": result["restarts"],
        "frame_skip": frame_skip,
        "env_steps": steps,
        "frames": steps * frame_skip,
        "env_steps_per_s": steps / wall,
        "frames_per_s": steps * frame_skip / wall,
        "env_steps_per_s_since_start": steps_rate,
        "actors_started_at_s": steps_from,
        "frames_per_s_since_start": None if steps_rate is None else steps_rate * frame_skip,
        "env_steps_per_s_second_half": half_rate,
        "frames_per_s_second_half": None if half_rate is None else half_rate * frame_skip,
        "evaluator_env_steps": next(
            (s.evaluator_env_steps for s in reversed(fleet.scrapes) if s.evaluator_env_steps is not None),
            None,
        ),
        "updates": result["updates"],
        "updates_per_s": (result["updates"] or 0) / wall,
        "updates_per_s_since_start": updates_rate,
        "learner_started_at_s": updates_from,
        "updates_per_s_second_half": rate_second_half(rows, "updates"),
        "bytes_per_stored_transition": per_row,
        "stored_rows": last.rows if last else None,
        "inserted_rows": last.inserted if last else None,
        "scraped_at_s": last.wall_seconds if last else None,
        "raw_bytes_per_transition": raw_bytes,
        "compression_ratio": raw_bytes / per_row if raw_bytes and per_row else None,
        "at_stop": bytes_at_stop(run_dir),
        "evaluation": evaluation_rounds(run_dir, rows),
        "mean_return_100": result["mean_return_100"],
        "run_dir": str(run_dir),
    }


# ------------------------------------------------------------------------------------------------- output


def _fmt(value: float | None, spec: str = ",.1f") -> str:
    return "-" if value is None else format(value, spec)


def print_table(f: dict, file=sys.stdout) -> None:
    at_stop = f["at_stop"] or {}
    since = f"since {_fmt(f['actors_started_at_s'], '.0f')} s"
    lines = [
        [
            "env steps (exploring actors)",
            _fmt(f["env_steps"], ",d"),
            _fmt(f["env_steps_per_s"]),
            f"{_fmt(f['env_steps_per_s_since_start'])} {since}, {_fmt(f['env_steps_per_s_second_half'])} 2nd half",
        ],
        [
            f"frames (x{f['frame_skip']})",
            _fmt(f["frames"], ",d"),
            _fmt(f["frames_per_s"]),
            f"{_fmt(f['frames_per_s_since_start'])} {since}, {_fmt(f['frames_per_s_second_half'])} 2nd half",
        ],
        ["evaluator env steps", _fmt(f["evaluator_env_steps"], ",.0f"), "", "greedy play, not counted above"],
        [
            "learner updates",
            _fmt(f["updates"], ",d"),
            _fmt(f["updates_per_s"], ",.2f"),
            f"{_fmt(f['updates_per_s_since_start'], ',.2f')} since {_fmt(f['learner_started_at_s'], '.0f')} s, "
            f"{_fmt(f['updates_per_s_second_half'], ',.2f')} 2nd half",
        ],
        [
            "bytes per stored transition",
            _fmt(f["bytes_per_stored_transition"], ",.0f"),
            f"{_fmt(f['compression_ratio'], ',.0f')}x < raw",
            f"{_fmt(f['stored_rows'], ',.0f')} rows at {_fmt(f['scraped_at_s'], '.0f')} s (/metrics); at stop "
            f"{_fmt(at_stop.get('bytes_per_row'), ',.0f')} B x {_fmt(at_stop.get('rows'), ',d')} rows (logs)",
        ],
    ]
    print(
        f"{f['env']}, {f['wall_seconds']:.0f} s wall ({f['reason']}, {f['restarts']} restarts), run dir "
        f"{f['run_dir']}",
        file=file,
    )
    for line in render_table(
        ["figure", "total", "/s over the run", "/s without start-up; note"], lines, left={0, 3}
    ):
        print(line, file=file)
    rounds = [
        [
            _fmt(r["seconds"], ".0f"),
            _fmt(r["env_steps"], ",d"),
            str(r["weight_version"]),
            str(r["episodes"]),
            _fmt(r["mean_return"]),
        ]
        for r in f["evaluation"]
    ]
    if rounds:
        print("evaluation (greedy episodes, grouped by weights version):", file=file)
        for line in render_table(
            ["s", "env steps", "weights", "episodes", "mean return"], rounds, left=set()
        ):
            print(line, file=file)
    else:
        print("evaluation: no greedy episode finished", file=file)


# ------------------------------------------------------------------------------------------------------ main


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--env", default=DEFAULT_ENV, help=f"environment id of the fleet ({DEFAULT_ENV})")
    parser.add_argument("--max-seconds", type=float, default=240.0, help="the fleet's wall-time budget (240)")
    parser.add_argument(
        "--run-dir", default=None, help="run directory (default runs/fleet_run-ENV-TIMESTAMP)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--evaluation-episodes",
        type=int,
        default=None,
        help="greedy episodes per evaluation round (default: the launcher's, 10 for Atari, else 100)",
    )
    parser.add_argument(
        "--scrape-seconds",
        type=float,
        default=5.0,
        help="seconds between scrapes of the shards' /metrics (default 5)",
    )
    parser.add_argument("--json", metavar="PATH", help="also write the figures and the scrapes to PATH")
    args, extra = parser.parse_known_args(argv)
    if args.run_dir is None:
        name = args.env.replace("/", "-")
        args.run_dir = f"runs/fleet_run-{name}-{time.strftime('%Y%m%d-%H%M%S')}"
    return args, extra


def main(argv: list[str] | None = None) -> int:
    args, extra = parse_args(sys.argv[1:] if argv is None else argv)
    load_before = os.getloadavg()[0]
    fleet = run_fleet(args, extra)
    result = figures(args, fleet)
    result["load_average_1min"] = [load_before, os.getloadavg()[0]]
    result["pass_through"] = extra
    print_table(result)
    print(load_line(*result["load_average_1min"]))
    if args.json:
        write_json(
            args.json,
            {"meta": metadata(args), "figures": result, "scrapes": [asdict(s) for s in fleet.scrapes]},
        )
    print(json.dumps(result), flush=True)
    return fleet.returncode


if __name__ == "__main__":
    sys.exit(main())
