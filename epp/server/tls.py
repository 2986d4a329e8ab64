"""The ext_proc server's certificate: `tls.crt`/`tls.key` from `--certPath`, else self-signed.

Upstream generates an RSA-4096 certificate at start. Here the self-signed one uses ECDSA P-256:
Envoy (BoringSSL) accepts it, and generating it takes about a millisecond instead of seconds of CPU
on every start. It is made in memory and never written to disk; like upstream it is valid for ten
years, for server authentication, with organisation "Inference Ext".
"""

from __future__ import annotations

import datetime
import ipaddress
import ssl
import tempfile
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from epp.h2 import server_ssl_context

CERT_FILE = "tls.crt"
KEY_FILE = "tls.key"
ORGANIZATION = "Inference Ext"
VALIDITY = datetime.timedelta(days=3650)
SELF_SIGNED_NAMES = ("localhost",)


@dataclass(frozen=True, slots=True)
class KeyPair:
    key_pem: bytes
    cert_pem: bytes


def load_key_pair(cert_path: str) -> KeyPair:
    """The PEM files of `--certPath`; an unreadable directory is a startup error (OSError)."""
    base = Path(cert_path)
    return KeyPair(key_pem=(base / KEY_FILE).read_bytes(), cert_pem=(base / CERT_FILE).read_bytes())


def self_signed(now: datetime.datetime | None = None) -> KeyPair:
    key = ec.generate_private_key(ec.SECP256R1())
    start = now or datetime.datetime.now(datetime.UTC)
    name = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, ORGANIZATION),
            x509.NameAttribute(NameOID.COMMON_NAME, SELF_SIGNED_NAMES[0]),
        ]
    )
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start - datetime.timedelta(minutes=5))  # tolerate small clock skew
        .not_valid_after(start + VALIDITY)
        .add_extension(
            x509.SubjectAlternativeName(
                [
                    *(x509.DNSName(n) for n in SELF_SIGNED_NAMES),
                    x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                ]
            ),
            critical=False,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    return KeyPair(
        key_pem=key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ),
        cert_pem=cert.public_bytes(serialization.Encoding.PEM),
    )


def server_key_pair(cert_path: str) -> KeyPair:
    return load_key_pair(cert_path) if cert_path else self_signed()


def ssl_context(pair: KeyPair) -> ssl.SSLContext:
    """A server context for `pair` (ALPN h2, TLS 1.2+). Python's ssl loads keys only from files, so
    the PEMs pass through a private temp dir that is removed before this returns."""
    with tempfile.TemporaryDirectory(prefix="epp-tls-") as directory:
        cert_file, key_file = Path(directory) / CERT_FILE, Path(directory) / KEY_FILE
        cert_file.write_bytes(pair.cert_pem)
        key_file.touch(mode=0o600)
        key_file.write_bytes(pair.key_pem)
        return server_ssl_context(str(cert_file), str(key_file))
