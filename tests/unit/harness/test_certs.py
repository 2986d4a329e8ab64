"""The throw-away PKI: a CA, a serving cert for loopback, an admin client cert in system:masters."""

from __future__ import annotations

import ipaddress

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from harness.cluster import certs


def _load(pem: bytes) -> x509.Certificate:
    return x509.load_pem_x509_certificate(pem)


def test_ca_is_a_ca() -> None:
    ca = _load(certs.TinyCA().cert_pem)
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca


def test_serving_cert_covers_localhost_and_loopback_ip() -> None:
    ca = certs.TinyCA()
    pair = ca.issue_serving(["localhost"], ["127.0.0.1"])
    cert = _load(pair.cert_pem)
    cert.verify_directly_issued_by(_load(ca.cert_pem))
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == ["localhost"]
    assert sans.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("127.0.0.1")]
    usage = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(usage) == [ExtendedKeyUsageOID.SERVER_AUTH]


def test_admin_client_cert_is_in_system_masters() -> None:
    ca = certs.TinyCA()
    cert = _load(ca.issue_client("admin", ["system:masters"]).cert_pem)
    cert.verify_directly_issued_by(_load(ca.cert_pem))
    assert [a.value for a in cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)] == ["admin"]
    assert [a.value for a in cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)] == [
        "system:masters"
    ]
    usage = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(usage) == [ExtendedKeyUsageOID.CLIENT_AUTH]


def test_private_key_matches_certificate() -> None:
    pair = certs.TinyCA().issue_client("admin")
    key = serialization.load_pem_private_key(pair.key_pem, password=None)
    assert key.public_key() == _load(pair.cert_pem).public_key()


def test_service_account_key_pair_matches() -> None:
    pair = certs.service_account_key_pair()
    key = serialization.load_pem_private_key(pair.private_pem, password=None)
    public = serialization.load_pem_public_key(pair.public_pem)
    assert key.public_key() == public
