"""`apexrl launch`: start the roles of one machine, report progress, stop them when the run is over.

With no arguments: a complete local fleet that trains CartPole-v1 (2 replay shards, the learner hosting the
parameter service, 4 exploring actors and 1 evaluator). With `--config FLEET.toml --host-name NAME`: the roles
the fleet file assigns to NAME (see `apexrl.launcher.fleet_file` for the schema and examples/fleet.toml). With
`--resume RUN_DIR`: the interrupted run recorded there (launcher/record.py).

The flags, the progress lines, the final JSON line and the signal handlers are this module's; planning, checking and
running the fleet are launcher/api.py's, the same code `apexrl.launch` runs.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import shlex
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from apexrl.common.process import EXIT_BAD_CONFIG, stop_on_signals
from apexrl.common.settings import SettingsError, settings_of
from apexrl.common.settings import add_arguments as add_settings
from apexrl.launcher.fleet_config import ConfigError, FleetConfig, FleetSettings
from apexrl.launcher.fleet_file import load_config
from apexrl.launcher.progress import ProgressRow, format_row
from apexrl.launcher.record import REDACTED, redacted  # noqa: F401 (their home before launcher/record.py)
from apexrl.launcher.run_dir import default_run_dir  # noqa: F401 (its home before launcher/run_dir.py)
from apexrl.launcher.topology import local_fleet

if TYPE_CHECKING:
    from apexrl.launcher.api import FleetRun
    from apexrl.launcher.run import RunResult

log = logging.getLogger("apexrl.launch")

HELP = "start the roles of one machine (no arguments: a local CartPole fleet)"

DEFAULT_NUM_SHARDS = 2
DEFAULT_NUM_ACTORS = 4
ROLE_ARG_KINDS = ("replay", "learner", "actor", "evaluator")
# `apexrl launch --help`: what a launch does, the result line and the exit status.
DESCRIPTION = (
    "Start the apexrl roles of this machine as child processes (logs in RUN_DIR/logs/ROLE.log), print a "
    "progress line every few seconds, and stop them all on Ctrl-C/SIGTERM, when the target return is "
    "reached, when --max-seconds pass, or when a role finishes (exit status 0). A role that dies is "
    "restarted with the same command line after a doubling backoff, at most --max-restarts times within "
    "--restart-window seconds; the rest of the fleet keeps running meanwhile.\n\n"
    "Without --config: a local fleet on 127.0.0.1 (by default 2 shards, the learner, 4 actors, 1 evaluator). "
    "With --config: only the roles the fleet file assigns to --host-name. Only the machine running the "
    "learner and the evaluator checks the target return; the others run until a signal or --max-seconds.\n\n"
    "Every role's command line is checked before any process starts: a bad setting, pass-through flag or "
    "environment id is refused in one line with exit status 2. The first log line names the algorithm, why "
    "it was chosen and its options (dpg (auto: Box actions), TD3 options: ...).\n\n"
    "The flags below are the run's. Each role has settings of its own, listed by `apexrl replay --help` "
    "(the shards: capacity, PER's alpha, checkpoints), `apexrl learner --help` (network, optimiser, the "
    "algorithm's options such as DPG's TD3 settings) and `apexrl actor --help` (exploration: DQN's epsilons, "
    "DPG's action noise; the evaluator is an `apexrl actor --evaluate`). Give them to every local role of a "
    "kind with --replay-arg, --learner-arg, --actor-arg or --evaluator-arg, written with '=' "
    "(--learner-arg='--policy-delay 1 --target-noise 0.1'), or in the role's table of a fleet file "
    "([[shard]], [learner], [[actors]], [evaluator]).\n\n"
    "The bearer token (--token, else --token-file, else the APEXRL_TOKEN environment variable) reaches each "
    "role in its environment as APEXRL_TOKEN, never on a command line, in config.json or in a log. A fleet "
    "whose every role runs on this machine, given no token, makes one of its own and keeps it in RUN_DIR/token "
    "(mode 0600): give your own clients --token-file RUN_DIR/token (the first log line names the file); --open "
    "runs such a fleet without one, as every local user may then call its services. RUN_DIR "
    "(when the launcher creates it), RUN_DIR/logs and RUN_DIR/checkpoints are mode 0700, the logs 0600.\n\n"
    "--resume RUN_DIR continues an interrupted run in its own directory with the fleet its config.json "
    "records: the learner from its last checkpoint (networks, optimiser, update count; fresh weights, said "
    "in the log, when the run stopped before its first), the replay only when the run kept it "
    "(--replay-durability checkpoint or wal; else it starts empty and the learner waits for "
    "--min-replay-size new rows), progress.csv and the episode files appended to, env steps and episodes "
    "counted on from the last progress row. It takes the token again like a first launch (a token the run "
    "made for itself: RUN_DIR/token again, or a new one once that file is removed) and may change "
    "only what steers the launch (--max-seconds, which counts this launch's time, --target-return, "
    "--progress-seconds, --stop-grace, --startup-timeout, --max-restarts, --restart-window, the token, --open and "
    "TLS files); a flag that would change the fleet is refused: that is a new run. A run directory in use "
    "(RUN_DIR/launch.lock, held by the launcher and its roles) is refused.\n\n"
    "The last line on stdout is JSON: env_steps (exploring actors' environment steps), episodes (exploration "
    "episodes; evaluation episodes are not counted), updates (learner), mean_return_100 (mean return of the "
    "last 100 evaluation episodes), wall_seconds (of the whole run, earlier launches included), solved, "
    "target_return (the target checked, or null: an environment without a reward threshold and no "
    "--target-return), run_dir, reason (target, max_seconds, signal, role_exited, restart_budget_exhausted "
    "or startup_failed), restarts, restarts_by_role (by this launch).\n"
    "Exit status: 0 when solved (or, on a machine that does not check a target, after a clean stop), 1 "
    "otherwise, 2 for a bad configuration."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """`apexrl launch`'s flags in the groups --help shows: the fleet's shape, the run's settings (FleetSettings,
    also a fleet file's [fleet] table) and the pass-through arguments for each role kind."""
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.description = DESCRIPTION
    fleet = parser.add_argument_group("fleet")
    fleet.add_argument(
        "--config",
        metavar="FILE",
        default=None,
        help="fleet file (TOML; YAML for .yaml/.yml) assigning roles to machines",
    )
    fleet.add_argument(
        "--host-name",
        metavar="NAME",
        default=None,
        help="this machine's name in the fleet file (default: its only host)",
    )
    fleet.add_argument(
        "--resume",
        metavar="RUN_DIR",
        default=None,
        help="continue the interrupted run in RUN_DIR with the fleet its config.json records (see above)",
    )
    fleet.add_argument(
        "--num-shards",
        type=int,
        default=None,
        help=f"replay shards of the local fleet (default: {DEFAULT_NUM_SHARDS}; not with --config)",
    )
    fleet.add_argument(
        "--num-actors",
        type=int,
        default=None,
        help=f"exploring actors of the local fleet (default: {DEFAULT_NUM_ACTORS}; not with --config)",
    )
    run = parser.add_argument_group("run (the [fleet] table of a fleet file; a flag given here overrides it)")
    add_settings(run, FleetSettings, overrides=True)
    passing = parser.add_argument_group(
        "pass-through",
        "Extra arguments appended to every local role of a kind, split like a shell line; write "
        "them with '=': --learner-arg='--batch-size 256' --actor-arg=--num-envs=2. Each kind's settings: "
        "apexrl replay --help, apexrl learner --help, apexrl actor --help.",
    )
    for kind in ROLE_ARG_KINDS:
        passing.add_argument(
            f"--{kind}-arg",
            action="append",
            default=[],
            metavar="ARGS",
            help=f"appended to every 'apexrl {'actor --evaluate' if kind == 'evaluator' else kind}'"
            + (" (after --actor-arg)" if kind == "evaluator" else "")
            + (" and to the evaluator" if kind == "actor" else ""),
        )


def run(args: argparse.Namespace) -> int:
    """The CLI over launcher/api.py: plan the run from the flags (or the run directory for --resume), start it with
    this process's signal handlers in place, print each progress row and the result."""
    from apexrl.launcher.api import plan_new, plan_resume, start

    stop, force = threading.Event(), threading.Event()
    try:
        if args.resume is not None:
            plan = plan_resume(Path(args.resume), resume_changes(args))
        else:
            config, host = resolve_config(args)
            extra = {
                kind: [a for text in getattr(args, f"{kind}_arg") for a in shlex.split(text)]
                for kind in ROLE_ARG_KINDS
            }
            plan = plan_new(config, host, extra, options={k: v for k, v in vars(args).items() if k != "func"})
        with stop_on_signals(stop, hangup=True, on_repeat=force.set):  # second Ctrl-C: kill at once
            fleet = start(plan, on_progress=_print_row, report=_print_error, stop=stop, force=force)
            result = _wait_awake(fleet)
    except SettingsError as err:
        print(f"apexrl launch: error: {err}", file=sys.stderr)
        return EXIT_BAD_CONFIG
    print(result.to_json(), flush=True)
    return int(fleet.exit_status or 0)


def resume_changes(args: argparse.Namespace) -> dict[str, Any]:
    """The settings given with --resume (those a resume may change; the others are refused by `read_run`), and a
    ConfigError for the flags that choose the fleet, which the run directory records."""
    fixed = [
        flag
        for flag, given in (
            ("--config", args.config is not None),
            ("--host-name", args.host_name is not None),
            ("--num-shards", args.num_shards is not None),
            ("--num-actors", args.num_actors is not None),
            *((f"--{kind}-arg", bool(getattr(args, f"{kind}_arg"))) for kind in ROLE_ARG_KINDS),
        )
        if given
    ]
    if fixed:
        raise ConfigError(
            f"--resume continues the fleet {args.resume}/config.json records: {', '.join(fixed)} would change it; "
            f"start a new run instead"
        )
    return {s.name: getattr(args, s.name) for s in settings_of(FleetSettings) if hasattr(args, s.name)}


def _wait_awake(fleet: FleetRun) -> RunResult:
    """The run's result, waited for in short slices: Python runs signal handlers only in the main thread, and a
    SIGTERM the kernel hands to another thread (gRPC's, the run's) does not wake a main thread asleep in an
    untimed wait, so the run would never hear it (seen under load)."""
    while True:
        try:
            return fleet.wait(0.5)
        except TimeoutError:
            continue


def _print_row(row: ProgressRow) -> None:
    print(format_row(row), flush=True)


def _print_error(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def resolve_config(args: argparse.Namespace) -> tuple[FleetConfig, str]:
    """The fleet to run and this machine's name in it: the fleet file or the local fleet, with the command-line
    options taking precedence."""
    from apexrl.launcher.api import pick_host

    overrides = {s.name: getattr(args, s.name) for s in settings_of(FleetSettings) if hasattr(args, s.name)}
    try:
        FleetSettings(**overrides)
    except SettingsError as err:
        raise ConfigError(_as_flag(str(err))) from None
    if args.config is None:
        if args.host_name is not None:
            raise ConfigError("--host-name needs --config (the local fleet runs every role on this machine)")
        config = local_fleet(
            num_shards=DEFAULT_NUM_SHARDS if args.num_shards is None else args.num_shards,
            num_actors=DEFAULT_NUM_ACTORS if args.num_actors is None else args.num_actors,
            **overrides,
        )
        return config, config.learner.host
    if args.num_shards is not None or args.num_actors is not None:
        raise ConfigError(
            "--num-shards and --num-actors describe the local fleet; with --config the fleet file "
            "sets the roles"
        )
    config = dataclasses.replace(load_config(args.config), **overrides)
    return config, pick_host(config, args.host_name, args.config)


def _as_flag(message: str) -> str:
    """'max_seconds (-1) must be positive' -> '--max-seconds (-1) must be positive'."""
    name, _, rest = message.partition(" ")
    return f"--{name.replace('_', '-')} {rest}" if rest and name.isidentifier() else message
