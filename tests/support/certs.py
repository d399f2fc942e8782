"""Certificates for the TLS tests, made by `trustme` (a test CA in a few lines, no openssl command): a CA, a node
certificate for the names the tests dial (localhost, 127.0.0.1) that serves as both server and client
certificate, a second node certificate naming only SERVER_NAME (a DNS name, no address: what a fleet's one
certificate looks like when clients check `tls_server_name`), and a second, foreign CA with a client certificate
of its own. `issue` and `SecretVolume` make the certificates of the rotation tests and lay them out as a Kubernetes
Secret volume that a renewal swaps."""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass
from pathlib import Path

import trustme

# The one name `named_cert` holds: what a Kubernetes fleet's certificate names (tls_server_name).
SERVER_NAME = "apexrl-replay.apexrl.svc"


@dataclass(frozen=True)
class Certs:
    ca: str  # the fleet's CA bundle
    cert: str  # node certificate chain (server and client), signed by `ca`
    key: str  # its private key
    foreign_ca: str  # a CA that signed none of the above
    foreign_cert: str  # a client certificate signed by `foreign_ca`
    foreign_key: str
    named_cert: str  # node certificate chain for SERVER_NAME only, signed by `ca`
    named_key: str


def make_certs(directory: Path) -> Certs:
    """Write a CA, two node certificates (one for localhost and 127.0.0.1, one for SERVER_NAME alone) and a
    foreign CA's client certificate into `directory` as PEM files."""
    directory.mkdir(parents=True, exist_ok=True)
    ca, foreign = trustme.CA(), trustme.CA()
    node = ca.issue_cert("localhost", "127.0.0.1")
    stranger = foreign.issue_cert("localhost", "127.0.0.1")
    named = ca.issue_cert(SERVER_NAME)
    paths = {
        name: directory / f"{name}.pem"
        for name in (
            "ca",
            "cert",
            "key",
            "foreign_ca",
            "foreign_cert",
            "foreign_key",
            "named_cert",
            "named_key",
        )
    }
    ca.cert_pem.write_to_path(str(paths["ca"]))
    paths["cert"].write_bytes(b"".join(blob.bytes() for blob in node.cert_chain_pems))
    node.private_key_pem.write_to_path(str(paths["key"]))
    foreign.cert_pem.write_to_path(str(paths["foreign_ca"]))
    paths["foreign_cert"].write_bytes(b"".join(blob.bytes() for blob in stranger.cert_chain_pems))
    stranger.private_key_pem.write_to_path(str(paths["foreign_key"]))
    paths["named_cert"].write_bytes(b"".join(blob.bytes() for blob in named.cert_chain_pems))
    named.private_key_pem.write_to_path(str(paths["named_key"]))
    for key in ("key", "foreign_key", "named_key"):
        paths[key].chmod(0o600)
    return Certs(**{name: str(path) for name, path in paths.items()})


@dataclass(frozen=True)
class Identity:
    """A certificate chain and its key as PEM bytes, with the CA that signed it."""

    ca: trustme.CA
    cert: bytes
    key: bytes

    @property
    def ca_pem(self) -> bytes:
        return self.ca.cert_pem.bytes()


def issue(ca: trustme.CA | None = None, *names: str, not_after: datetime.datetime | None = None) -> Identity:
    """A certificate for `names` (default: localhost and 127.0.0.1) signed by `ca` (default: a new CA)."""
    ca = ca if ca is not None else trustme.CA()
    leaf = ca.issue_cert(*(names or ("localhost", "127.0.0.1")), not_after=not_after)
    return Identity(ca, b"".join(blob.bytes() for blob in leaf.cert_chain_pems), leaf.private_key_pem.bytes())


class SecretVolume:
    """TLS files laid out as Kubernetes mounts a Secret (which cert-manager renews): `tls.crt`, `tls.key` and
    `ca.crt` are links into `..data`, a link to a timestamped directory; `write` swaps `..data` to a new directory
    in one rename, so a reader sees the old files or the new ones, never a mix."""

    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.directory = directory
        self.cert, self.key, self.ca = (str(directory / name) for name in ("tls.crt", "tls.key", "ca.crt"))
        self._writes = 0

    def write(self, *, cert: bytes, key: bytes, ca: bytes) -> None:
        self._writes += 1
        version = self.directory / f"..2025_01_01_00_00_{self._writes:02d}.000000001"
        version.mkdir()
        for name, data in (("tls.crt", cert), ("tls.key", key), ("ca.crt", ca)):
            (version / name).write_bytes(data)
        staged = self.directory / "..data_tmp"
        staged.symlink_to(version.name)
        os.replace(staged, self.directory / "..data")
        for name in ("tls.crt", "tls.key", "ca.crt"):
            if not (self.directory / name).is_symlink():
                (self.directory / name).symlink_to(f"..data/{name}")
