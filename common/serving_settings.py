"""The settings every server role shares, declared once: the interface it listens on, who may call it (token, role
tokens, client certificates), its TLS files, the plaintext health port and the port file. The replay shard, the
parameter service and the learner (which hosts one) compose `ServingSettings` into their configs; each declares
its own `port` and `metrics_port`, whose defaults and meaning are its own.

Keyword-only fields, so a role's required settings may come in any order beside them. No gRPC import: the launcher
reads these to plan a fleet.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from apexrl.common.access import (
    AccessPolicy,
    certificate_roles_setting,
    check_access_settings,
    role_tokens_setting,
)
from apexrl.common.addresses import check_listen, join_host_port
from apexrl.common.process import (
    health_port_setting,
    host_setting,
    port_file_setting,
    tls_ca_setting,
    tls_cert_setting,
    tls_key_setting,
    token_file_setting,
    token_setting,
)
from apexrl.common.tls import TlsFiles, check_health_port, tls_of


@dataclass(frozen=True, kw_only=True)
class ServingSettings:
    """Where and how a server role serves (the module docstring). Its config declares `port` and
    `metrics_port`."""

    host: str = host_setting()
    token: str | None = token_setting()
    token_file: str | None = token_file_setting()
    role_tokens: str | None = role_tokens_setting()
    certificate_roles: bool = certificate_roles_setting()
    tls_cert: str | None = tls_cert_setting()
    tls_key: str | None = tls_key_setting()
    tls_ca: str | None = tls_ca_setting()
    health_port: int | None = health_port_setting()
    port_file: str | None = port_file_setting()
    if TYPE_CHECKING:  # declared by each role: their defaults and meaning are its own
        port: int
        metrics_port: int

    def check_serving(self, *, serves: bool = True, token_is_verified: bool = True) -> None:
        """ValueError for settings that cannot serve: the ports, the TLS files (read and checked), the access
        settings, the health port. `serves` false: a role that only dials with these files (a learner publishing
        to a standalone service); `token_is_verified` false: its token is its own credential as a client, not
        what its server checks."""
        check_listen(self.host, self.port, self.metrics_port)
        tls = tls_of(self, serves=serves)
        check_access_settings(
            self.token if token_is_verified else None,
            self.role_tokens,
            self.certificate_roles,
            tls is not None and tls.mutual,
        )
        check_health_port(self.health_port, self.port)

    def tls(self) -> TlsFiles | None:
        """The TLS files it serves with (None: plaintext)."""
        return tls_of(self, serves=True)

    def access(self) -> AccessPolicy:
        """Who may call what (common/access.py): the single token, role tokens, client certificates; none of
        them: open."""
        return AccessPolicy.from_settings(self.token, self.role_tokens, self.certificate_roles)

    def address(self, port: int | None = None) -> str:
        """host:port of the service (`port` instead of the configured one, e.g. the port bound)."""
        return join_host_port(self.host, self.port if port is None else port)

    def health_address(self) -> str | None:
        """Where the plaintext health-only server listens, or None."""
        return None if self.health_port is None else join_host_port(self.host, self.health_port)
