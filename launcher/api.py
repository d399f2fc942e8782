"""Launching a fleet from Python: `apexrl.launch(fleet)` checks the fleet, starts its roles as child processes and
returns a FleetRun at once; the run goes on in a background thread of the caller's process.

    import apexrl

    fleet = apexrl.local_fleet(num_actors=2, env="CartPole-v1", max_seconds=300)   # ConfigError if bad
    with apexrl.launch(fleet) as run:            # leaving the block stops the fleet
        result = run.wait()                      # RunResult: the fields of `apexrl launch`'s JSON line
    run = apexrl.resume(result.run_dir, max_seconds=600)   # continue it later

The settings object is the launcher's own FleetConfig (`local_fleet(...)`, or a fleet file's
`apexrl.launcher.fleet_file.load_config(path)`), so Python, the flags and fleet files share one declaration of
every setting and one validation. `apexrl launch` is this module plus flags, printing and signal handlers: it
plans the run with `plan_new`/`plan_resume` and `start`s it like `launch` does. A FleetRun installs no signal
handler (Python allows them only in the main thread); a caller's process that exits stops its fleet (atexit).
"""

from __future__ import annotations

import atexit
import logging
import shlex
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from apexrl.common.env_settings import EnvChoice
from apexrl.common.process import TOKEN_VARIABLE, with_token
from apexrl.launcher.fleet_config import ConfigError, FleetConfig
from apexrl.launcher.progress import ProgressRow, last_row
from apexrl.launcher.record import read_run
from apexrl.launcher.run import Launch, RunResult
from apexrl.launcher.run_dir import RunLock, check_new, default_run_dir
from apexrl.launcher.run_token import token_path, with_run_token, write_run_token
from apexrl.launcher.topology import host_names, local_fleet, roles_on

log = logging.getLogger("apexrl.launch")

ROLE_KINDS = ("replay", "learner", "actor", "evaluator")  # the keys of pass-through args


@dataclass(frozen=True)
class Plan:
    """A run checked and ready to start: every role's command parses, fixed ports are free, the environment is
    made (nothing started, nothing written yet)."""

    config: FleetConfig
    host: str
    run_dir: Path
    extra_args: dict[str, list[str]]
    options: dict[str, Any] = field(default_factory=dict)  # the launch options config.json records
    previous: ProgressRow | None = None  # a resumed run's last progress row
    first_started_at: str | None = None  # a resumed run's first start
    resumed_at: tuple[str, ...] = ()
    run_token: bool = False  # config.token is the run's own, kept in RUN_DIR/token (launcher/run_token.py)

    @property
    def resuming(self) -> bool:
        return self.first_started_at is not None


def launch(
    fleet: FleetConfig | None = None,
    *,
    host_name: str | None = None,
    extra_args: Mapping[str, Sequence[str]] | None = None,
    on_progress: Callable[[ProgressRow], None] | None = None,
) -> FleetRun:
    """Start `fleet` (default: `local_fleet()`, CartPole-v1 on this machine) and return its handle at once.

    `host_name` picks this machine's roles of a fleet spread over several (default: its only host);
    `extra_args` appends arguments to every role of a kind ({"learner": ["--batch-size", "128"]}, or a shell line
    "--batch-size 128" as `apexrl launch --learner-arg` takes it); `on_progress` is called with each progress row,
    in the run's thread. A fleet on this machine alone given no token makes one of its own, which its roles
    require: `FleetRun.token_file` (RUN_DIR/token) for your own clients; `local_fleet(open=True)` runs it open.
    ConfigError (a ValueError) before any process starts when the fleet cannot run: a bad setting, a run directory
    that holds a run, a busy fixed port, an environment that cannot be made."""
    config = fleet if fleet is not None else local_fleet()
    if not isinstance(config, FleetConfig):
        raise ConfigError(
            f"fleet must be a FleetConfig (apexrl.local_fleet(...) or a fleet file's load_config), got {config!r}"
        )
    plan = plan_new(config, pick_host(config, host_name), _extra(extra_args))
    return start(plan, on_progress=on_progress)


def resume(
    run_dir: str | Path, *, on_progress: Callable[[ProgressRow], None] | None = None, **changes: Any
) -> FleetRun:
    """Continue the run in `run_dir` with the fleet its config.json records: the learner from its checkpoint,
    shards from theirs when the run kept them ([fleet] replay_durability, or a shard's checkpoint_dir; else the
    replay starts empty), progress.csv and the episode files appended to. `changes` may set only the
    settings that steer a launch (`apexrl.launcher.record.RESUMABLE`: max_seconds, target_return, token_file, ...);
    the token comes again from `token`/`token_file` or APEXRL_TOKEN, and a token the run made for itself from
    RUN_DIR/token (a new one when the file was removed)."""
    return start(plan_resume(Path(run_dir), changes), on_progress=on_progress)


class FleetRun:
    """A running fleet: its latest progress, its result, and stop(). A context manager that stops the fleet on
    exit. Thread-safe."""

    def __init__(self, launch: Launch) -> None:
        self._launch = launch
        self._result: RunResult | None = None
        self._error: BaseException | None = None
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="apexrl-launch", daemon=True)
        atexit.register(self._stop_at_exit)
        self._thread.start()

    @property
    def run_dir(self) -> Path:
        return self._launch.run_dir

    @property
    def token_file(self) -> Path | None:
        """RUN_DIR/token, the bearer token this local fleet made for itself (its roles require it; give it to your
        own clients: `ReplayClient(address, token=run.token_file.read_text().strip())`), or None when the fleet
        was given a token, runs open or spans machines."""
        return token_path(self.run_dir) if self._launch.run_token else None

    @property
    def running(self) -> bool:
        return not self._done.is_set()

    @property
    def result(self) -> RunResult | None:
        """The result once the run has ended, else None."""
        return self._result

    @property
    def exit_status(self) -> int | None:
        """What `apexrl launch` exits with for this run (0 solved or a clean stop where no target is checked,
        1 otherwise), once it has ended."""
        return None if self._result is None else self._launch.exit_status(self._result)

    def progress(self) -> ProgressRow | None:
        """The latest progress row (env steps, episodes, updates, returns, rates), or None before the first."""
        return self._launch.latest

    def wait(self, timeout: float | None = None) -> RunResult:
        """The result, once the run ends by itself (target, max_seconds, a role) or by stop(); TimeoutError when
        it still runs after `timeout` seconds."""
        if not self._done.wait(timeout):
            raise TimeoutError(f"the fleet in {self.run_dir} still runs after {timeout}s")
        if self._error is not None:
            raise RuntimeError(f"the launch of {self.run_dir} failed: {self._error}") from self._error
        assert self._result is not None
        return self._result

    def stop(self, timeout: float | None = None, *, kill: bool = False) -> RunResult:
        """Stop the fleet (SIGTERM, then SIGKILL after stop_grace; at once with `kill`) and return the result;
        its reason is "stopped" unless the run had ended already."""
        if not self._launch.stop.is_set():
            self._launch.stop_reason = "stopped"
            self._launch.stop.set()
        if kill:
            self._launch.force.set()
        return self.wait(timeout)

    def __enter__(self) -> FleetRun:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "running" if self.running else f"ended ({self._result.reason if self._result else 'error'})"
        return f"<FleetRun {self.run_dir} {state}>"

    def _run(self) -> None:
        try:
            self._result = self._launch.run()
        except BaseException as err:  # reported by wait(); the thread must not die silently
            log.exception("the launch of %s failed", self.run_dir)
            self._error = err
        finally:
            self._done.set()
            atexit.unregister(self._stop_at_exit)

    def _stop_at_exit(self) -> None:
        """The caller's process is exiting: its child roles must not outlive it."""
        if self.running:
            self.stop()


def start(
    plan: Plan,
    *,
    on_progress: Callable[[ProgressRow], None] | None = None,
    report: Callable[[str], None] | None = None,
    stop: threading.Event | None = None,
    force: threading.Event | None = None,
) -> FleetRun:
    """Lock the run directory and start the planned run in a background thread. `report` gets the lines about a
    failed run (default: the apexrl.launch log); `stop` and `force` are the CLI's signal events (a set `stop` ends
    the run with reason "signal")."""
    lock = RunLock.acquire(plan.run_dir)
    try:
        if not plan.resuming:
            check_new(plan.run_dir)  # again, under the lock: another launch may have taken it meanwhile
        if plan.run_token:  # before any role starts: the user's clients find it there from the first line on
            write_run_token(plan.run_dir, plan.config.token)
        run = Launch(
            plan.config,
            plan.host,
            plan.run_dir,
            plan.extra_args,
            lock=lock,
            options=plan.options,
            previous=plan.previous,
            first_started_at=plan.first_started_at,
            resumed_at=plan.resumed_at,
            run_token=plan.run_token,
            on_progress=on_progress,
            report=report,
            stop=stop,
            force=force,
        )
    except BaseException:
        lock.release()
        raise
    return FleetRun(run)


def plan_new(
    config: FleetConfig, host: str, extra_args: dict[str, list[str]], options: Mapping[str, Any] | None = None
) -> Plan:
    """A new run of `config`'s roles on `host`, checked (ConfigError otherwise)."""
    config = with_token(_with_algorithm(config))  # token, token_file or APEXRL_TOKEN, read once here
    run_dir = Path(config.run_dir or default_run_dir(EnvChoice.of(config)))
    check_new(run_dir)
    config, run_token = with_run_token(config, run_dir, reuse=False)  # a local fleet given none: its own
    _check(config, host, run_dir, extra_args)
    return Plan(config, host, run_dir, extra_args, dict(options or {}), run_token=run_token)


def plan_resume(run_dir: Path, changes: Mapping[str, Any]) -> Plan:
    """The interrupted run in `run_dir`, to be continued with `changes`, checked (ConfigError otherwise)."""
    recorded = read_run(run_dir, changes)
    config = with_token(_with_algorithm(recorded.config))
    if recorded.needs_token and not config.token and not config.open:
        raise ConfigError(
            f"--resume: {run_dir}'s fleet ran with a bearer token, which config.json does not keep: give it "
            f"again (--token-file, --token or {TOKEN_VARIABLE})"
        )
    config, run_token = with_run_token(config, run_dir, reuse=True)  # RUN_DIR/token again, if it is there
    _check(config, recorded.host, run_dir, recorded.extra_args)
    return Plan(
        config,
        recorded.host,
        run_dir,
        recorded.extra_args,
        recorded.launch_options,
        previous=last_row(run_dir / "progress.csv"),
        first_started_at=recorded.started_at or "unknown",
        resumed_at=recorded.resumed_at,
        run_token=run_token,
    )


def pick_host(config: FleetConfig, host_name: str | None, where: str = "the fleet") -> str:
    """This machine's name in `config`: `host_name`, or the fleet's only host."""
    hosts = host_names(config)
    if host_name is None:
        if len(hosts) > 1:
            raise ConfigError(f"{where} spreads the fleet over {', '.join(hosts)}: pass --host-name")
        return hosts[0]
    if host_name not in hosts:
        raise ConfigError(f"--host-name {host_name!r} runs no role of {where}; hosts: {', '.join(hosts)}")
    return host_name


def _with_algorithm(config: FleetConfig) -> FleetConfig:
    from apexrl.launcher.commands import with_algorithm

    return with_algorithm(config)


def _check(config: FleetConfig, host: str, run_dir: Path, extra_args: dict[str, list[str]]) -> None:
    """Every check made before any process starts."""
    from apexrl.launcher.commands import check_commands
    from apexrl.launcher.fleet import check_fixed_ports

    check_commands(config, host, run_dir, extra_args)
    check_fixed_ports(config, host)
    if any(r.kind != "replay" for r in roles_on(config, host)):
        from apexrl.common.environments import env_spaces  # gymnasium: a shards-only machine may lack it

        try:
            env_spaces(EnvChoice.of(config))
        except ValueError as err:
            raise ConfigError(f"--env: {err}") from None


def _extra(extra_args: Mapping[str, Sequence[str] | str] | None) -> dict[str, list[str]]:
    if extra_args is not None and not isinstance(extra_args, Mapping):
        raise ConfigError(f"extra_args must be a dict of role kind -> arguments, got {extra_args!r}")
    unknown = sorted(set(extra_args or {}) - set(ROLE_KINDS))
    if unknown:
        raise ConfigError(f"extra_args: unknown role kind {unknown} (one of {', '.join(ROLE_KINDS)})")
    extra: dict[str, list[str]] = {}
    for kind in ROLE_KINDS:
        args = (extra_args or {}).get(kind, ())
        if isinstance(args, str):  # a shell line, as --learner-arg takes it (not a list of its characters)
            try:
                args = shlex.split(args)
            except ValueError as err:
                raise ConfigError(f"extra_args[{kind!r}]: {err} in {args!r}") from None
        if not isinstance(args, list | tuple) or not all(isinstance(a, str) for a in args):
            raise ConfigError(f"extra_args[{kind!r}] must be a list of strings or a shell line, got {args!r}")
        extra[kind] = list(args)
    return extra
