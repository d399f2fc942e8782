"""Run documented shell commands as a reader would, against real processes, in bounded time.

    python -m tests.support.doc_runner < plan.json      # tests/integration/test_docs_commands.py builds the plan

The plan names a sandbox folder (created here, with a link to the repository's .venv and copies of the folders
the commands read, so that commands written for the repository root work unchanged and write nothing into the
repository) and the commands, in order. `cd DIR` moves the following commands into DIR, as in a shell. A command that starts a
long-running process (an `apexrl` role or `apexrl launch`, `prometheus`) is a service: it runs in its own process
group until it reports ready (its start-up line, its first progress line, Prometheus' /-/ready) and is stopped
with SIGTERM later, which it must survive cleanly (roles exit 0; `apexrl launch` prints its final JSON with reason
"signal"). Any other command runs to completion and must exit 0. With `together` every service runs until the end
(the roles of one fleet); without it each is stopped once ready (alternatives such as one launch per environment).
`checks` then look at the running services (a counter that must move, Prometheus scraping every target).

Meant to run inside a fresh network namespace (`--network-namespace` brings its loopback up): the documented fixed
ports (7000, 9090, ...) are then free whatever else this machine runs, and nothing leaves loopback. Exit status 0
when every step passed; the transcript on stdout says what ran, how long it took and, on a failure, the end of
each service's output.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

# Services: how to recognise the command, and the output line that says it is ready.
SERVICES = {
    "launch": (re.compile(r"(^|[\s/])apexrl\s+launch\b"), re.compile(r"^\[\s*\d+s\] env steps", re.M)),
    "replay": (re.compile(r"(^|[\s/])apexrl\s+replay\b"), re.compile(r"replay shard serving on")),
    "params": (re.compile(r"(^|[\s/])apexrl\s+params\b"), re.compile(r"parameter service serving on")),
    "learner": (re.compile(r"(^|[\s/])apexrl\s+learner\b"), re.compile(r"apexrl\.learner: learner for ")),
    "actor": (re.compile(r"(^|[\s/])apexrl\s+actor\b"), re.compile(r"got weights version")),
    "prometheus": (
        re.compile(r"(^|[\s;&|])prometheus\s+--config\.file"),
        None,
    ),  # ready: its /-/ready answers
}
READY_SECONDS = 150.0  # a Pong fleet on two loaded cores takes the longest
STOP_SECONDS = 60.0  # `apexrl launch` stops its roles in order, then writes its curve
ONE_SHOT_SECONDS = 60.0
CHECK_SECONDS = 90.0


class StepFailed(Exception):
    pass


@dataclass
class Service:
    kind: str
    command: str
    process: subprocess.Popen
    out_path: Path
    err_path: Path
    files: list[IO[bytes]] = field(default_factory=list)

    def output(self, stdout_only: bool = False) -> str:
        paths = [self.out_path] if stdout_only else [self.out_path, self.err_path]
        return "".join(p.read_text(errors="replace") for p in paths if p.exists())

    def tail(self, lines: int = 30) -> str:
        text = self.output().rstrip("\n").splitlines()[-lines:]
        return "\n".join(f"      | {line}" for line in text) or "      | (no output)"


def log(message: str) -> None:
    print(message, flush=True)


def service_kind(command: str) -> str | None:
    for kind, (pattern, _) in SERVICES.items():
        if pattern.search(command):
            return kind
    return None


def prometheus_url(command: str) -> str:
    match = re.search(r"--web\.listen-address[= ](\S+)", command)
    address = match.group(1) if match else "0.0.0.0:9090"
    return "http://127.0.0.1:" + address.rsplit(":", 1)[1]


def http_get(url: str, timeout: float = 2.0) -> bytes | None:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.read() if response.status == 200 else None
    except OSError:
        return None


class Runner:
    def __init__(self, plan: dict) -> None:
        self.plan = plan
        self.sandbox = Path(plan["sandbox"])
        self.cwd = self.sandbox
        self.services: list[Service] = []
        self.env = {
            **os.environ,
            "PYTHONUNBUFFERED": "1",
            "PATH": f"{self.sandbox / '.venv' / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
        }

    def prepare(self) -> None:
        self.sandbox.mkdir(parents=True, exist_ok=True)
        (self.sandbox / ".doc-logs").mkdir(exist_ok=True)
        repo = Path(self.plan["repo"])
        for name in self.plan["links"]:
            (self.sandbox / name).symlink_to(repo / name)
        for name in self.plan["copies"]:
            shutil.copytree(
                repo / name,
                self.sandbox / name,
                symlinks=True,
                ignore=shutil.ignore_patterns("node_modules", "runs", "__pycache__"),
            )

    def run(self) -> bool:
        self.prepare()
        ok = True
        try:
            for number, command in enumerate(self.plan["commands"]):
                self.step(number, command)
            for check in self.plan.get("checks", []):
                self.check(check)
        except StepFailed as err:
            log(f"FAILED: {err}")
            ok = False
        for service in reversed(self.services):
            try:
                self.stop(service)
            except StepFailed as err:
                log(f"FAILED: {err}")
                ok = False
        return ok

    def step(self, number: int, command: str) -> None:
        kind = service_kind(command)
        started = time.monotonic()
        cd = re.fullmatch(r"cd\s+(\S+)", command)
        if cd:
            log(f"$ {command}")
            self.cwd = (self.cwd / cd.group(1)).resolve()
            if not self.cwd.is_dir():
                raise StepFailed(f"{command!r}: no folder {self.cwd}")
            return
        if kind is None:
            log(f"$ {command}")
            try:
                done = subprocess.run(
                    ["bash", "-c", command],
                    cwd=self.cwd,
                    env=self.env,
                    capture_output=True,
                    text=True,
                    timeout=ONE_SHOT_SECONDS,
                )
            except subprocess.TimeoutExpired:
                raise StepFailed(f"{command!r} did not finish within {ONE_SHOT_SECONDS:.0f}s") from None
            if done.returncode != 0:
                raise StepFailed(
                    f"{command!r} exited with status {done.returncode}:\n{done.stdout}{done.stderr}"
                )
            log(f"    ok in {time.monotonic() - started:.1f}s")
            return
        log(f"$ {command}    [{kind}: run until ready]")
        logs = self.sandbox / ".doc-logs"
        out_path, err_path = logs / f"{number}-{kind}.out", logs / f"{number}-{kind}.err"
        out, err = open(out_path, "wb"), open(err_path, "wb")  # noqa: SIM115 (the service's lifetime)
        process = subprocess.Popen(
            ["bash", "-c", command],
            cwd=self.cwd,
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            start_new_session=True,
        )
        service = Service(kind, command, process, out_path, err_path, [out, err])
        try:
            self.wait_ready(service)
        except StepFailed:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            out.close()
            err.close()
            raise
        self.services.append(service)
        log(f"    ready in {time.monotonic() - started:.1f}s")
        if not self.plan.get("together", False):
            self.stop(service)
            self.services.remove(service)

    def wait_ready(self, service: Service) -> None:
        _, ready = SERVICES[service.kind]
        deadline = time.monotonic() + READY_SECONDS
        while True:
            if service.process.poll() is not None:
                raise StepFailed(
                    f"{service.command!r} exited with status {service.process.returncode} before it "
                    f"was ready:\n{service.tail()}"
                )
            if ready is not None:
                if ready.search(service.output(stdout_only=service.kind == "launch")):
                    return
            elif http_get(prometheus_url(service.command) + "/-/ready") is not None:
                return
            if time.monotonic() > deadline:
                raise StepFailed(
                    f"{service.command!r} was not ready within {READY_SECONDS:.0f}s:\n{service.tail()}"
                )
            time.sleep(0.25)

    def stop(self, service: Service) -> None:
        """SIGTERM its process group; it must exit cleanly within STOP_SECONDS."""
        started = time.monotonic()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(service.process.pid, signal.SIGTERM)
        try:
            code = service.process.wait(STOP_SECONDS)
        except subprocess.TimeoutExpired:
            os.killpg(service.process.pid, signal.SIGKILL)
            service.process.wait()
            raise StepFailed(
                f"{service.command!r} still ran {STOP_SECONDS:.0f}s after SIGTERM:\n{service.tail()}"
            ) from None
        finally:
            for f in service.files:
                f.close()
        self.wait_group_gone(service)
        if service.kind == "launch":
            last = (service.output(stdout_only=True).strip().splitlines() or [""])[-1]
            try:
                reason = json.loads(last).get("reason")
            except ValueError:
                reason = None
            if reason != "signal":
                raise StepFailed(
                    f"{service.command!r} did not end with its JSON line (reason signal) after SIGTERM "
                    f"(status {code}):\n{service.tail()}"
                )
        elif service.kind != "prometheus" and code != 0:
            raise StepFailed(
                f"{service.command!r} exited with status {code} after SIGTERM:\n{service.tail()}"
            )
        log(f"    stopped the {service.kind} with SIGTERM in {time.monotonic() - started:.1f}s")

    def wait_group_gone(self, service: Service) -> None:
        deadline = time.monotonic() + STOP_SECONDS
        while True:
            try:
                os.killpg(service.process.pid, 0)
            except ProcessLookupError:
                return
            if time.monotonic() > deadline:
                os.killpg(service.process.pid, signal.SIGKILL)
                raise StepFailed(f"processes of {service.command!r} outlived it by {STOP_SECONDS:.0f}s")
            time.sleep(0.1)

    def check(self, check: dict) -> None:
        what = check["kind"]
        log(f"check: {what} {json.dumps({k: v for k, v in check.items() if k != 'kind'})}")
        started = time.monotonic()
        deadline = started + CHECK_SECONDS
        while True:
            passed, seen = getattr(self, f"check_{what}")(**{k: v for k, v in check.items() if k != "kind"})
            for service in self.services:
                if service.process.poll() is not None:
                    raise StepFailed(
                        f"{service.command!r} exited during the checks (last seen: {seen}):\n{service.tail()}"
                    )
            if passed:
                log(f"    ok in {time.monotonic() - started:.1f}s: {seen}")
                return
            if time.monotonic() > deadline:
                raise StepFailed(f"check {what} did not pass within {CHECK_SECONDS:.0f}s: {seen}")
            time.sleep(0.5)

    def check_counter_above(self, url: str, name: str, above: float) -> tuple[bool, str]:
        """A Prometheus counter of a service's /metrics above a value (the fleet works, not only starts)."""
        body = http_get(url)
        if body is None:
            return False, f"{url} does not answer"
        for line in body.decode().splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                value = float(line.rsplit(" ", 1)[1])
                return value > above, f"{name} = {value:g}"
        return False, f"no {name} at {url}"

    def check_prometheus_scrapes(self, url: str, targets_file: str) -> tuple[bool, str]:
        """Prometheus scrapes every target of a launcher's file-SD targets file, and each is up."""
        expected = len(json.loads((self.sandbox / targets_file).read_text()))
        body = http_get(f"{url}/api/v1/targets")
        if body is None:
            return False, "Prometheus does not answer"
        active = json.loads(body)["data"]["activeTargets"]
        up = sum(t["health"] == "up" for t in active)
        return (
            expected > 0 and len(active) == expected and up == expected,
            f"{len(active)} active targets, {up} up, {expected} in {targets_file}",
        )


def main(argv: list[str]) -> int:
    if "--network-namespace" in argv:
        subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    return 0 if Runner(json.load(sys.stdin)).run() else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
