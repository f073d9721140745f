"""A throw-away certificate authority for secured test brokers and clients, made with the `cryptography` package
(the `test` extra): a CA, a broker certificate naming the hosts it is reached by, client certificates for mTLS.

PEM files in Kafka's layout (KIP-651): a keystore is the private key (PKCS#8, unencrypted) followed by the
certificate chain in one file, a truststore is the CA certificate. EC P-256 keys: made in milliseconds, taken by
Java, librdkafka and Python alike. The extensions are those strict verifiers insist on (Python 3.13's
VERIFY_X509_STRICT): the CA has BasicConstraints and KeyUsage, leaves have the authority's key id and SANs.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

_VALIDITY = datetime.timedelta(days=7)


@dataclass(frozen=True)
class CertificateSet:
    directory: Path
    ca: Path  # the CA certificate: the truststore of brokers and clients
    broker_keystore: Path  # the broker's key and certificate chain

    def client_keystore(self, name: str) -> Path:
        return self.directory / f"client-{name}.pem"


def make_test_certificates(directory: Path, hosts: Sequence[str] = ("localhost", "127.0.0.1"),
                           clients: Sequence[str] = ("client",), ca_name: str = "coordinator test CA"
                           ) -> CertificateSet:
    """A fresh CA in `directory` (ca.pem), a broker certificate for `hosts` (broker.pem) and one client
    certificate per name (client-<name>.pem, subject CN=<name>,OU=test,O=coordinator)."""
    x509, ca_key, ca_cert = _make_ca(ca_name)
    directory.mkdir(parents=True, exist_ok=True)
    ca_path = directory / "ca.pem"
    ca_path.write_bytes(_cert_pem(ca_cert))
    broker = directory / "broker.pem"
    _write_leaf(broker, ca_key, ca_cert, common_name=hosts[0], hosts=hosts)
    for name in clients:
        _write_leaf(directory / f"client-{name}.pem", ca_key, ca_cert, common_name=name, hosts=())
    return CertificateSet(directory, ca_path, broker)


def expiring(certificates: CertificateSet, within: datetime.timedelta = datetime.timedelta(days=1)) -> bool:
    """True when the CA or the broker certificate is no longer valid `within` from now (or cannot be read)."""
    from cryptography import x509

    deadline = datetime.datetime.now(datetime.timezone.utc) + within
    try:
        return any(x509.load_pem_x509_certificate(path.read_bytes()).not_valid_after_utc < deadline
                   for path in (certificates.ca, certificates.broker_keystore))
    except (OSError, ValueError):
        return True


def make_ca_file(path: Path, name: str = "another test CA") -> Path:
    """Only a CA certificate (a truststore that trusts nothing the test broker shows)."""
    _x509, _key, cert = _make_ca(name)
    path.write_bytes(_cert_pem(cert))
    return path


def _make_ca(name: str) -> tuple[Any, Any, Any]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + _VALIDITY)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                         crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256()))
    return x509, key, cert


def _write_leaf(path: Path, ca_key: Any, ca_cert: Any, *, common_name: str, hosts: Sequence[str]) -> None:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "coordinator"),
                         x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, "test"),
                         x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (x509.CertificateBuilder().subject_name(subject).issuer_name(ca_cert.subject)
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + _VALIDITY)
               .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
               .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                            data_encipherment=False, key_agreement=True, key_cert_sign=False,
                                            crl_sign=False, encipher_only=False, decipher_only=False), critical=True)
               .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH,
                                                     ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
               .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
               .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
                              critical=False))
    if hosts:
        names: list[x509.GeneralName] = []
        for host in hosts:
            try:
                names.append(x509.IPAddress(ipaddress.ip_address(host)))
            except ValueError:
                names.append(x509.DNSName(host))
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    path.write_bytes(key_pem + _cert_pem(cert) + _cert_pem(ca_cert))
    path.chmod(0o600)


def _cert_pem(cert: Any) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return bytes(cert.public_bytes(serialization.Encoding.PEM))
