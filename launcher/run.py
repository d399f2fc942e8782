"""One run of one machine's roles, from start to result: start the fleet, tick progress, stop it when the run is
over (target reached, max_seconds, a stop request, a role that finished or died past its budget), write the run
directory's results.

`Launch.run` blocks the thread that calls it and installs no signal handler: the CLI (launcher/main.py) calls it
from the main thread with its handlers in place, `apexrl.launch` (launcher/api.py) from a background thread.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from apexrl.actor.kept_policy import KeptRecord, record_path
from apexrl.algorithms.checkpoint_files import CHECKPOINT_NAME, KEPT_POLICY_NAME
from apexrl.common.report import json_line, plural
from apexrl.launcher.commands import describe_algorithm, target_return
from apexrl.launcher.fleet_config import FleetConfig
from apexrl.launcher.progress import ProgressRow
from apexrl.launcher.record import RECORD_KEY, fleet_record, write_record
from apexrl.launcher.run_dir import CONFIG_NAME, RunLock

if TYPE_CHECKING:
    from apexrl.launcher.fleet import Child, Fleet
    from apexrl.launcher.progress import Progress, ProgressCsv

log = logging.getLogger("apexrl.launch")

# Why a run ended, as RunResult.reason says it.
REASONS = (
    "target",  # the last 100 evaluation episodes reached the target return
    "max_seconds",  # this launch ran max_seconds
    "signal",  # SIGTERM, SIGINT or SIGHUP reached `apexrl launch`
    "stopped",  # FleetRun.stop() (Python)
    "role_exited",  # a role finished its work (exit status 0)
    "restart_budget_exhausted",  # a role kept dying
    "startup_failed",  # a role did not come up
)
CLEAN_STOPS = ("signal", "stopped", "max_seconds")


@dataclass(frozen=True)
class RunResult:
    """How a run ended: the fields of the JSON line `apexrl launch` prints last (`to_json`).

    Attributes:
        env_steps: exploring actors' environment steps over the whole run (a resumed run's included).
        episodes: exploration episodes (evaluation episodes are not counted).
        updates: the learner's gradient updates (None on a machine that runs no learner).
        mean_return_100: mean return of the last 100 evaluation episodes (None before the first).
        wall_seconds: the run's wall time, earlier launches of a resumed run included.
        solved: mean_return_100 reached target_return.
        target_return: the target checked, or None (no reward threshold and no target_return given).
        run_dir: the run directory.
        reason: why the run ended (one of REASONS).
        restarts, restarts_by_role: role restarts by this launch.
        kept_policy: the policy the evaluator kept (RUN_DIR/checkpoints/best.npz: the weights of the round that
            solved the run, else of its best round) and what they scored: path, weight_version, round,
            mean_return, episodes, mean_return_100, solved; None when no round was kept.
        last_checkpoint: the learner's last checkpoint (what a resume continues from), None before the first.
    """

    env_steps: int
    episodes: int
    updates: int | None
    mean_return_100: float | None
    wall_seconds: float
    solved: bool
    target_return: float | None
    run_dir: str
    reason: str
    restarts: int
    restarts_by_role: Mapping[str, int]
    kept_policy: Mapping[str, Any] | None = None
    last_checkpoint: str | None = None

    def to_json(self) -> str:
        """The JSON line, floats rounded as in every apexrl JSON line (`apexrl.common.report`)."""
        return json_line(
            {
                **dataclasses.asdict(self),
                "restarts_by_role": dict(self.restarts_by_role),
                "kept_policy": None if self.kept_policy is None else dict(self.kept_policy),
            }
        )


@dataclass
class _RunState:
    """What the phases of `Launch._run` hand on to each other: the fleet, the progress files, the last progress
    row, and how the run ended so far (reason stays "signal" until a phase knows better)."""

    fleet: Fleet
    progress_csv: ProgressCsv
    progress: Progress | None = None  # None until the roles started
    row: ProgressRow | None = None
    solved: bool = False
    reason: str = "signal"


class Launch:
    """One run of one machine's roles, from start to the result."""

    def __init__(
        self,
        config: FleetConfig,
        host: str,
        run_dir: Path,
        extra: dict[str, list[str]],
        *,
        lock: RunLock,
        options: Mapping[str, Any] | None = None,
        previous: ProgressRow | None = None,
        first_started_at: str | None = None,
        resumed_at: tuple[str, ...] = (),
        run_token: bool = False,
        on_progress: Callable[[ProgressRow], None] | None = None,
        report: Callable[[str], None] | None = None,
        stop: threading.Event | None = None,
        force: threading.Event | None = None,
    ) -> None:
        from apexrl.launcher.topology import checks_target

        self.config = config
        self.host = host
        self.run_dir = run_dir
        self.extra = extra
        self.lock = lock
        self.options = dict(options or {})
        self.previous = previous  # the interrupted run's last progress row, when this one resumes it
        self.first_started_at = first_started_at  # the run's first start, when this launch resumes it
        self.resumed_at = resumed_at  # earlier resumes' starts
        self.resuming = first_started_at is not None
        self.run_token = run_token  # config.token is the run's own, in RUN_DIR/token (launcher/run_token.py)
        self.on_progress = on_progress
        self.report = report or log.error
        self.progress_seconds = config.progress_seconds
        self.stop_grace = config.stop_grace
        self.target = target_return(config)
        self.kept_path = run_dir / "checkpoints" / KEPT_POLICY_NAME  # the evaluator's kept policy
        self.kept_record = record_path(self.kept_path)
        self.checks_target = checks_target(config, host) and self.target is not None
        self.stop = stop or threading.Event()  # set to end the run
        self.force = force or threading.Event()  # set to kill the roles at once (a second Ctrl-C)
        self.stop_reason = "signal"  # what `stop` stands for: FleetRun.stop() makes it "stopped"
        self.latest: ProgressRow | None = None

    def exit_status(self, result: RunResult) -> int:
        """0 when solved (or, on a machine that does not check a target, after a clean stop), 1 otherwise."""
        if result.solved:
            return 0
        return 0 if not self.checks_target and result.reason in CLEAN_STOPS else 1

    def run(self) -> RunResult:
        try:
            return self._run(time.time())
        finally:
            self.lock.release()

    def _run(self, start: float) -> RunResult:
        """The run's phases in order: prepare, start the roles, supervise them until the run is over, stop them
        (however it ended, an exception included), then write the results and say how it ended."""
        from apexrl.launcher.fleet import Interrupted, StartupError

        state = self._prepare(start)
        try:
            self._announce()
            self._start_roles(state, start)
            self._supervise(state, start)
        except Interrupted:
            state.reason = self.stop_reason
        except StartupError as err:
            state.reason = "startup_failed"
            self.report(f"apexrl launch: fleet did not start: {err}")
        finally:
            self._stop_roles(state, start)
        self._write_results()
        return self._result(state, start)

    def _prepare(self, start: float) -> _RunState:
        """Build the fleet and write config.json before any role starts, so that a run that fails to start still
        leaves its record; open progress.csv."""
        from apexrl.launcher.fleet import Fleet
        from apexrl.launcher.progress import ProgressCsv

        fleet = Fleet(
            self.config,
            self.host,
            self.run_dir,
            extra_args=self.extra,
            stop=self.stop,
            inherit_fds=(self.lock.fd,),  # the run directory stays locked while any role of it runs
        )
        self._write_config(fleet, start)
        progress_csv = ProgressCsv(
            self.run_dir / "progress.csv", tensorboard_dir=self.run_dir / "tensorboard" / "episodes"
        )
        return _RunState(fleet, progress_csv)

    def _announce(self) -> None:
        """Say what this launch runs, and, when it resumes a run, what it continues from, before any role starts."""
        log.info(
            "%s %s on %s with %s; target return %s, at most %.0fs; run directory %s%s",
            "resuming" if self.resuming else "launching",
            self.config.env,
            self.host,
            describe_algorithm(self.config, self.host, self.run_dir, self.extra),
            self.target if self.checks_target else "not checked here",
            self.config.max_seconds,
            self.run_dir,
            self._access(),
        )
        if self.resuming:
            from apexrl.launcher.resume_state import resume_lines

            for level, line in resume_lines(self.config, self.host, self.run_dir, self.extra):
                log.log(level, line)

    def _access(self) -> str:
        """What the launch line says about the fleet's token: where the run's own is, or that it runs open."""
        if self.run_token:
            from apexrl.launcher.run_token import token_path

            path = token_path(self.run_dir)
            return f"; its bearer token is in {path} (your own clients: --token-file {path})"
        if self.config.open:
            return "; open: no bearer token, every local user may call its services (--open)"
        return ""

    def _start_roles(self, state: _RunState, start: float) -> None:
        """Start the roles, then record what started (config.json with the ports picked, the Prometheus targets) and
        the first progress row, which anchors the curve once all run."""
        from apexrl.launcher.prometheus_targets import write_targets

        state.fleet.start()
        self._write_config(state.fleet, start)
        write_targets(self.run_dir, state.fleet.config, self.host, state.fleet.roles)  # Prometheus file-SD
        state.progress = self._progress(state.fleet, start)
        state.row = self._tick(state.progress, state.progress_csv, time.time())
        threading.Thread(target=_import_plotting, name="import-matplotlib", daemon=True).start()

    def _supervise(self, state: _RunState, start: float) -> None:
        """Keep the roles running and tick progress until the run is over: a role finished or spent its restart
        budget, max_seconds passed, the target was reached, or `stop` was set. state.reason says which."""
        next_tick = time.time() + self.progress_seconds
        while not self.stop.is_set():
            child = state.fleet.supervise()
            if child is not None:
                self._role_ended(state, child)
                return
            now = time.time()
            if now - start >= self.config.max_seconds:
                state.reason = "max_seconds"
                return
            if now >= next_tick:
                restarts = sum(state.fleet.restart_counts.values())
                state.row = self._tick(state.progress, state.progress_csv, now, restarts=restarts)
                if self._target_reached(state, start):
                    return
                next_tick += self.progress_seconds
            self.stop.wait(0.2)
        state.reason = self.stop_reason

    def _role_ended(self, state: _RunState, child: Child) -> None:
        """A role left for good: it finished its work (the run is over) or kept dying (reported as a failure)."""
        failed = child.process.returncode != 0
        state.reason = "restart_budget_exhausted" if failed else "role_exited"
        if failed:
            self.report(
                f"apexrl launch: {child.role.name} died unexpectedly and its restart budget "
                f"({self.config.max_restarts} in {self.config.restart_window:.0f}s) is spent: "
                f"{child.describe_exit()}"
            )
        else:
            log.info("%s finished (exit status 0); stopping the fleet", child.role.name)

    def _target_reached(self, state: _RunState, start: float) -> bool:
        """True (and the run solved) once the evaluator records that a round of this launch reached the target."""
        verdict = self._verdict(start) if self.checks_target else None
        if verdict is None:
            return False
        state.solved, state.reason = True, "target"
        log.info(
            "solved: after evaluation round %d (weights v%d) the last 100 evaluation episodes "
            "average %.1f >= %g; those weights are kept in %s",
            verdict.round,
            verdict.weight_version,
            verdict.mean_return_100,
            self.target,
            self.kept_path,
        )
        return True

    def _stop_roles(self, state: _RunState, start: float) -> None:
        """Read the last counters (unless a second signal hurries the stop), stop the roles, close the progress
        files and rewrite config.json: however the run ended, so that no role outlives it."""
        if state.progress is None:  # startup did not finish: count what the started roles did
            state.progress = self._progress(state.fleet, start)
        if state.fleet.children and not self.force.is_set():
            try:
                state.row = self._tick(
                    state.progress,
                    state.progress_csv,
                    time.time(),
                    echo=False,
                    restarts=sum(state.fleet.restart_counts.values()),
                )  # last counters
            except Exception as err:  # the fleet must still be stopped
                log.warning("final progress read failed: %s", err)
        log.info("stopping %d roles (%s)", len(state.fleet.children), state.reason)
        state.fleet.stop(self.stop_grace, self.force)
        state.progress_csv.close()
        state.progress.close()
        self._write_config(state.fleet, start)

    def _result(self, state: _RunState, start: float) -> RunResult:
        """How the run ended, from its last progress row (or the resumed run's), the kept policy and the last
        checkpoint."""
        row = state.row or self.previous
        kept = KeptRecord.read(self.kept_record)
        verdict = kept if state.solved else None
        last = self.run_dir / "checkpoints" / CHECKPOINT_NAME
        return RunResult(
            env_steps=row.env_steps if row else 0,
            episodes=row.episodes if row else 0,
            updates=row.updates if row else None,
            # A solved run reports the episodes that solved it (later ones belong to a round cut short by the stop).
            mean_return_100=verdict.mean_return_100 if verdict is not None else state.progress.eval_mean(),
            wall_seconds=round(
                time.time() - start + (self.previous.wall_seconds if self.previous else 0.0), 3
            ),
            solved=state.solved,
            target_return=self.target,
            run_dir=str(self.run_dir),
            reason=state.reason,
            restarts=sum(state.fleet.restart_counts.values()),
            restarts_by_role=state.fleet.restart_counts,
            kept_policy=None if kept is None else {"path": str(self.kept_path), **_kept_fields(kept)},
            last_checkpoint=str(last) if last.is_file() else None,
        )

    def _verdict(self, start: float) -> KeptRecord | None:
        """The evaluator's record of the round that solved the run, when a round of this launch did."""
        record = KeptRecord.read(self.kept_record)
        if record is None or not record.solved or record.written_at < start:
            return None
        return record

    def _progress(self, fleet, start: float):
        from apexrl.launcher.progress import Progress

        return Progress(
            self.run_dir / "episodes", *self._metrics_urls(fleet), start_time=start, previous=self.previous
        )

    def _tick(self, progress, progress_csv, now: float, echo: bool = True, restarts: int = 0) -> ProgressRow:
        row = dataclasses.replace(progress.tick(now), restarts=restarts)
        progress_csv.write(row)
        self.latest = row
        if echo and self.on_progress is not None:
            try:
                self.on_progress(row)
            except Exception:  # a caller's callback must not end the run
                log.exception("on_progress callback failed")
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
        this_start = datetime.fromtimestamp(start).isoformat(timespec="seconds")
        doc = {
            "host_name": self.host,
            "run_dir": str(self.run_dir),
            "started_at": self.first_started_at or this_start,
            "resumed_at": [*self.resumed_at, this_start] if self.resuming else [],
            "launch_options": self.options,
            "checks_target": self.checks_target,
            "num_actors": self.config.num_actors,
            "progress_seconds": self.progress_seconds,
            "stop_grace": self.stop_grace,
            "pass_through_args": self.extra,
            # What --resume reads back; a token the run made for itself is its file's (a resume reads it there).
            RECORD_KEY: fleet_record(
                dataclasses.replace(self.config, token=None) if self.run_token else self.config
            ),
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
        write_record(self.run_dir / CONFIG_NAME, doc)

    def _write_results(self) -> None:
        from apexrl.common.episodes import merge_episode_files

        episodes = sorted((self.run_dir / "episodes").glob("*.csv"))
        count = merge_episode_files(episodes, self.run_dir / "episodes.csv")
        written = ["progress.csv", f"episodes.csv ({plural(count, 'episode')})"]
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


def _kept_fields(record: KeptRecord) -> dict[str, Any]:
    """What the final JSON says about the kept policy."""
    fields = record.as_dict()
    for name in ("target_return", "written_at"):  # the run's own target is beside it; the time says nothing
        fields.pop(name)
    return fields


def _import_plotting() -> None:
    """Import matplotlib while the fleet trains, so that drawing the curve at exit takes a moment, not seconds."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot  # noqa: F401
    except Exception:  # reported when plotting at exit
        pass
