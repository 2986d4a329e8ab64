"""Throw-away PKI for one control plane: a CA, serving certs, client certs for each identity (admin,
the scheduler, the controller-manager, any test user), and the service-account signing key.

Shaped after envtest's TinyCA: ECDSA P-256 (fast to generate, so a start costs milliseconds here),
one week of validity, nothing persisted beyond the control plane's temp dir. The admin client cert
carries ``O=system:masters``, the group RBAC always allows, so the harness is cluster-admin without
any RBAC bootstrap of its own.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALIDITY: Final = dt.timedelta(days=7)
_BACKDATE: Final = dt.timedelta(minutes=5)  # tolerate small clock differences


@dataclass(frozen=True)
class CertKeyPair:
    """PEM-encoded certificate and private key."""

    cert_pem: bytes
    key_pem: bytes


@dataclass(frozen=True)
class KeyPair:
    """PEM-encoded private key (PKCS#8) and its public key (SubjectPublicKeyInfo)."""

    private_pem: bytes
    public_pem: bytes


@dataclass(frozen=True)
class ExtProcTls:
    """How a client (Envoy) verifies the EPP: the CA that issued its certificate and the name on it."""

    ca_pem: bytes
    server_name: str


UNVERIFIED_EXT_PROC_TLS: Final = ExtProcTls(b"", "")
"""Envoy speaks TLS to the EPP without verifying its (self-signed) certificate."""


class TinyCA:
    """A self-signed CA that issues leaf certificates for one control plane.

    The control plane keeps its CA's key next to its other PKI files, so that any process of the run
    can ``load`` the CA later and mint a client certificate for another identity.
    """

    def __init__(
        self, common_name: str = "epp-harness-ca", organization: str = "inference-epp-harness"
    ) -> None:
        self._key = ec.generate_private_key(ec.SECP256R1())
        subject = _name(common_name, [organization])
        now = _now()
        self._cert = (
            _builder(subject, subject, self._key.public_key(), now)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(_usage(cert_sign=True), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(self._key.public_key()), critical=False)
            .sign(self._key, hashes.SHA256())
        )

    @classmethod
    def load(cls, cert_pem: bytes, key_pem: bytes) -> TinyCA:
        """The CA whose certificate and (unencrypted PKCS#8) key were written by ``cert_pem``/``key_pem``."""
        key = serialization.load_pem_private_key(key_pem, password=None)
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise ValueError("the CA key is not an EC private key")
        ca = cls.__new__(cls)
        ca._key = key
        ca._cert = x509.load_pem_x509_certificate(cert_pem)
        return ca

    @property
    def cert_pem(self) -> bytes:
        return self._cert.public_bytes(serialization.Encoding.PEM)

    @property
    def key_pem(self) -> bytes:
        return _private_pem(self._key)

    def issue_serving(
        self, dns_names: Sequence[str], ips: Sequence[str], common_name: str = ""
    ) -> CertKeyPair:
        """A TLS server certificate valid for ``dns_names`` and ``ips`` (SANs)."""
        sans: list[x509.GeneralName] = [x509.DNSName(n) for n in dns_names]
        sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
        cn = common_name or (list(dns_names) + list(ips))[0]
        return self._issue(
            _name(cn, []),
            [
                (x509.SubjectAlternativeName(sans), False),
                (x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), False),
            ],
        )

    def issue_client(self, common_name: str, organizations: Sequence[str] = ()) -> CertKeyPair:
        """A TLS client certificate; Kubernetes reads CN as the user and each O as a group."""
        return self._issue(
            _name(common_name, organizations),
            [(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), False)],
        )

    def _issue(self, subject: x509.Name, extensions: list[tuple[x509.ExtensionType, bool]]) -> CertKeyPair:
        key = ec.generate_private_key(ec.SECP256R1())
        builder = (
            _builder(subject, self._cert.subject, key.public_key(), _now())
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(_usage(cert_sign=False), critical=True)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self._key.public_key()), critical=False
            )
        )
        for extension, critical in extensions:
            builder = builder.add_extension(extension, critical=critical)
        cert = builder.sign(self._key, hashes.SHA256())
        return CertKeyPair(cert.public_bytes(serialization.Encoding.PEM), _private_pem(key))


def service_account_key_pair() -> KeyPair:
    """The key pair kube-apiserver signs (private) and checks (public) service-account tokens with."""
    key = ec.generate_private_key(ec.SECP256R1())
    public = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return KeyPair(_private_pem(key), public)


def _private_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _name(common_name: str, organizations: Sequence[str]) -> x509.Name:
    attributes = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in organizations]
    attributes.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
    return x509.Name(attributes)


def _builder(
    subject: x509.Name, issuer: x509.Name, public_key: ec.EllipticCurvePublicKey, now: dt.datetime
) -> x509.CertificateBuilder:
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _BACKDATE)
        .not_valid_after(now + VALIDITY)
    )


def _usage(*, cert_sign: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=cert_sign,
        crl_sign=cert_sign,
        encipher_only=False,
        decipher_only=False,
    )


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)
