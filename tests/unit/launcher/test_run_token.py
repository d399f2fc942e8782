"""Which fleets make a bearer token of their own (launcher/run_token.py): a fleet on one machine given no token of
any kind and not open; never one given a token, role tokens or a role table's own, one spread over machines, or one
told to run open. No process is started here."""

from __future__ import annotations

import dataclasses
import os
import stat

import pytest

from apexrl.launcher.api import plan_resume
from apexrl.launcher.fleet_config import ConfigError
from apexrl.launcher.fleet_file import parse_config
from apexrl.launcher.run_token import token_path, wants_run_token, with_run_token, write_run_token
from apexrl.launcher.topology import local_fleet
from tests.unit.launcher.fleets import fleet
from tests.unit.launcher.test_record import write_run

ONE_MACHINE = {"actors": [{"host": "m1", "count": 2}]}  # every role of fleet() on m1


@pytest.mark.parametrize(
    ("config", "wanted"),
    [
        (lambda: local_fleet(), True),
        (lambda: parse_config(fleet(**ONE_MACHINE)), True),  # a fleet file naming one machine
        (lambda: local_fleet(token="given"), False),
        (lambda: local_fleet(open=True), False),
        (lambda: parse_config(fleet()), False),  # two machines: each launcher would make another
        (
            lambda: parse_config(fleet(**ONE_MACHINE, learner={"host": "m1", "port": 7100, "token": "own"})),
            False,
        ),
        (lambda: parse_config(fleet(**ONE_MACHINE, evaluator={"host": "m1", "token_file": "/t"})), False),
    ],
    ids=["local", "one-machine file", "token", "open", "two machines", "table token", "table token file"],
)
def test_only_a_local_fleet_given_no_token_makes_its_own(config, wanted):
    assert wants_run_token(config()) is wanted


def test_role_tokens_make_no_token(tmp_path):
    tokens = tmp_path / "tokens"
    tokens.mkdir()
    for role in ("learner", "actor", "evaluator"):
        (tokens / role).write_text(role)
        (tokens / role).chmod(0o600)
    assert not wants_run_token(local_fleet(role_tokens=str(tokens)))


def test_a_new_run_gets_a_fresh_token_and_a_resume_reads_the_runs_file(tmp_path):
    config = local_fleet()
    first, made = with_run_token(config, tmp_path, reuse=False)
    again, _ = with_run_token(config, tmp_path, reuse=False)
    assert made and len(first.token) >= 43 and again.token != first.token  # 32 random bytes each time
    assert with_run_token(config, tmp_path, reuse=True)[0].token not in (None, first.token)  # no file yet
    path = write_run_token(tmp_path, first.token)
    assert path == token_path(tmp_path) and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert with_run_token(config, tmp_path, reuse=True) == (first, True)
    assert with_run_token(dataclasses.replace(config, open=True), tmp_path, reuse=True)[0].token is None
    path.write_text("\n")
    with pytest.raises(ConfigError, match=r"the run's token .*token is empty: remove it"):
        with_run_token(config, tmp_path, reuse=True)


def test_the_file_is_the_owners_alone_whatever_the_umask(tmp_path):
    previous = os.umask(0)
    try:
        (tmp_path / "token").write_text("readable by all\n")
        path = write_run_token(tmp_path, "s3cret")
    finally:
        os.umask(previous)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and path.read_text() == "s3cret\n"


@pytest.mark.parametrize("given", [{"token": "t"}, {"token_file": "/run/token"}])
def test_open_with_a_token_is_refused(given):
    with pytest.raises(ConfigError, match="open and a bearer token together"):
        local_fleet(open=True, **given)


def test_a_recorded_run_with_a_given_token_resumes_open_only_when_told(tmp_path, monkeypatch):
    monkeypatch.delenv("APEXRL_TOKEN", raising=False)
    config = local_fleet(num_shards=1, num_actors=1, run_dir=str(tmp_path), token="s3cret")
    write_run(tmp_path, config)
    with pytest.raises(ConfigError, match="ran with a bearer token, which config.json does not keep"):
        plan_resume(tmp_path, {})
    plan = plan_resume(tmp_path, {"open": True})
    assert plan.config.open and plan.config.token is None and not plan.run_token
