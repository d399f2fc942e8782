"""The per-episode CSV (common/episodes.py): written by actors, tailed by the launcher while they write, merged."""

from __future__ import annotations

import csv

import pytest

from apexrl.common.episodes import (
    COLUMNS,
    EVALUATE,
    EXPLORE,
    EpisodeLog,
    EpisodeRecord,
    EpisodeTail,
    merge_episode_files,
    read_episodes,
)

START = 1_700_000_000.0


def record(k: int, role: str = EVALUATE, actor: int = 0) -> EpisodeRecord:
    return EpisodeRecord(
        wall_time=START + k,
        actor=actor,
        role=role,
        env_steps=10 * k,
        episode_return=100.0 + k + 0.25,
        length=100 + k,
        weight_version=k // 3,
    )


def test_a_log_round_trips_every_field_and_writes_the_header_once(tmp_path):
    path = tmp_path / "episodes" / "actor-3.csv"  # the folder is created
    log = EpisodeLog(path)
    written = [record(k, EXPLORE, actor=3) for k in range(5)]
    for r in written[:3]:
        log.write(r)
    log.close()
    log = EpisodeLog(path)  # a restarted actor appends to its file
    for r in written[3:]:
        log.write(r)
    log.close()
    lines = path.read_text().splitlines()
    assert lines[0] == ",".join(COLUMNS) and lines.count(",".join(COLUMNS)) == 1
    assert read_episodes(path) == written  # floats survive exactly (repr), wall time to the millisecond


def test_every_line_is_readable_while_the_writer_keeps_the_file_open(tmp_path):
    path = tmp_path / "evaluator.csv"
    log = EpisodeLog(path)
    tail = EpisodeTail(path)
    try:
        log.write(record(0))
        assert tail.read_new() == [record(0)]  # flushed line by line, not at close
        assert tail.read_new() == []
        log.write(record(1))
        log.write(record(2))
        assert tail.read_new() == [record(1), record(2)]
    finally:
        log.close()


def test_a_half_written_line_waits_and_a_malformed_line_is_skipped(tmp_path):
    path = tmp_path / "evaluator.csv"
    whole = "".join(",".join(record(k).to_row()) + "\n" for k in range(99))
    path.write_text(",".join(COLUMNS) + "\n" + whole + f"{START + 200:.3f},0,eval")
    tail = EpisodeTail(path)
    assert len(tail.read_new()) == 99
    assert tail.read_new() == []  # the half-written line is not a record yet
    with open(path, "a") as f:
        f.write("uate,990,490.0,490,2\n")
        f.write("not,a,record\n")  # wrong number of columns
        f.write(f"{START + 201},0,evaluate,xx,1.0,1,1\n")  # env_steps not an integer
        f.write(f"{START + 202:.3f},0,evaluate,991,491.5,491,2\n")
    new = tail.read_new()
    assert [(r.role, r.env_steps, r.episode_return, r.length, r.weight_version) for r in new] == [
        (EVALUATE, 990, 490.0, 490, 2),
        (EVALUATE, 991, 491.5, 491, 2),
    ]


def test_a_missing_file_reads_as_no_episodes_until_it_appears(tmp_path):
    path = tmp_path / "actor-0.csv"
    tail = EpisodeTail(path)
    assert tail.read_new() == []
    EpisodeLog(path).close()
    assert tail.read_new() == []  # only the header
    assert read_episodes(path) == []


def test_files_merge_sorted_by_wall_time(tmp_path):
    evaluator, actor = tmp_path / "evaluator.csv", tmp_path / "actor-0.csv"
    for path, records in (
        (evaluator, [record(k) for k in (0, 2, 4)]),
        (actor, [record(k, EXPLORE, actor=0) for k in (1, 3)]),
    ):
        log = EpisodeLog(path)
        for r in records:
            log.write(r)
        log.close()
    with open(actor, "a") as f:
        f.write(f"{START + 9:.3f},0,explo")  # a half-written line is not merged
    out = tmp_path / "episodes.csv"
    assert merge_episode_files([evaluator, actor], out) == 5
    merged = list(csv.DictReader(out.read_text().splitlines()))
    assert [float(r["wall_time"]) for r in merged] == [START + k for k in range(5)]
    assert [r["role"] for r in merged] == [EVALUATE, EXPLORE, EVALUATE, EXPLORE, EVALUATE]
    assert not list(tmp_path.glob(".*tmp*"))  # written atomically


@pytest.mark.parametrize("row", [[], ["1"] * (len(COLUMNS) - 1), ["x", "0", EXPLORE, "1", "1.0", "1", "1"]])
def test_from_row_refuses_what_is_not_a_record(row):
    assert EpisodeRecord.from_row(row) is None
