"""TLS files: the PEM certificate chain and private key a process presents and the CA bundle it verifies peers
with, read and checked once. `grpc_util` turns them into gRPC credentials; this module imports no gRPC, so every
role's settings dataclass can check its files (and the launcher can check every role's) before anything starts.

What each file does:
- `cert` + `key`: a server's identity; a client's too, when it has them (mutual TLS).
- `ca`: clients verify servers with it (none: the system's roots). A server given a CA requires every client to
  present a certificate signed by it: mutual TLS.
- `server_name` (clients only): the name every server's certificate must hold, checked instead of the address
  dialled. Shards found through a Kubernetes headless Service are dialled by pod IP, which no certificate names
  (pods come and go); with one name (`apexrl-replay.NAMESPACE.svc`) one certificate serves every shard.

    tls = TlsFiles.read(cert="node.pem", key="node-key.pem", ca="ca.pem")   # ValueError naming a bad file
    ReplayClient("127.0.0.1:7000", tls=tls)

TlsFiles.read keeps the paths beside the bytes: servers and clients built from them pick up renewed files without
a restart (common/tls_reload.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

_CERTIFICATE = b"-----BEGIN CERTIFICATE-----"
_PRIVATE_KEY_HEADERS = (
    b"-----BEGIN PRIVATE KEY-----",
    b"-----BEGIN RSA PRIVATE KEY-----",
    b"-----BEGIN EC PRIVATE KEY-----",
)
# A DNS name or an IPv4 address as a certificate holds it: dot-separated labels of letters, digits, '-' and '_'.
_LABEL = r"[A-Za-z0-9_](?:[A-Za-z0-9_-]*[A-Za-z0-9_])?"
_SERVER_NAME = re.compile(rf"{_LABEL}(?:\.{_LABEL})*")


@dataclass(frozen=True)
class TlsFiles:
    """PEM bytes of a process's TLS identity and trust (see the module docstring); all None: TLS off."""

    cert: bytes | None = None
    key: bytes | None = None
    ca: bytes | None = None
    server_name: str | None = None  # clients: the name servers' certificates are checked against
    # Where the bytes were read from (None: given as bytes): what common/tls_reload.py watches for renewals. Not
    # compared: equal TlsFiles hold the same credentials, wherever they were read from.
    cert_path: str | None = field(default=None, compare=False)
    key_path: str | None = field(default=None, compare=False)
    ca_path: str | None = field(default=None, compare=False)

    @classmethod
    def read(
        cls,
        cert: str | None = None,
        key: str | None = None,
        ca: str | None = None,
        *,
        serves: bool = False,
        server_name: str | None = None,
    ) -> TlsFiles:
        """Read and check the files. ValueError, naming the setting and the path, when cert and key are not
        given together, a file cannot be read or holds no PEM of its kind; with `serves` (the process is a
        server), also when a CA is given without the certificate and key a TLS server needs; when `server_name`
        is not a host name, or is given without any file (it names what a TLS connection verifies)."""
        if server_name is not None:
            check_server_name(server_name)
            if cert is None and key is None and ca is None:
                raise ValueError(
                    f"tls_server_name ({server_name}) needs tls_ca or tls_cert: it is the name TLS "
                    f"checks the servers' certificates against, and without TLS files this process "
                    f"dials plaintext"
                )
        if (cert is None) != (key is None):
            given, missing = ("tls_cert", "tls_key") if key is None else ("tls_key", "tls_cert")
            raise ValueError(
                f"{missing} is missing: {given} ({cert if key is None else key}) needs it (a "
                f"certificate and its private key go together)"
            )
        if serves and ca is not None and cert is None:
            raise ValueError(
                f"tls_ca ({ca}) needs tls_cert and tls_key on a server: it requires client "
                f"certificates signed by tls_ca (mutual TLS) only while it serves TLS itself"
            )
        return cls(
            cert=_read_pem("tls_cert", cert, (_CERTIFICATE,), "PEM certificate"),
            key=_read_pem("tls_key", key, _PRIVATE_KEY_HEADERS, "PEM private key"),
            ca=_read_pem("tls_ca", ca, (_CERTIFICATE,), "PEM CA certificate"),
            server_name=server_name,
            cert_path=cert,
            key_path=key,
            ca_path=ca,
        )

    def reread(self) -> TlsFiles:
        """The same files read again (a renewal may have replaced them); ValueError as `read`."""
        return TlsFiles.read(self.cert_path, self.key_path, self.ca_path, server_name=self.server_name)

    @property
    def paths(self) -> dict[str, str]:
        """Setting name -> path of each file read from disk (empty: given as bytes, nothing to reload)."""
        named = {"tls_cert": self.cert_path, "tls_key": self.key_path, "tls_ca": self.ca_path}
        return {name: path for name, path in named.items() if path is not None}

    @property
    def enabled(self) -> bool:
        return any(v is not None for v in (self.cert, self.key, self.ca))

    @property
    def mutual(self) -> bool:
        """A server with these files requires and verifies client certificates."""
        return self.ca is not None


def tls_of(config: Any, *, serves: bool = False) -> TlsFiles | None:
    """The TlsFiles of a role's settings (fields tls_cert, tls_key, tls_ca, and tls_server_name on roles that
    dial), or None when TLS is off. Settings dataclasses call it in __post_init__ to refuse bad files before
    anything starts."""
    files = TlsFiles.read(
        config.tls_cert,
        config.tls_key,
        config.tls_ca,
        serves=serves,
        server_name=getattr(config, "tls_server_name", None),
    )  # pure servers have none
    return files if files.enabled else None


def check_server_name(name: str) -> None:
    """A name to check certificates against: a host name or IPv4 address, without scheme, port or wildcard."""
    if "*" in name:
        raise ValueError(
            f"tls_server_name ({name}) must be a name the certificate covers, not a wildcard: a "
            f"certificate for *.apexrl.svc covers tls_server_name apexrl-replay.apexrl.svc"
        )
    if len(name) > 253 or not _SERVER_NAME.fullmatch(name):
        raise ValueError(
            f"tls_server_name ({name!r}) must be a host name such as apexrl-replay.apexrl.svc (no "
            f"scheme, port or spaces)"
        )


def describe(tls: TlsFiles | None) -> str:
    """For log lines: plaintext, TLS or mutual TLS (as a server with these files serves)."""
    if tls is None or tls.cert is None:
        return "plaintext"
    return "mutual TLS" if tls.mutual else "TLS"


def check_health_port(health_port: int | None, port: int) -> None:
    """A server's plaintext health port: a valid port other than the service's own."""
    if health_port is None:
        return
    if not 1 <= health_port <= 65535 or health_port == port:
        raise ValueError(f"health_port ({health_port}) must be a port in 1..65535 other than port ({port})")


def _read_pem(name: str, path: str | None, headers: tuple[bytes, ...], what: str) -> bytes | None:
    if path is None:
        return None
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as err:
        raise ValueError(f"{name} ({path}) cannot be read: {err.strerror or err}") from None
    if b"-----BEGIN ENCRYPTED PRIVATE KEY-----" in data:
        raise ValueError(f"{name} ({path}) is encrypted; gRPC needs an unencrypted PEM private key")
    if not any(header in data for header in headers):
        raise ValueError(f"{name} ({path}) holds no {what} ({headers[0].decode()} ...)")
    return data
