"""The launcher's view of a running fleet (launcher/progress.py): counters scraped from real /metrics endpoints on
127.0.0.1 and returns read from the episode CSVs, summed into progress rows."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

from apexrl.common.episodes import EVALUATE, EXPLORE, EpisodeLog, EpisodeRecord
from apexrl.launcher.progress import MIN_RATE_SECONDS, Progress, ProgressCsv, ProgressRow, format_row

START = 1_700_000_000.0


class Endpoint:
    """A role's /metrics on a free port, with the counters the launcher reads."""

    def __init__(self, role: str) -> None:
        self.registry = CollectorRegistry()
        if role == "actor":
            self.steps = Counter("apexrl_actor_env_steps", "steps", registry=self.registry)
            self.episodes = Counter("apexrl_actor_episodes", "episodes", registry=self.registry)
        else:
            self.updates = Counter("apexrl_learner_updates", "updates", registry=self.registry)
            self.version = Gauge("apexrl_learner_weight_version", "version", registry=self.registry)
        self.server, self.thread = start_http_server(0, addr="127.0.0.1", registry=self.registry)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/metrics"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def endpoints():
    made: list[Endpoint] = []

    def make(role: str) -> Endpoint:
        made.append(Endpoint(role))
        return made[-1]

    yield make
    for endpoint in made:
        endpoint.close()


def write(path, records) -> None:
    log = EpisodeLog(path)
    for r in records:
        log.write(r)
    log.close()


def episode(k: int, role: str, value: float) -> EpisodeRecord:
    return EpisodeRecord(START + k, 0, role, k, value, int(value), 1)


def test_rows_sum_the_actors_counters_and_read_the_learner(tmp_path, endpoints):
    a0, a1, learner = endpoints("actor"), endpoints("actor"), endpoints("learner")
    a0.steps.inc(1000)
    a0.episodes.inc(10)
    a1.steps.inc(500)
    a1.episodes.inc(4)
    learner.updates.inc(100)
    learner.version.set(7)
    progress = Progress(tmp_path, [a0.url, a1.url], learner.url, start_time=START)
    try:
        first = progress.tick(START + 5)
        assert (first.env_steps, first.episodes, first.updates, first.weight_version) == (1500, 14, 100, 7)
        assert first.updates_per_second is None and first.wall_seconds == 5
        assert first.env_steps_per_second is None
        learner.updates.inc(50)
        a1.steps.inc(250)
        second = progress.tick(START + 15)
        assert (second.env_steps, second.updates) == (1750, 150)
        assert second.updates_per_second == pytest.approx(5.0)  # 50 updates in 10 s
        # Both rates are over the last interval: 250 steps in 10 s, not 1,750 in the 15 s since launch.
        assert second.env_steps_per_second == pytest.approx(25.0)
        assert "env steps 1,750 (25/s)" in format_row(second, 0) and "updates 150 (5.0/s)" in format_row(
            second, 0
        )
        # An endpoint that stops answering keeps its last values: the fleet's counters never jump back.
        a0.close()
        a1.steps.inc(1)
        third = progress.tick(START + 20)
        assert (third.env_steps, third.episodes) == (1751, 14)
    finally:
        progress.close()


def test_a_row_soon_after_the_last_repeats_its_rates_instead_of_measuring_a_sliver(tmp_path, endpoints):
    """The row written when a run stops comes a fraction of a second after the last tick: its rates would be the
    noise of that sliver (or 0 while a scrape lags); it repeats the last ones, and the next tick measures from the
    tick before it."""
    actor, learner = endpoints("actor"), endpoints("learner")
    progress = Progress(tmp_path, [actor.url], learner.url, start_time=START)
    try:
        progress.tick(START + 5)
        actor.steps.inc(1000)
        learner.updates.inc(100)
        second = progress.tick(START + 10)
        assert (second.env_steps_per_second, second.updates_per_second) == (200.0, 20.0)
        actor.steps.inc(7)  # 0.3 s later
        last = progress.tick(START + 10 + MIN_RATE_SECONDS * 0.3)
        assert last.env_steps == 1007
        assert (last.env_steps_per_second, last.updates_per_second) == (200.0, 20.0)
        actor.steps.inc(493)  # 500 steps in the 5 s since the tick the rate is measured from
        after = progress.tick(START + 15)
        assert (after.env_steps_per_second, after.updates_per_second) == (100.0, 0.0)
    finally:
        progress.close()


def test_returns_come_from_the_csvs_and_the_mean_is_over_the_last_100_evaluation_episodes(tmp_path):
    write(tmp_path / "evaluator.csv", [episode(k, EVALUATE, 480.0) for k in range(99)])
    write(tmp_path / "actor-0.csv", [episode(k, EXPLORE, 9.0) for k in range(3)])
    progress = Progress(tmp_path, [], None, start_time=START)
    row = progress.tick(START + 1)
    assert row.mean_return_100 == 480.0 and row.mean_explore_return_100 == 9.0
    assert row.episodes == 3 and row.updates is None  # no actor endpoints: explore episodes read here
    with open(tmp_path / "evaluator.csv", "a") as f:  # what EpisodeLog appends
        f.write(",".join(episode(99, EVALUATE, 440.0).to_row()) + "\n")
    row = progress.tick(START + 2)
    assert progress.eval_episodes == 100 and row.mean_return_100 == pytest.approx(479.6)
    # Only the last 100 count.
    with open(tmp_path / "evaluator.csv", "a") as f:
        f.write("".join(",".join(episode(100 + k, EVALUATE, 10.0).to_row()) + "\n" for k in range(50)))
    progress.tick(START + 3)
    assert progress.eval_mean() == pytest.approx((49 * 480 + 440 + 50 * 10) / 100)
    assert "eval return 244.6 (last 100 of 150)" in format_row(
        progress.tick(START + 4), progress.eval_episodes
    )


def test_progress_csv_has_one_row_per_tick(tmp_path):
    out = ProgressCsv(tmp_path / "progress.csv")
    out.write(ProgressRow(5.0, 100, 2, None, None, None, None, None, START + 5))
    out.write(ProgressRow(10.0, 300, 4, 12, 2.4, 20.5, 9.0, 3, START + 10, restarts=2))
    out.close()
    lines = (tmp_path / "progress.csv").read_text().splitlines()
    assert lines[0] == ",".join(ProgressRow.columns())
    assert lines[1:] == [
        f"5.0,100,2,,,,,,{START + 5},0,,0",
        f"10.0,300,4,12,2.4,20.5,9.0,3,{START + 10},2,,0",
    ]
