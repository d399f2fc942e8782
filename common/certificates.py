"""What a process's TLS files hold, read with `cryptography`: when their certificates expire, and whether the
private key belongs to the certificate. gRPC only finds out at a handshake, long after a renewal wrote a key that
does not match (or half a file): common/tls_reload.py checks renewed files here first and keeps serving the
previous ones when they fail. No gRPC here.
"""

from __future__ import annotations

from cryptography import x509
from cryptography.hazmat.primitives import serialization

from apexrl.common.tls import TlsFiles


def check(tls: TlsFiles) -> dict[str, float]:
    """Expiry (the earliest notAfter of the file's certificates, as a Unix time) of the certificate chain ("cert")
    and of the CA bundle ("ca") in `tls`, for those it has. ValueError naming the setting and its path when a file
    holds no certificate or key `cryptography` can parse, or tls_key is not the private key of tls_cert."""
    expiry: dict[str, float] = {}
    if tls.cert is not None:
        chain = _certificates(tls.cert, "tls_cert", tls.cert_path)
        expiry["cert"] = _earliest_expiry(chain)
        if tls.key is not None:
            _check_key_matches(tls, chain[0])
    if tls.ca is not None:
        expiry["ca"] = _earliest_expiry(_certificates(tls.ca, "tls_ca", tls.ca_path))
    return expiry


def _named(setting: str, path: str | None) -> str:
    return setting if path is None else f"{setting} ({path})"


def _certificates(pem: bytes, setting: str, path: str | None) -> list[x509.Certificate]:
    try:
        return x509.load_pem_x509_certificates(pem)
    except ValueError as err:
        raise ValueError(f"{_named(setting, path)} does not parse as PEM certificates: {err}") from None


def _earliest_expiry(certificates: list[x509.Certificate]) -> float:
    return min(certificate.not_valid_after_utc.timestamp() for certificate in certificates)


def _check_key_matches(tls: TlsFiles, leaf: x509.Certificate) -> None:
    try:
        key = serialization.load_pem_private_key(tls.key, password=None)
    except (ValueError, TypeError) as err:
        raise ValueError(
            f"{_named('tls_key', tls.key_path)} does not parse as a PEM private key: {err}"
        ) from None
    spki = (serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    if key.public_key().public_bytes(*spki) != leaf.public_key().public_bytes(*spki):
        raise ValueError(
            f"{_named('tls_key', tls.key_path)} is not the private key of the first certificate in "
            f"{_named('tls_cert', tls.cert_path)}: is tls_key the private key of tls_cert?"
        )
