"""Principals as Kafka builds them: certificate subjects written as Java's X500Principal.getName() (RFC 2253),
SslPrincipalMapper's rules, OAUTHBEARER's sub claim."""

from __future__ import annotations

import base64
import datetime
import json

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from coordinator.security.principals import (
    PrincipalMappingError, SslPrincipalMapper, oauthbearer_subject, subject_name, tls_principal,
)


def certificate(*rdns: list[x509.NameAttribute]) -> bytes:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.RelativeDistinguishedName(rdn) for rdn in rdns])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now)
            .not_valid_after(now + datetime.timedelta(days=1)).sign(key, hashes.SHA256()))
    return cert.public_bytes(serialization.Encoding.DER)


def test_subject_is_written_last_rdn_first_with_rfc2253_keywords() -> None:
    der = certificate([x509.NameAttribute(NameOID.COUNTRY_NAME, "DE")],
                      [x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Acme")],
                      [x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, "Payments")],
                      [x509.NameAttribute(NameOID.COMMON_NAME, "alice")])
    assert subject_name(der) == "CN=alice,OU=Payments,O=Acme,C=DE"


def test_java_escapes_and_unknown_attributes_as_hex() -> None:
    der = certificate([x509.NameAttribute(NameOID.EMAIL_ADDRESS, "a@b.c")],
                      [x509.NameAttribute(NameOID.COMMON_NAME, " a,b=c+d#e ")])
    # Java escapes , = + < > # ; " \ anywhere, and leading/trailing spaces; emailAddress is not an RFC 2253
    # keyword, so it is the OID with the DER value (IA5String "a@b.c") in hex
    assert subject_name(der) == "CN=\\ a\\,b\\=c\\+d\\#e\\ ,1.2.840.113549.1.9.1=#1605614062" + "2e63"


def test_several_attributes_in_one_rdn_are_joined_with_plus() -> None:
    der = certificate([x509.NameAttribute(NameOID.COMMON_NAME, "alice"),
                       x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, "ops")])
    assert subject_name(der) in ("CN=alice+OU=ops", "OU=ops+CN=alice")  # DER sorts the SET


def test_mapping_rules_first_whole_match_wins_with_back_references_and_case() -> None:
    mapper = SslPrincipalMapper("RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/, RULE:^CN=(.*?),OU=(.*?),O=.*$/$1@$2/L, "
                                "DEFAULT")
    assert mapper.name("CN=app,OU=ServiceUsers,O=Acme") == "app"
    assert mapper.name("CN=Bob,OU=Sales,O=Acme") == "bob@sales"
    assert mapper.name("CN=x") == "CN=x"  # DEFAULT: the whole name
    upper = SslPrincipalMapper("RULE:^CN=([^,]*).*$/$1/U")
    assert upper.name("CN=bob,O=x") == "BOB"


def test_no_rule_applying_fails_and_a_bad_rule_is_refused() -> None:
    with pytest.raises(PrincipalMappingError):
        SslPrincipalMapper("RULE:^CN=admin$/admin/").name("CN=alice")
    with pytest.raises(ValueError):
        SslPrincipalMapper("RULE:^CN=(.*)$/$1/X, junk/")


def test_a_back_reference_to_a_missing_group_is_literal() -> None:
    assert SslPrincipalMapper("RULE:^CN=(.*)$/$1-$2/").name("CN=a") == "a-$2"


def test_certificate_principal_and_anonymous() -> None:
    der = certificate([x509.NameAttribute(NameOID.COMMON_NAME, "alice")])
    assert tls_principal(der, SslPrincipalMapper("RULE:^CN=(.*)$/$1/")) == "User:alice"
    assert tls_principal(None, SslPrincipalMapper()) == "User:ANONYMOUS"


def test_oauthbearer_principal_is_the_sub_claim() -> None:
    def part(value: dict[str, object]) -> str:
        return base64.urlsafe_b64encode(json.dumps(value).encode()).decode().rstrip("=")

    token = f"{part({'alg': 'none'})}.{part({'sub': 'carol', 'exp': 1})}."
    assert oauthbearer_subject(f"n,,\x01auth=Bearer {token}\x01\x01".encode()) == "carol"
    assert oauthbearer_subject(b"n,,\x01auth=Bearer not-a-jwt\x01\x01") is None
