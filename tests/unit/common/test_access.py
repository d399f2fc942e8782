"""The access policy alone (common/access.py): identities from role tokens and certificates, the method list."""

from __future__ import annotations

import hashlib

import pytest

from apexrl.common import access
from apexrl.common.access import FLEET, AccessDenied, AccessPolicy, Identity, Role
from apexrl.common.settings import SettingsError

REPLAY = "/apexrl.v1.ReplayService"
PARAMS = "/apexrl.v1.ParameterService"


def bearer(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)


@pytest.fixture
def tokens_dir(tmp_path):
    directory = tmp_path / "tokens"
    directory.mkdir()
    for name, token in {
        "actor": "t-actor",
        "actor.m2": "t-actor-m2",
        "learner": "t-learner",
        "evaluator": "t-eval",
        "operator": "t-op",
    }.items():
        (directory / name).write_text(token + "\n")
    return directory


@pytest.mark.parametrize(
    ("method", "allowed"),
    [
        (f"{REPLAY}/Insert", {"actor", "learner", "operator"}),
        (f"{REPLAY}/Sample", {"learner"}),
        (f"{REPLAY}/UpdatePriorities", {"learner"}),
        (f"{REPLAY}/StreamUpdatePriorities", {"learner"}),
        (f"{REPLAY}/Info", {"actor", "evaluator", "learner", "operator"}),
        (f"{REPLAY}/Checkpoint", {"operator"}),
        (f"{PARAMS}/Publish", {"learner"}),
        (f"{PARAMS}/Fetch", {"actor", "evaluator", "learner", "operator"}),
        (f"{PARAMS}/GetVersion", {"actor", "evaluator", "learner", "operator"}),
        (f"{REPLAY}/NoSuchMethod", set()),
    ],
)
def test_each_role_may_call_only_what_it_needs(method, allowed):
    for role in Role:
        assert access.allows(role, method) is (role is Role.FLEET or role.value in allowed), role


def test_health_and_reflection_stay_open_to_every_role():
    for role in Role:
        assert access.allows(role, "/grpc.health.v1.Health/Check")
        assert access.allows(role, "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo")


def test_role_tokens_name_identities_and_their_roles(tokens_dir):
    policy = AccessPolicy.from_settings(None, str(tokens_dir), False)
    assert policy.identify(bearer("t-actor")) == Identity("actor", Role.ACTOR)
    assert policy.identify(bearer("t-actor-m2")) == Identity("actor.m2", Role.ACTOR)
    assert policy.identify(bearer("t-learner")) == Identity("learner", Role.LEARNER)
    for metadata in (bearer("t-nobody"), (), (("authorization", "t-actor"),), bearer("")):
        with pytest.raises(AccessDenied) as denied:
            policy.identify(metadata)
        assert denied.value.code == "UNAUTHENTICATED"


def test_decide_refuses_a_role_naming_the_identity_the_method_and_who_may(tokens_dir):
    policy = AccessPolicy.from_settings(None, str(tokens_dir), False)
    decision = policy.decide(f"{REPLAY}/Sample", bearer("t-actor-m2"))
    assert isinstance(decision, AccessDenied) and decision.code == "PERMISSION_DENIED"
    assert str(decision) == "actor.m2 (role actor) may not call ReplayService/Sample (allowed: learner)"
    assert policy.decide(f"{REPLAY}/Sample", bearer("t-learner")) == Identity("learner", Role.LEARNER)
    assert policy.decide("/grpc.health.v1.Health/Check", ()) == FLEET


def test_single_token_and_open_policies_allow_everything():
    single = AccessPolicy.single_token("s3cret")
    assert single.decide(f"{REPLAY}/Checkpoint", bearer("s3cret")) == FLEET
    assert isinstance(single.decide(f"{REPLAY}/Checkpoint", bearer("other")), AccessDenied)
    assert AccessPolicy().is_open and AccessPolicy().decide(f"{PARAMS}/Publish", ()) == FLEET


def test_certificates_name_the_role_by_common_name():
    policy = AccessPolicy(certificate_roles=True)
    assert policy.decide(f"{REPLAY}/Sample", ()) is None  # read in the call, from its auth context
    assert policy.identify((), lambda: {"x509_common_name": [b"learner"]}) == Identity(
        "learner", Role.LEARNER
    )
    assert policy.identify((), lambda: {"x509_common_name": [b"actor.pod-3"]}) == Identity(
        "actor.pod-3", Role.ACTOR
    )
    for context, code in (
        ({"x509_common_name": [b"localhost"]}, "PERMISSION_DENIED"),
        ({"x509_common_name": [b"fleet"]}, "PERMISSION_DENIED"),
        ({}, "UNAUTHENTICATED"),
    ):
        with pytest.raises(AccessDenied) as denied:
            policy.identify((), lambda context=context: context)
        assert denied.value.code == code


@pytest.mark.parametrize(
    ("files", "message"),
    [
        ({"robot": "x"}, "names no role"),
        ({"fleet": "x"}, "names no role"),
        ({"actor": ""}, "must hold one token"),
        ({"actor": "two words"}, "must hold one token"),
        ({"actor": "same", "learner": "same"}, "same token"),
        ({}, "holds no token files"),
    ],
)
def test_bad_role_token_directories_are_refused_in_one_line(tmp_path, files, message):
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    with pytest.raises(SettingsError, match=message) as err:
        access.read_role_tokens(str(tmp_path))
    assert "\n" not in str(err.value)


def test_kubernetes_secret_volume_links_and_hidden_files_are_skipped(tmp_path):
    (tmp_path / "..data").mkdir()
    (tmp_path / ".hidden").write_text("whatever")
    (tmp_path / "learner").write_text("t-learner")
    assert access.read_role_tokens(str(tmp_path)) == {"t-learner": Identity("learner", Role.LEARNER)}


def test_settings_that_cannot_make_a_policy_are_refused(tokens_dir, tmp_path):
    with pytest.raises(SettingsError, match="--token and --role-tokens"):
        access.check_access_settings("s3cret", str(tokens_dir), False, False)
    with pytest.raises(SettingsError, match="needs mutual TLS"):
        access.check_access_settings(None, None, True, False)
    with pytest.raises(SettingsError, match="not a directory"):
        access.check_access_settings(None, str(tmp_path / "missing"), False, False)
    access.check_access_settings(None, str(tokens_dir), True, True)


def test_token_files_open_to_every_user_are_named_in_a_warning(tmp_path, caplog):
    import logging

    directory = tmp_path / "tokens"
    directory.mkdir(mode=0o700)
    (directory / "actor").write_text("t-actor")
    (directory / "learner").write_text("t-learner")
    (directory / "actor").chmod(0o600)
    (directory / "learner").chmod(0o644)
    with caplog.at_level(logging.WARNING, logger="apexrl.common.access"):
        access.read_role_tokens(str(directory))
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "learner" in warnings[0] and "chmod 600" in warnings[0]
    caplog.clear()
    directory.chmod(0o777)
    (directory / "learner").chmod(0o440)  # group-readable, as a Kubernetes Secret volume mounts it: fine
    with caplog.at_level(logging.WARNING, logger="apexrl.common.access"):
        access.read_role_tokens(str(directory))
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "directory" in warnings[0] and "chmod o-w" in warnings[0]
    directory.chmod(0o700)


def test_a_server_verifies_tokens_against_digest_files_without_holding_them(tmp_path):
    """ROLE.sha256 holds the SHA-256 of ROLE's token: a server reading it admits that token and holds nothing a
    client could present."""
    directory = tmp_path / "tokens"
    directory.mkdir()
    (directory / "learner.sha256").write_text(hashlib.sha256(b"t-learner").hexdigest() + "\n")
    (directory / "actor.m1.sha256").write_text(hashlib.sha256(b"t-actor-m1").hexdigest().upper())
    (directory / "actor").write_text("t-actor")  # a token file still works beside them
    policy = AccessPolicy.from_settings(None, str(directory), False)
    assert policy.identify(bearer("t-learner")) == Identity("learner", Role.LEARNER)
    assert policy.identify(bearer("t-actor-m1")) == Identity("actor.m1", Role.ACTOR)
    assert policy.identify(bearer("t-actor")) == Identity("actor", Role.ACTOR)
    with pytest.raises(AccessDenied):
        policy.identify(bearer(hashlib.sha256(b"t-learner").hexdigest()))  # the digest is no credential
    held = (directory / "learner.sha256").read_text()
    assert "t-learner" not in held


@pytest.mark.parametrize(
    ("files", "message"),
    [
        ({"learner.sha256": "abc"}, "64 digits"),
        ({"learner.sha256": "zz" * 32}, "64 digits"),
        ({"nobody.sha256": "00" * 32}, "names no role"),
        (
            {"actor": "same", "learner.sha256": __import__("hashlib").sha256(b"same").hexdigest()},
            "same token",
        ),
    ],
)
def test_bad_digest_files_are_refused_in_one_line(tmp_path, files, message):
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    with pytest.raises(SettingsError, match=message) as err:
        access.read_role_tokens(str(tmp_path))
    assert "\n" not in str(err.value)


def test_a_policy_without_a_role_refuses_that_role_and_never_opens(tmp_path):
    (tmp_path / "learner").write_text("t-learner")
    policy = AccessPolicy.from_settings(None, str(tmp_path), False).without(Role.LEARNER)
    assert not policy.is_open  # no identity left, and still closed: nobody gets in
    with pytest.raises(AccessDenied, match="missing or wrong bearer token"):
        policy.identify(bearer("t-learner"))
    (tmp_path / "actor").write_text("t-actor")
    policy = AccessPolicy.from_settings(None, str(tmp_path), False).without(Role.LEARNER)
    assert policy.identify(bearer("t-actor")) == Identity("actor", Role.ACTOR)
