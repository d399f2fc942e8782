"""`apexrl launch`: start the roles of one machine, report progress, stop them when the run is over.

With no arguments: a complete local fleet that trains CartPole-v1 (2 replay shards, the learner hosting the
parameter service, 4 exploring actors and 1 evaluator). With `--config FLEET.toml --host-name NAME`: the roles
the fleet file assigns to NAME (see `apexrl.launcher.fleet_file` for the schema and examples/fleet.toml).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import shlex
import sys
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from apexrl.common.env_settings import EnvChoice
from apexrl.common.files import atomic_write
from apexrl.common.process import EXIT_BAD_CONFIG, stop_on_signals, with_token
from apexrl.common.settings import SettingsError, settings_of
from apexrl.common.settings import add_arguments as add_settings
from apexrl.launcher.fleet_config import ConfigError, FleetConfig, FleetSettings, local_fleet
from apexrl.launcher.fleet_file import load_config
from apexrl.launcher.topology import host_names, roles_on

log = logging.getLogger("apexrl.launch")

HELP = "start the roles of one machine (no arguments: a local CartPole fleet)"

DEFAULT_NUM_SHARDS = 2
DEFAULT_NUM_ACTORS = 4
ROLE_ARG_KINDS = ("replay", "learner", "actor", "evaluator")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.description = (
        "Start the apexrl roles of this machine as child processes (logs in RUN_DIR/logs/ROLE.log), print a "
        "progress line every few seconds, and stop them all on Ctrl-C/SIGTERM, when the target return is "
        "reached, when --max-seconds pass, or when a role finishes (exit status 0). A role that dies is "
        "restarted with the same command line after a doubling backoff, at most --max-restarts times within "
        "--restart-window seconds; the rest of the fleet keeps running meanwhile.\n\n"
        "Without --config: a local fleet on 127.0.0.1 (by default 2 shards, the learner, 4 actors, 1 evaluator). "
        "With --config: only the roles the fleet file assigns to --host-name. Only the machine running the "
        "learner and the evaluator checks the target return; the others run until a signal or --max-seconds.\n\n"
        "Every role's command line is checked before any process starts: a bad setting, pass-through flag or "
        "environment id is refused in one line with exit status 2.\n\n"
        "The bearer token (--token, else --token-file, else the APEXRL_TOKEN environment variable) reaches each "
        "role in its environment as APEXRL_TOKEN, never on a command line, in config.json or in a log. RUN_DIR "
        "(when the launcher creates it), RUN_DIR/logs and RUN_DIR/checkpoints are mode 0700, the logs 0600.\n\n"
        "The last line on stdout is JSON: env_steps (exploring actors' environment steps), episodes (exploration "
        "episodes; evaluation episodes are not counted), updates (learner), mean_return_100 (mean return of the "
        "last 100 evaluation episodes), wall_seconds, solved, target_return (the target checked, or null: an "
        "environment without a reward threshold and no --target-return), run_dir, reason, restarts, "
        "restarts_by_role.\n"
        "Exit status: 0 when solved (or, on a machine that does not check a target, after a clean stop), 1 "
        "otherwise, 2 for a bad configuration."
    )
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
        "them with '=': --learner-arg='--batch-size 256' --actor-arg=--num-envs=2.",
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
    from apexrl.launcher.commands import check_commands, with_algorithm
    from apexrl.launcher.fleet import check_fixed_ports

    try:
        config, host = resolve_config(args)
        config = with_token(with_algorithm(config))  # --token, --token-file or APEXRL_TOKEN, read once here
        run_dir = Path(config.run_dir or default_run_dir(EnvChoice.of(config)))
        if (run_dir / "config.json").exists():
            raise ConfigError(f"{run_dir} already holds a run (config.json); choose another --run-dir")
        extra = {
            kind: [a for text in getattr(args, f"{kind}_arg") for a in shlex.split(text)]
            for kind in ROLE_ARG_KINDS
        }
        check_commands(config, host, run_dir, extra)
        check_fixed_ports(config, host)
        if any(r.kind != "replay" for r in roles_on(config, host)):
            from apexrl.common.environments import env_spaces  # gymnasium: a shards-only machine may lack it

            try:
                env_spaces(EnvChoice.of(config))
            except ValueError as err:
                raise ConfigError(f"--env: {err}") from None
    except SettingsError as err:
        print(f"apexrl launch: error: {err}", file=sys.stderr)
        return EXIT_BAD_CONFIG
    return Launch(
        config, host, run_dir, extra, options={k: v for k, v in vars(args).items() if k != "func"}
    ).run()


def resolve_config(args: argparse.Namespace) -> tuple[FleetConfig, str]:
    """The fleet to run and this machine's name in it: the fleet file or the local fleet, with the command-line
    options taking precedence."""
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
    hosts = host_names(config)
    if args.host_name is None:
        if len(hosts) > 1:
            raise ConfigError(f"{args.config} spreads the fleet over {', '.join(hosts)}: pass --host-name")
        return config, hosts[0]
    if args.host_name not in hosts:
        raise ConfigError(
            f"--host-name {args.host_name!r} runs no role of {args.config}; hosts: {', '.join(hosts)}"
        )
    return config, args.host_name


def _as_flag(message: str) -> str:
    """'max_seconds (-1) must be positive' -> '--max-seconds (-1) must be positive'."""
    name, _, rest = message.partition(" ")
    return f"--{name.replace('_', '-')} {rest}" if rest and name.isidentifier() else message


def default_run_dir(env: EnvChoice | str) -> str:
    """runs/NAME-TIMESTAMP, NAME the registered id made safe for a file name (no '/', ':' or spaces)."""
    name = (env if isinstance(env, EnvChoice) else EnvChoice(env)).run_name()
    return f"runs/{name}-{datetime.now().strftime('%Y%m%d-%H%M%S')}"


class Launch:
    """One run of one machine's roles, from start to the final JSON line."""

    def __init__(
        self,
        config: FleetConfig,
        host: str,
        run_dir: Path,
        extra: dict[str, list[str]],
        options: dict | None = None,
    ) -> None:
        from apexrl.launcher.topology import checks_target

        self.config = config
        self.host = host
        self.run_dir = run_dir
        self.extra = extra
        self.progress_seconds = config.progress_seconds
        self.stop_grace = config.stop_grace
        self.options = options or {}
        self.target = config.target_return
        if self.target is None:
            from apexrl.common.environments import reward_threshold

            self.target = reward_threshold(EnvChoice.of(config))
        self.checks_target = checks_target(config, host) and self.target is not None
        self.stop = threading.Event()
        self.force = threading.Event()

    def run(self) -> int:
        if not self.run_dir.exists():
            self.run_dir.mkdir(parents=True)
            self.run_dir.chmod(0o700)  # logs, checkpoints: the run is its owner's alone
        with stop_on_signals(self.stop, hangup=True, on_repeat=self.force.set):  # second Ctrl-C: kill at once
            return self._run(time.time())

    def _run(self, start: float) -> int:
        from apexrl.launcher.fleet import Fleet, Interrupted, StartupError
        from apexrl.launcher.progress import Progress, ProgressCsv
        from apexrl.launcher.prometheus_targets import write_targets

        fleet = Fleet(self.config, self.host, self.run_dir, extra_args=self.extra, stop=self.stop)
        self._write_config(fleet, start)
        progress_csv = ProgressCsv(
            self.run_dir / "progress.csv", tensorboard_dir=self.run_dir / "tensorboard" / "episodes"
        )
        progress: Progress | None = None
        row = None
        failed = solved = False
        reason = "signal"
        try:
            log.info(
                "launching %s on %s (target return %s, at most %.0fs); run directory %s",
                self.config.env,
                self.host,
                self.target if self.checks_target else "not checked here",
                self.config.max_seconds,
                self.run_dir,
            )
            fleet.start()
            self._write_config(fleet, start)
            write_targets(self.run_dir, fleet.config, self.host, fleet.roles)  # Prometheus file-SD
            progress = Progress(self.run_dir / "episodes", *self._metrics_urls(fleet), start_time=start)
            row = self._tick(progress, progress_csv, time.time())  # anchors the curve: 0 steps once all run
            threading.Thread(target=_import_plotting, name="import-matplotlib", daemon=True).start()
            next_tick = time.time() + self.progress_seconds
            while not self.stop.is_set():
                child = fleet.supervise()
                if child is not None:
                    failed = child.process.returncode != 0
                    reason = "restart_budget_exhausted" if failed else "role_exited"
                    if failed:
                        print(
                            f"apexrl launch: {child.role.name} died unexpectedly and its restart budget "
                            f"({self.config.max_restarts} in {self.config.restart_window:.0f}s) is spent: "
                            f"{child.describe_exit()}",
                            file=sys.stderr,
                        )
                    else:
                        log.info("%s finished (exit status 0); stopping the fleet", child.role.name)
                    break
                now = time.time()
                if now - start >= self.config.max_seconds:
                    reason = "max_seconds"
                    break
                if now >= next_tick:
                    row = self._tick(progress, progress_csv, now, restarts=sum(fleet.restart_counts.values()))
                    if self.checks_target and progress.solved(self.target):
                        solved, reason = True, "target"
                        log.info(
                            "solved: the last 100 evaluation episodes average %.1f >= %g",
                            progress.eval_mean(),
                            self.target,
                        )
                        break
                    next_tick += self.progress_seconds
                self.stop.wait(0.2)
        except Interrupted:
            reason = "signal"
        except StartupError as err:
            failed, reason = True, "startup_failed"
            print(f"apexrl launch: fleet did not start: {err}", file=sys.stderr)
        finally:
            if progress is None:  # startup did not finish: count what the started roles did
                progress = Progress(self.run_dir / "episodes", *self._metrics_urls(fleet), start_time=start)
            if fleet.children and not self.force.is_set():
                try:
                    row = self._tick(
                        progress,
                        progress_csv,
                        time.time(),
                        echo=False,
                        restarts=sum(fleet.restart_counts.values()),
                    )  # last counters
                except Exception as err:  # the fleet must still be stopped
                    log.warning("final progress read failed: %s", err)
            log.info("stopping %d roles (%s)", len(fleet.children), reason)
            fleet.stop(self.stop_grace, self.force)
            progress_csv.close()
            progress.close()
            self._write_config(fleet, start)
        wall = time.time() - start
        self._write_results()
        result = {
            "env_steps": row.env_steps if row else 0,
            "episodes": row.episodes if row else 0,
            "updates": row.updates if row else None,
            "mean_return_100": progress.eval_mean(),
            "wall_seconds": round(wall, 3),
            "solved": solved,
            "target_return": self.target,
            "run_dir": str(self.run_dir),
            "reason": reason,
            "restarts": sum(fleet.restart_counts.values()),
            "restarts_by_role": fleet.restart_counts,
        }
        print(json.dumps(result), flush=True)
        if solved:
            return 0
        return 0 if not self.checks_target and not failed and reason in ("signal", "max_seconds") else 1

    def _tick(self, progress, progress_csv, now: float, echo: bool = True, restarts: int = 0):
        from apexrl.launcher.progress import format_row

        row = dataclasses.replace(progress.tick(now), restarts=restarts)
        progress_csv.write(row)
        if echo:
            print(format_row(row, progress.eval_episodes), flush=True)
        return row

    def _metrics_urls(self, fleet) -> tuple[list[str], str | None]:
        """Exploring actors' and the learner's /metrics: this machine's roles, and other machines' roles whose
        metrics ports the fleet file fixes."""
        from apexrl.launcher.topology import address, roles

        local = {role.name: role for role in fleet.roles}
        urls: dict[str, str] = {}
        for role in roles(fleet.config):
            role = local.get(role.name, role)
            if role.kind in ("actor", "learner") and role.metrics_port:
                urls[role.name] = (
                    f"http://{address(fleet.config, role.host, role.metrics_port, self.host)}/metrics"
                )
        learner = urls.pop("learner", None)
        return list(urls.values()), learner

    def _write_config(self, fleet, start: float) -> None:
        from apexrl.launcher.topology import roles

        commands = fleet.commands()
        local = {role.name: role for role in fleet.roles}
        doc = {
            "host_name": self.host,
            "run_dir": str(self.run_dir),
            "started_at": datetime.fromtimestamp(start).isoformat(timespec="seconds"),
            "launch_options": self.options,
            "checks_target": self.checks_target,
            "num_actors": self.config.num_actors,
            "progress_seconds": self.progress_seconds,
            "stop_grace": self.stop_grace,
            "pass_through_args": self.extra,
            "fleet": dataclasses.asdict(fleet.config),
            "roles": [
                {
                    **dataclasses.asdict(local.get(role.name, role)),
                    "local": role.name in local,
                    "command": commands.get(role.name),
                }
                for role in roles(fleet.config)
            ],
        }
        atomic_write(self.run_dir / "config.json", json.dumps(redacted(doc), indent=2, default=str) + "\n")

    def _write_results(self) -> None:
        from apexrl.common.episodes import merge_episode_files

        episodes = sorted((self.run_dir / "episodes").glob("*.csv"))
        count = merge_episode_files(episodes, self.run_dir / "episodes.csv")
        written = ["progress.csv", f"episodes.csv ({count} episodes)"]
        if self.force.is_set() or count == 0:
            log.info("no learning curve: %s", "second signal" if count else "no episodes finished")
        else:
            try:
                from apexrl.launcher.plot import plot_learning_curve

                plot_learning_curve(
                    self.run_dir / "progress.csv",
                    self.run_dir / "episodes.csv",
                    self.run_dir / "learning_curve.png",
                    target_return=self.target,
                    title=self.config.env,
                )
                written.append("learning_curve.png")
            except Exception as err:  # a missing plot must not hide the run's result
                log.warning("could not plot the learning curve: %s", err)
        log.info("wrote %s in %s", ", ".join(written), self.run_dir)


REDACTED = "<redacted>"


def redacted(value: Any) -> Any:
    """`value` (nested dicts and lists) with the value of every `token` key that is set replaced by REDACTED: the
    fleet's token, a role table's, a `--token` launch option. Paths (token_file) stay."""
    if isinstance(value, dict):
        return {k: REDACTED if k == "token" and v else redacted(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [redacted(v) for v in value]
    return value


def _import_plotting() -> None:
    """Import matplotlib while the fleet trains, so that drawing the curve at exit takes a moment, not seconds."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot  # noqa: F401
    except Exception:  # reported when plotting at exit
        pass
