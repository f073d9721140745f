"""Certificate subjects written by principals.subject_name exactly as Java's X500Principal.getName() writes them
(what ssl.principal.mapping.rules see on a broker): RFC 2253 keywords, Java's escapes, attributes outside the
keywords as OID=#hex, several attributes in one RDN, non-ASCII text. Java itself is the golden."""

from __future__ import annotations

import datetime
import os
import shutil
import subprocess
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from coordinator.security.principals import subject_name

PROGRAM = Path(__file__).parent.parent / "support" / "java" / "X500Name.java"
A = x509.NameAttribute
SUBJECTS = [
    [[A(NameOID.COUNTRY_NAME, "DE")], [A(NameOID.ORGANIZATION_NAME, "Acme")], [A(NameOID.COMMON_NAME, "alice")]],
    [[A(NameOID.EMAIL_ADDRESS, "a@b.c")], [A(NameOID.COMMON_NAME, ' a,b=c+d#e<>;"\\ ')]],
    [[A(NameOID.COMMON_NAME, "alice"), A(NameOID.ORGANIZATIONAL_UNIT_NAME, "ops")]],
    [[A(NameOID.DOMAIN_COMPONENT, "example")], [A(NameOID.USER_ID, "u1")], [A(NameOID.SERIAL_NUMBER, "42")],
     [A(NameOID.COMMON_NAME, "Jörg ✓")]],
    [[A(NameOID.STATE_OR_PROVINCE_NAME, "Bay"), A(NameOID.LOCALITY_NAME, "Mun")],
     [A(NameOID.STREET_ADDRESS, "Main 1")], [A(NameOID.TITLE, "Dr")], [A(NameOID.COMMON_NAME, "#lead")]],
]


def certificate(rdns: list[list[x509.NameAttribute]]) -> bytes:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.RelativeDistinguishedName(rdn) for rdn in rdns])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now)
            .not_valid_after(now + datetime.timedelta(days=1)).sign(key, hashes.SHA256()))
    return cert.public_bytes(serialization.Encoding.DER)


def test_subject_names_are_written_as_java_writes_them(tmp_path: Path) -> None:
    paths, ours = [], []
    for index, rdns in enumerate(SUBJECTS):
        der = certificate(rdns)
        path = tmp_path / f"subject-{index}.der"
        path.write_bytes(der)
        paths.append(str(path))
        ours.append(subject_name(der))
    java = subprocess.run([shutil.which("java") or "java", str(PROGRAM), *paths], capture_output=True, text=True,
                          timeout=120, check=True, encoding="utf-8",
                          env={**os.environ, "JAVA_TOOL_OPTIONS": "-Dfile.encoding=UTF-8"})
    assert java.stdout.splitlines() == ours
