"""Throw-away X.509 material for TLS tests: a CA and certificates it signs.

Everything is generated locally with the `cryptography` package (EC P-256
keys, so generation takes milliseconds) and written as PEM files. Nothing here
is meant to protect anything: the keys are unencrypted and live in a test's
temporary directory.

    ca = make_ca(workdir)                       # ca.crt, ca.key
    srv = make_cert(ca, workdir, "server")      # server.crt, server.key for 127.0.0.1 / localhost
    cli = make_cert(ca, workdir, "client", client=True)
"""

from __future__ import annotations

import datetime as _dt
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

try:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
except ImportError as e:  # pragma: no cover - depends on the environment
    x509 = None
    _IMPORT_ERROR = e
else:
    _IMPORT_ERROR = None

DEFAULT_HOSTS = ("127.0.0.1", "localhost")


class CertError(RuntimeError):
    """Certificates could not be made; the message says why."""


@dataclass(frozen=True)
class CertFiles:
    cert_path: Path
    key_path: Path


@dataclass(frozen=True)
class CA(CertFiles):
    name: str


def _need_cryptography() -> None:
    if x509 is None:
        raise CertError(
            "the 'cryptography' package is needed to generate TLS certificates "
            f"({_IMPORT_ERROR}). Install it with: pip install cryptography"
        )


def _now() -> _dt.datetime:
    return _dt.datetime.now(_dt.timezone.utc)


def _write_key(key, path: Path) -> None:
    path.write_bytes(key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ))
    os.chmod(path, 0o600)


def _write_cert(cert, path: Path) -> None:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def make_ca(workdir: str | os.PathLike, name: str = "Tern test CA", *, days: int = 30,
            stem: str = "ca") -> CA:
    """A self-signed CA certificate and key: <stem>.crt and <stem>.key in workdir."""
    _need_cryptography()
    if days < 1:
        raise ValueError(f"days must be at least 1, not {days}")
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _dt.timedelta(minutes=5))
        .not_valid_after(now + _dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(
            digital_signature=True, content_commitment=False, key_encipherment=False,
            data_encipherment=False, key_agreement=False, key_cert_sign=True, crl_sign=True,
            encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    ca = CA(cert_path=workdir / f"{stem}.crt", key_path=workdir / f"{stem}.key", name=name)
    _write_key(key, ca.key_path)
    _write_cert(cert, ca.cert_path)
    return ca


def make_cert(ca: CA, workdir: str | os.PathLike, stem: str = "server", *,
              hosts: tuple[str, ...] | list[str] = DEFAULT_HOSTS, common_name: str | None = None,
              client: bool = False, days: int = 30) -> CertFiles:
    """A leaf certificate signed by `ca`: <stem>.crt and <stem>.key in workdir.

    hosts: the names and IP addresses the certificate is valid for (subject
    alternative names; IPs become IP entries, everything else DNS entries).
    client: issue a client-authentication certificate instead of a server one.
    """
    _need_cryptography()
    if not hosts and not client:
        raise ValueError("a server certificate needs at least one host name or IP address")
    if days < 1:
        raise ValueError(f"days must be at least 1, not {days}")
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    ca_key = serialization.load_pem_private_key(Path(ca.key_path).read_bytes(), password=None)
    ca_cert = x509.load_pem_x509_certificate(Path(ca.cert_path).read_bytes())
    key = ec.generate_private_key(ec.SECP256R1())
    sans = []
    for h in hosts:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(h)))
        except ValueError:
            if not h or any(c.isspace() for c in h):
                raise ValueError(f"not a host name or IP address: {h!r}") from None
            sans.append(x509.DNSName(h))
    cn = common_name or (hosts[0] if hosts else stem)
    now = _now()
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _dt.timedelta(minutes=5))
        .not_valid_after(now + _dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(
            digital_signature=True, content_commitment=False, key_encipherment=False,
            data_encipherment=False, key_agreement=True, key_cert_sign=False, crl_sign=False,
            encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage(
            [ExtendedKeyUsageOID.CLIENT_AUTH if client else ExtendedKeyUsageOID.SERVER_AUTH]),
            critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
                       critical=False)
    )
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())
    out = CertFiles(cert_path=workdir / f"{stem}.crt", key_path=workdir / f"{stem}.key")
    _write_key(key, out.key_path)
    _write_cert(cert, out.cert_path)
    return out
