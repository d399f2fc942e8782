"""Certificates for the TLS tests, made by `trustme` (a test CA in a few lines, no openssl command): a CA, a node
certificate for the names the tests dial (localhost, 127.0.0.1) that serves as both server and client
certificate, and a second, foreign CA with a client certificate of its own."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import trustme


@dataclass(frozen=True)
class Certs:
    ca: str            # the fleet's CA bundle
    cert: str          # node certificate chain (server and client), signed by `ca`
    key: str           # its private key
    foreign_ca: str    # a CA that signed none of the above
    foreign_cert: str  # a client certificate signed by `foreign_ca`
    foreign_key: str


def make_certs(directory: Path) -> Certs:
    """Write a CA, a node certificate and a foreign CA's client certificate into `directory` as PEM files."""
    directory.mkdir(parents=True, exist_ok=True)
    ca, foreign = trustme.CA(), trustme.CA()
    node = ca.issue_cert("localhost", "127.0.0.1")
    stranger = foreign.issue_cert("localhost", "127.0.0.1")
    paths = {name: directory / f"{name}.pem" for name in ("ca", "cert", "key", "foreign_ca", "foreign_cert",
                                                           "foreign_key")}
    ca.cert_pem.write_to_path(str(paths["ca"]))
    paths["cert"].write_bytes(b"".join(blob.bytes() for blob in node.cert_chain_pems))
    node.private_key_pem.write_to_path(str(paths["key"]))
    foreign.cert_pem.write_to_path(str(paths["foreign_ca"]))
    paths["foreign_cert"].write_bytes(b"".join(blob.bytes() for blob in stranger.cert_chain_pems))
    stranger.private_key_pem.write_to_path(str(paths["foreign_key"]))
    for key in ("key", "foreign_key"):
        paths[key].chmod(0o600)
    return Certs(**{name: str(path) for name, path in paths.items()})
