"""Where the bearer token comes from (common/process.py: --token, then --token-file, then APEXRL_TOKEN), how servers
compare it (common/grpc_util.py: constant time) and which bind addresses count as loopback (the plaintext
warning stays quiet there)."""

from __future__ import annotations

import hmac
import os

import pytest

from apexrl.common import access, grpc_util
from apexrl.common.process import TOKEN_VARIABLE, resolve_token, with_token
from apexrl.common.settings import SettingsError
from apexrl.replay_server.server.config import ReplayConfig


@pytest.fixture
def token_file(tmp_path):
    def write(text: str, mode: int = 0o600):
        path = tmp_path / "token"
        path.write_text(text)
        path.chmod(mode)
        return str(path)

    return write


def test_the_flag_wins_then_the_file_then_the_environment(token_file):
    path = token_file("from-file\n")
    env = {TOKEN_VARIABLE: "from-env"}
    assert resolve_token("from-flag", path, env) == "from-flag"
    assert resolve_token(None, path, env) == "from-file"
    assert resolve_token(None, None, env) == "from-env"
    assert resolve_token(None, None, {}) is None


def test_surrounding_whitespace_is_stripped_from_the_file_and_the_variable(token_file):
    assert resolve_token(None, token_file("  s3cret \n\n"), {}) == "s3cret"
    assert resolve_token(None, None, {TOKEN_VARIABLE: "s3cret\n"}) == "s3cret"


@pytest.mark.parametrize("case", ["missing", "empty", "blank", "directory"])
def test_a_token_file_that_gives_no_token_is_one_line_naming_the_path(case, token_file, tmp_path):
    path = {
        "missing": str(tmp_path / "nope"),
        "empty": token_file(""),
        "blank": token_file(" \n\t\n"),
        "directory": str(tmp_path),
    }[case]
    with pytest.raises(SettingsError) as err:
        resolve_token(None, path, {TOKEN_VARIABLE: "from-env"})  # a file asked for never falls back silently
    message = str(err.value)
    assert message.startswith("--token-file: ") and path in message and "\n" not in message


def test_an_unreadable_token_file_is_refused(token_file):
    if os.geteuid() == 0:
        pytest.skip("root reads any file")
    path = token_file("s3cret", mode=0o000)
    with pytest.raises(SettingsError, match=f"--token-file: cannot read {path}: Permission denied"):
        resolve_token(None, path, {})


def test_an_empty_variable_is_refused_rather_than_running_unauthenticated():
    with pytest.raises(SettingsError, match=f"{TOKEN_VARIABLE} is set but empty"):
        resolve_token(None, None, {TOKEN_VARIABLE: "  "})


def test_a_token_file_others_can_read_is_used_with_a_warning(token_file, caplog):
    assert resolve_token(None, token_file("s3cret", mode=0o644), {}) == "s3cret"
    assert "readable by other users (mode 0644): chmod 600 it" in caplog.text
    caplog.clear()
    resolve_token(None, token_file("s3cret", mode=0o600), {})
    assert "readable by other users" not in caplog.text


def test_a_group_readable_token_file_warns_only_for_a_group_this_process_is_not_in(token_file, caplog):
    own = token_file("s3cret", mode=0o440)  # a Kubernetes Secret volume: 0440, group = the pod's fsGroup
    os.chown(own, -1, os.getegid())
    resolve_token(None, own, {})
    assert "readable by other users" not in caplog.text
    foreign = token_file("s3cret", mode=0o440)
    groups = {os.getegid(), *os.getgroups()}
    other = next(gid for gid in range(1, 60000) if gid not in groups)
    try:
        os.chown(foreign, -1, other)
    except PermissionError:
        pytest.skip("only root may give a file to a group it is not in")
    resolve_token(None, foreign, {})
    assert "readable by other users (mode 0440)" in caplog.text


def test_a_role_config_gets_its_token_resolved_and_keeps_the_path(token_file):
    path = token_file("from-file")
    config = with_token(ReplayConfig(token_file=path), {TOKEN_VARIABLE: "from-env"})
    assert (config.token, config.token_file) == ("from-file", path)
    assert with_token(ReplayConfig(), {TOKEN_VARIABLE: "from-env"}).token == "from-env"
    assert with_token(ReplayConfig(token="from-flag", token_file=path), {}).token == "from-flag"


def test_the_servers_compare_tokens_in_constant_time(monkeypatch):
    compared = []
    compare_digest = hmac.compare_digest

    def spy(a, b):
        compared.append((a, b))
        return compare_digest(a, b)

    monkeypatch.setattr(access.hmac, "compare_digest", spy)  # the one check both server stacks call
    policy = access.AccessPolicy.single_token("s3cret")
    method = "/apexrl.v1.ReplayService/Info"

    assert policy.decide(method, (("authorization", "Bearer s3cret"),)) == access.FLEET
    assert isinstance(policy.decide(method, (("authorization", "Bearer wrong"),)), access.AccessDenied)
    assert isinstance(policy.decide(method, ()), access.AccessDenied)
    assert len(compared) == 2 and all(isinstance(a, bytes) and isinstance(b, bytes) for a, b in compared)


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.0.0.2", True),
        ("localhost", True),
        ("[::1]", True),
        ("::1", True),
        ("0.0.0.0", False),
        ("[::]", False),
        ("", False),
        ("10.0.0.5", False),
        ("apexrl-replay", False),
    ],
)
def test_loopback_addresses(host, loopback):
    assert grpc_util.is_loopback(host) is loopback
