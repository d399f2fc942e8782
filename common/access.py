"""Who may call what: the caller's identity (from a role token or a client certificate) and each service's method
access list (ACL).

Pure module (no gRPC): the server interceptors (common/grpc_util.py, common/aio_grpc.py) ask `AccessPolicy` who
a call comes from and whether that role may make it; servicers ask again where the identity matters inside a call
(the replay shard binds writer ids to it). docs/security.md has the threat model and the roles table.

Three modes, chosen by a server's settings:
- open: no token, no role tokens, no certificate roles. Every caller may do everything (a laptop, loopback).
- single token (`--token`): one secret for the whole fleet; whoever holds it may do everything (identity
  `fleet`). Meant for one-machine fleets, where every role runs as the same user anyway.
- roles: `--role-tokens DIR` (one file per identity, named `ROLE` or `ROLE.NAME`, holding its token) and/or
  `--certificate-roles` (under mutual TLS, the client certificate's common name `ROLE` or `ROLE.NAME`). Each
  role may call only the methods it needs (`METHOD_ROLES`); everything else is PERMISSION_DENIED.
Health checks are open in every mode (Kubernetes probes carry no credentials); server reflection is open to any
authenticated caller.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from apexrl.common.settings import SettingsError, setting

log = logging.getLogger(__name__)
audit_log = logging.getLogger("apexrl.audit")


class Role(str, Enum):
    """The roles of a fleet, each with the least set of methods it needs."""

    ACTOR = "actor"  # writes transitions, reads weights
    EVALUATOR = "evaluator"  # reads weights
    LEARNER = "learner"  # samples, updates priorities, publishes weights
    OPERATOR = "operator"  # checkpoints shards, reads state; no training data, no weights publishing
    FLEET = "fleet"  # single-token mode: the one secret of the fleet allows every method


REPLAY_SERVICE = "apexrl.v1.ReplayService"
PARAMETER_SERVICE = "apexrl.v1.ParameterService"
HEALTH_SERVICE = "grpc.health.v1.Health"
REFLECTION_SERVICES = ("grpc.reflection.v1alpha.ServerReflection", "grpc.reflection.v1.ServerReflection")

_READERS = frozenset({Role.ACTOR, Role.EVALUATOR, Role.LEARNER, Role.OPERATOR})

# Every apexrl method and the roles that may call it (Role.FLEET may call everything). A method missing here is
# refused to every role but the fleet's: a new RPC is closed until someone decides who needs it.
METHOD_ROLES: Mapping[str, frozenset[Role]] = {
    # Actors write; the learner and the operator may too, so that they can fix a table's signature by a first
    # insert where no --signature pins it (actors may not: one bad first insert would block every real writer).
    f"/{REPLAY_SERVICE}/Insert": frozenset({Role.ACTOR, Role.LEARNER, Role.OPERATOR}),
    f"/{REPLAY_SERVICE}/Sample": frozenset({Role.LEARNER}),
    f"/{REPLAY_SERVICE}/UpdatePriorities": frozenset({Role.LEARNER}),
    f"/{REPLAY_SERVICE}/StreamUpdatePriorities": frozenset({Role.LEARNER}),
    f"/{REPLAY_SERVICE}/Info": _READERS,
    f"/{REPLAY_SERVICE}/Checkpoint": frozenset({Role.OPERATOR}),
    f"/{PARAMETER_SERVICE}/Publish": frozenset({Role.LEARNER}),
    f"/{PARAMETER_SERVICE}/Fetch": _READERS,
    f"/{PARAMETER_SERVICE}/GetVersion": _READERS,
}
# Calls written to the audit log even when allowed: they change what the whole fleet sees.
AUDITED_METHODS = frozenset({f"/{REPLAY_SERVICE}/Checkpoint", f"/{PARAMETER_SERVICE}/Publish"})

_AUTH_HEADER = "authorization"
UNAUTHENTICATED_MESSAGE = "missing or wrong bearer token"
_BEARER = "Bearer "
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
# A role-tokens file holding the SHA-256 of a token rather than the token (what a server needs to verify it).
DIGEST_SUFFIX = ".sha256"


@dataclass(frozen=True)
class Identity:
    """Who a call comes from: `name` (a role token's file name, a certificate's common name, or `fleet`) and the
    role it acts in."""

    name: str
    role: Role

    def __str__(self) -> str:
        return self.name if self.name == self.role.value else f"{self.name} (role {self.role.value})"


FLEET = Identity("fleet", Role.FLEET)


def role_of_name(name: str) -> Role | None:
    """The role a `ROLE` or `ROLE.NAME` identity acts in (None when ROLE names no role; `fleet` is not one)."""
    role = name.split(".", 1)[0]
    try:
        found = Role(role)
    except ValueError:
        return None
    return None if found is Role.FLEET else found


def method_name(method: str) -> str:
    """`/apexrl.v1.ReplayService/Sample` -> `ReplayService/Sample`, for messages."""
    service, _, call = method.lstrip("/").rpartition("/")
    return f"{service.rsplit('.', 1)[-1]}/{call}"


class AccessDenied(Exception):
    """A call the policy refuses: `code` is "UNAUTHENTICATED" (no or an unknown credential) or
    "PERMISSION_DENIED" (a known identity whose role may not make this call); the message says which."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class AccessPolicy:
    """The identities a server knows and what each may call.

    `tokens` maps a bearer token to its identity; `certificate_roles` takes the identity of a caller without a
    token from its client certificate's common name. A policy with neither is open (every call allowed)."""

    def __init__(
        self,
        tokens: Mapping[str | bytes, Identity] | None = None,
        *,
        certificate_roles: bool = False,
        excluded: frozenset[Role] = frozenset(),
        closed: bool = False,
    ) -> None:
        # Kept as SHA-256 digests and compared with every one of them in constant time: how long a check takes
        # says nothing about how much of a guess matched, or which identity it came close to. A bytes key is
        # already a token's digest (a ROLE.sha256 file: the server never held the token).
        self._by_digest = [
            (key if isinstance(key, bytes) else _digest(key), identity)
            for key, identity in (tokens or {}).items()
        ]
        self.certificate_roles = certificate_roles
        # Open only with no credential at all: a policy that had some (`closed`) stays closed without them.
        self._open = not self._by_digest and not certificate_roles and not closed
        self.excluded = excluded  # roles no caller may act in here (see `without`)

    def without(self, role: Role) -> AccessPolicy:
        """This policy with no caller acting in `role` (by token or certificate): a learner publishing to the
        parameter service it hosts in-process, so the learner's identity is no use against it over the network."""
        return AccessPolicy(
            {digest: identity for digest, identity in self._by_digest if identity.role is not role},
            certificate_roles=self.certificate_roles,
            excluded=self.excluded | {role},
            closed=not self.is_open,
        )

    @classmethod
    def single_token(cls, token: str) -> AccessPolicy:
        return cls({token: FLEET})

    @classmethod
    def from_settings(
        cls, token: str | None, role_tokens: str | None, certificate_roles: bool
    ) -> AccessPolicy:
        """The policy of a server's settings (validated by `check_access_settings`)."""
        if role_tokens is not None:
            return cls(read_role_tokens(role_tokens), certificate_roles=certificate_roles)
        if token:
            return cls({token: FLEET}, certificate_roles=certificate_roles)
        return cls(certificate_roles=certificate_roles)

    @property
    def is_open(self) -> bool:
        return self._open

    @property
    def has_tokens(self) -> bool:
        return bool(self._by_digest)

    def identify(
        self,
        metadata: Iterable[tuple[str, str | bytes]],
        auth_context: Callable[[], Mapping[str, Sequence[bytes]]] | None = None,
    ) -> Identity:
        """The caller's identity: its bearer token's, else (with certificate roles) its certificate's; FLEET for
        an open policy. AccessDenied(UNAUTHENTICATED) when it has no known credential."""
        if self.is_open:
            return FLEET
        received = None
        for key, value in metadata or ():
            if key == _AUTH_HEADER:
                received = value.decode(errors="replace") if isinstance(value, bytes) else value
                break
        if received:
            identity = (
                self._token_identity(received.removeprefix(_BEARER)) if received.startswith(_BEARER) else None
            )
            if identity is not None:
                return identity
            raise AccessDenied("UNAUTHENTICATED", UNAUTHENTICATED_MESSAGE)
        if self.certificate_roles and auth_context is not None:
            identity = identity_of_certificate(auth_context())
            if identity.role in self.excluded:
                raise AccessDenied(
                    "PERMISSION_DENIED",
                    f"{identity.name} may not call this server (its role acts in-process)",
                )
            return identity
        raise AccessDenied(
            "UNAUTHENTICATED",
            UNAUTHENTICATED_MESSAGE
            if self._by_digest
            else "no client certificate naming a role (common name ROLE or ROLE.NAME)",
        )

    def _token_identity(self, token: str) -> Identity | None:
        digest, found = _digest(token), None
        for known, identity in self._by_digest:  # no early exit: every check costs the same
            if hmac.compare_digest(known, digest):
                found = identity
        return found

    def decide(
        self, method: str, metadata: Iterable[tuple[str, str | bytes]] | None
    ) -> Identity | AccessDenied | None:
        """What a server can decide about a call to `method` before it runs, from its metadata alone: the
        identity allowed to make it, the refusal (AccessDenied), or None when the caller's client certificate
        decides (certificate roles and no token: read in the call, `identify` with its auth context)."""
        if self.is_open or is_open_method(method):
            return FLEET
        metadata = tuple(metadata or ())
        if self.certificate_roles and not any(key == _AUTH_HEADER for key, _ in metadata):
            return None
        try:
            identity = self.identify(metadata)
            self.check(method, identity)
        except AccessDenied as denied:
            return denied
        return identity

    def check(self, method: str, identity: Identity) -> None:
        """AccessDenied(PERMISSION_DENIED) naming the identity, its role, the method and who may call it, when
        `identity` may not call `method`."""
        if not allows(identity.role, method):
            allowed = METHOD_ROLES.get(method)
            who = (
                ", ".join(sorted(r.value for r in allowed)) if allowed else "no role (not in the access list)"
            )
            raise AccessDenied(
                "PERMISSION_DENIED", f"{identity} may not call {method_name(method)} (allowed: {who})"
            )


def allows(role: Role, method: str) -> bool:
    """True when `role` may call `method` (a full gRPC method name)."""
    if role is Role.FLEET or is_open_method(method):
        return True
    if method.lstrip("/").split("/", 1)[0] in REFLECTION_SERVICES:
        return True
    return role in METHOD_ROLES.get(method, frozenset())


def is_open_method(method: str) -> bool:
    """Health checks need no credential at all (probes carry none)."""
    return method.startswith(f"/{HEALTH_SERVICE}/")


def identity_of_certificate(auth_context: Mapping[str, Sequence[bytes]]) -> Identity:
    """The identity a verified client certificate names by its common name (`ROLE` or `ROLE.NAME`);
    AccessDenied otherwise (UNAUTHENTICATED without a certificate, PERMISSION_DENIED for a name of no role)."""
    names = auth_context.get("x509_common_name") or ()
    if not names:
        raise AccessDenied("UNAUTHENTICATED", "no client certificate (certificate roles need mutual TLS)")
    name = names[0].decode(errors="replace") if isinstance(names[0], bytes) else str(names[0])
    role = role_of_name(name)
    if role is None:
        raise AccessDenied(
            "PERMISSION_DENIED",
            f"client certificate common name {name!r} names no role (want "
            f"ROLE or ROLE.NAME, ROLE one of {_role_names()})",
        )
    return Identity(name, role)


def read_role_tokens(directory: str) -> dict[str | bytes, Identity]:
    """The credentials of `directory`: each regular file named `ROLE` or `ROLE.NAME` (ROLE one of actor, evaluator,
    learner, operator) holds one identity's token (a str key), and each named `ROLE.sha256` or `ROLE.NAME.sha256`
    the SHA-256 of one, in hex (a bytes key: a server that verifies callers needs only these, and then holds no
    credential a client could use; `printf %s TOKEN | sha256sum`). SettingsError in one line for a missing
    directory, a file of no role, an empty or unreadable file, a digest that is not 64 hex digits, or one token
    given to two identities. Hidden files and the `..data` links of a Kubernetes Secret volume are skipped."""
    path = Path(directory)
    if not path.is_dir():
        raise SettingsError(f"--role-tokens: {directory} is not a directory")
    warn_if_exposed(path, "--role-tokens directory")
    tokens: dict[str | bytes, Identity] = {}
    seen: dict[bytes, str] = {}  # every credential's digest -> the identity it is
    for entry in sorted(path.iterdir()):
        if entry.name.startswith(".") or not entry.is_file():
            continue
        name, digest_file = entry.name.removesuffix(DIGEST_SUFFIX), entry.name.endswith(DIGEST_SUFFIX)
        if not digest_file:
            warn_if_exposed(entry, "role token file")
        role = role_of_name(name)
        if role is None or not _NAME.match(name):
            raise SettingsError(
                f"--role-tokens: {entry} names no role (name files ROLE or ROLE.NAME, ROLE one "
                f"of {_role_names()})"
            )
        try:
            token = entry.read_text().strip()
        except (OSError, UnicodeDecodeError) as err:
            raise SettingsError(f"--role-tokens: cannot read {entry}: {err}") from None
        if not token or any(c.isspace() for c in token):
            raise SettingsError(
                f"--role-tokens: {entry} must hold one {'digest' if digest_file else 'token'} (no spaces), found "
                f"{'nothing' if not token else 'whitespace inside'}"
            )
        key: str | bytes = token
        if digest_file:
            if not re.fullmatch(r"[0-9a-fA-F]{64}", token):
                raise SettingsError(f"--role-tokens: {entry} must hold a SHA-256 in hex (64 digits)")
            key = bytes.fromhex(token)
        digest = _as_digest(key)
        if digest in seen:
            raise SettingsError(
                f"--role-tokens: {entry} holds the same token as {seen[digest]}: give each identity its own"
            )
        seen[digest] = name
        tokens[key] = Identity(name, role)
    if not tokens:
        raise SettingsError(f"--role-tokens: {directory} holds no token files (ROLE or ROLE.NAME)")
    return tokens


# Permission bits that expose a credential: anyone on the machine may read a file, or replace one in a directory.
_WORLD_READABLE, _WORLD_WRITABLE = 0o004, 0o002


def warn_if_exposed(path: Path, what: str) -> bool:
    """Log a WARNING (and return True) when `path` is readable (a file) or writable (a directory) by every user of
    the machine: a token there is anyone's. Group access is left alone (a Kubernetes Secret volume mounts files
    0440 for the pod's fsGroup)."""
    try:
        mode = path.stat().st_mode
    except OSError:
        return False
    exposed = mode & (_WORLD_WRITABLE if path.is_dir() else _WORLD_READABLE | _WORLD_WRITABLE)
    if exposed:
        fix = "chmod o-w" if path.is_dir() else "chmod 600"
        log.warning(
            "%s %s is open to every user of this machine (mode %o): %s it", what, path, mode & 0o777, fix
        )
    return bool(exposed)


def check_access_settings(
    token: str | None, role_tokens: str | None, certificate_roles: bool, mutual_tls: bool
) -> None:
    """SettingsError for settings that cannot make a policy: a fleet token beside role tokens (it would allow
    every role), certificate roles without mutual TLS (no certificate to read)."""
    if token and role_tokens is not None:
        raise SettingsError(
            "--token and --role-tokens together: the single fleet token would allow every method "
            "to whoever holds it; a server in role mode takes role tokens only (unset "
            "--token/--token-file/APEXRL_TOKEN)"
        )
    if certificate_roles and not mutual_tls:
        raise SettingsError(
            "--certificate-roles needs mutual TLS (--tls-cert, --tls-key and --tls-ca): without "
            "client certificates there is no name to take the role from"
        )
    if role_tokens is not None:
        read_role_tokens(role_tokens)


def describe_access(config) -> str:
    """A server's access mode in words, for its start line (see the module docstring)."""
    if config.role_tokens is not None or config.certificate_roles:
        sources = [f"role tokens in {config.role_tokens}"] if config.role_tokens is not None else []
        return "roles from " + " and ".join(sources + ["client certificates"] * config.certificate_roles)
    return "single token" if config.token else "open: no token"


def role_tokens_setting() -> str | None:
    return setting(
        None,
        "directory of role tokens (server): one file per identity named ROLE or ROLE.NAME "
        "(actor, evaluator, learner, operator), holding its bearer token; each role may then call "
        "only its own methods (docs/security.md). Exclusive with --token",
        metavar="DIR",
    )


def certificate_roles_setting() -> bool:
    return setting(
        False,
        "server: take the role of a caller without a token from its client certificate's common "
        "name (ROLE or ROLE.NAME); needs mutual TLS (--tls-ca)",
    )


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


def _as_digest(key: str | bytes) -> bytes:
    return key if isinstance(key, bytes) else _digest(key)


def _role_names() -> str:
    return ", ".join(r.value for r in Role if r is not Role.FLEET)
