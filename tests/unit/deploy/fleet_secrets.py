"""The Secrets the manifests expect (docs/deploy-kubernetes.md, "Secrets"), made here as the guide's commands make
them: a CA of the fleet's own; a server certificate for the shards (serverAuth only, the Service name every client
checks); the learner's certificate, which serves (the parameter service) and dials (the shards), common name
`learner`; a client certificate per client role (clientAuth only, common name = the role); one bearer token per
role. Nothing here is apexrl code: the certificates come from `cryptography`, as openssl or cert-manager would
issue them.
"""

from __future__ import annotations

import base64
import datetime
import secrets
from dataclasses import dataclass, field
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

# The roles that hold a token, and the Secret each one's token is in (key `token`).
TOKEN_ROLES = ("actor", "evaluator", "learner", "operator")
TOKEN_KEY = "token"
# The TLS Secrets (type kubernetes.io/tls: tls.crt, tls.key, ca.crt), by what holds them.
TLS_HOLDERS = ("replay", "learner", "actor", "evaluator", "operator")


def token_secret_name(role: str) -> str:
    return f"apexrl-token-{role}"


def tls_secret_name(holder: str) -> str:
    return f"apexrl-tls-{holder}"


@dataclass
class Pem:
    cert: bytes
    key: bytes


@dataclass
class FleetCredentials:
    """A fleet's CA, certificates and tokens (PEM bytes and strings), for namespace `namespace`."""

    namespace: str
    ca: bytes
    ca_key: ec.EllipticCurvePrivateKey = field(repr=False)
    certs: dict[str, Pem] = field(default_factory=dict)  # holder -> its certificate and key
    tokens: dict[str, str] = field(default_factory=dict)  # role -> its bearer token

    @property
    def server_name(self) -> str:
        """The one name every client checks (--tls-server-name)."""
        return f"apexrl-replay.{self.namespace}.svc"

    def secrets(self) -> list[dict]:
        """Every Secret: one kubernetes.io/tls per certificate holder, one Opaque token Secret per role."""
        made = [
            _secret(
                tls_secret_name(h),
                self.namespace,
                {"tls.crt": p.cert, "tls.key": p.key, "ca.crt": self.ca},
                "kubernetes.io/tls",
            )
            for h, p in self.certs.items()
        ]
        made += [
            _secret(token_secret_name(r), self.namespace, {TOKEN_KEY: t.encode()}, "Opaque")
            for r, t in self.tokens.items()
        ]
        return made

    def write(self, directory: Path) -> dict[str, dict[str, str]]:
        """The certificates, keys, CA and tokens as files (keys and tokens mode 0600): holder -> {"cert", "key",
        "ca", "token" (when the holder is a token role)} -> path."""
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "ca.crt").write_bytes(self.ca)
        paths: dict[str, dict[str, str]] = {}
        for holder in {*self.certs, *self.tokens}:
            files = {"ca": str(directory / "ca.crt")}
            if holder in self.certs:
                for kind, data in (("cert", self.certs[holder].cert), ("key", self.certs[holder].key)):
                    files[kind] = str(directory / f"{holder}.{kind}")
                    Path(files[kind]).write_bytes(data)
            if holder in self.tokens:
                files["token"] = str(directory / f"{holder}.token")
                Path(files["token"]).write_text(self.tokens[holder])
            for kind in ("key", "token"):
                if kind in files:
                    Path(files[kind]).chmod(0o600)
            paths[holder] = files
        return paths

    def issue(self, common_name: str, dns_names: list[str], *, server: bool, client: bool) -> Pem:
        """Another certificate signed by the fleet's CA (an intruder's, a shard's stolen one: the tests' cases)."""
        return _issue(self.ca, self.ca_key, common_name, dns_names, server=server, client=client)


def make_fleet_credentials(namespace: str = "apexrl") -> FleetCredentials:
    ca_key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "apexrl fleet CA")])
    now = datetime.datetime.now(datetime.timezone.utc)
    ca = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=30))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )
    ca_pem = ca.public_bytes(serialization.Encoding.PEM)
    creds = FleetCredentials(namespace, ca_pem, ca_key)
    svc = f"{namespace}.svc"
    services = [
        f"apexrl-replay.{svc}",
        f"apexrl-replay.{svc}.cluster.local",
        f"apexrl-learner.{svc}",
        f"apexrl-learner.{svc}.cluster.local",
    ]
    creds.certs["replay"] = creds.issue(f"apexrl-replay.{svc}", services[:2], server=True, client=False)
    creds.certs["learner"] = creds.issue("learner", services, server=True, client=True)
    for role in ("actor", "evaluator", "operator"):
        creds.certs[role] = creds.issue(role, [], server=False, client=True)
    creds.tokens = {role: secrets.token_urlsafe(32) for role in TOKEN_ROLES}
    return creds


def _issue(
    ca_pem: bytes,
    ca_key: ec.EllipticCurvePrivateKey,
    common_name: str,
    dns_names: list[str],
    *,
    server: bool,
    client: bool,
) -> Pem:
    ca = x509.load_pem_x509_certificate(ca_pem)
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    usages = [
        *([ExtendedKeyUsageOID.SERVER_AUTH] if server else []),
        *([ExtendedKeyUsageOID.CLIENT_AUTH] if client else []),
    ]
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=7))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
    )
    if dns_names:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.DNSName(n) for n in dns_names]), critical=False
        )
    cert = builder.sign(ca_key, hashes.SHA256())
    return Pem(
        cert.public_bytes(serialization.Encoding.PEM),
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ),
    )


def _secret(name: str, namespace: str, data: dict[str, bytes], kind: str) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": kind,
        "metadata": {"name": name, "namespace": namespace},
        "data": {k: base64.b64encode(v).decode() for k, v in data.items()},
    }
