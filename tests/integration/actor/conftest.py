"""Fixtures of the actor tests: a parameter service on loopback and an actor's run() in a thread."""

from __future__ import annotations

import threading

import pytest
from prometheus_client import CollectorRegistry

from apexrl.actor.apex_actor import ApeXActor
from apexrl.actor.config import ActorConfig
from apexrl.common.episodes import EpisodeLog
from apexrl.parameter_server.service import create_parameter_server

GAMMA = 0.9
BATCH = 16


class Params:
    """A parameter service on 127.0.0.1 with its registry (to see the actor's fetches)."""

    def __init__(self, port: int = 0) -> None:
        self.registry = CollectorRegistry()
        made = create_parameter_server(f"127.0.0.1:{port}", registry=self.registry)
        self.server, self.port, self.store = made.server, made.port, made.store
        self.address = f"127.0.0.1:{self.port}"

    def fetches(self, result: str) -> float:
        return self.registry.get_sample_value("apexrl_params_fetches_total", {"result": result}) or 0.0


@pytest.fixture
def params():
    started: list[Params] = []

    def start(port: int = 0) -> Params:
        started.append(Params(port))
        return started[-1]

    yield start
    for p in started:
        p.server.stop(0)


class Running:
    """An actor's run() in a thread, stopped and closed at the end of the test."""

    def __init__(self, actor: ApeXActor, registry: CollectorRegistry) -> None:
        self.actor = actor
        self.registry = registry
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.actor.run(self.stop)
        except BaseException as err:  # noqa: BLE001 (the test inspects it)
            self.error = err

    def join(self, timeout: float = 30) -> None:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the actor did not finish"
        if self.error is not None:
            raise self.error

    def running(self) -> bool:
        """Still acting; re-raises the error that ended run()."""
        if self.error is not None:
            raise self.error
        return self.thread.is_alive()

    def metric(self, name: str) -> float:
        return self.registry.get_sample_value(name) or 0.0


@pytest.fixture
def run_actor(tmp_path):
    running: list[Running] = []

    def start(**settings) -> Running:
        config = ActorConfig(
            **{
                "seed": 0,
                "gamma": GAMMA,
                "batch_size": BATCH,
                "metrics_port": -1,
                "weights_wait_seconds": 30.0,
                **settings,
            }
        )
        csv = tmp_path / f"actor-{len(running)}.csv"
        registry = CollectorRegistry()
        running.append(Running(ApeXActor(config, registry, EpisodeLog(csv)), registry))
        running[-1].csv = csv
        return running[-1]

    yield start
    for r in running:
        r.stop.set()
        r.thread.join(30)
        r.actor.close(flush_timeout=0.5)
