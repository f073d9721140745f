"""Secured listeners for the embedded broker, beside its PLAINTEXT one (which stays for inter-broker traffic and the
readiness probe): SASL_SSL with PLAIN, SCRAM-SHA-256/512 and unsecured OAUTHBEARER, and SSL requiring a client
certificate, both with PEM stores (KIP-651) from a test CA. SCRAM users are added when the log dir is formatted
(KIP-900, `kafka-storage format --add-scram`); PLAIN users live in the listener's JAAS config."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from coordinator.embedded.certificates import CertificateSet, expiring, make_test_certificates

DEFAULT_USERS = {"admin": "admin-secret", "alice": "alice-secret"}
MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER")
_PLAIN_MODULE = "org.apache.kafka.common.security.plain.PlainLoginModule"
_SCRAM_MODULE = "org.apache.kafka.common.security.scram.ScramLoginModule"
_OAUTH_MODULE = "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule"
# with the authorizer: admin, and User:ANONYMOUS, the principal of the PLAINTEXT listeners (inter-broker,
# controller, readiness probe: a test broker only)
SUPER_USERS = "User:admin;User:ANONYMOUS"


@dataclass(frozen=True)
class SecureListeners:
    certificates: CertificateSet
    users: Mapping[str, str] = field(default_factory=lambda: dict(DEFAULT_USERS))  # name -> password, every mechanism
    host: str = "localhost"  # advertised to clients; the broker certificate names it
    ssl_client_auth: str = "required"  # of the SSL listener (SASL_SSL: none)
    authorizer: bool = False  # Kafka's StandardAuthorizer with no ACL meaning no access; SUPER_USERS

    def listeners(self, sasl_ssl_port: int, ssl_port: int) -> tuple[str, str]:
        """(listeners, advertised.listeners) entries to append."""
        bound = f"SASL_SSL://127.0.0.1:{sasl_ssl_port},SSL://127.0.0.1:{ssl_port}"
        return bound, f"SASL_SSL://{self.host}:{sasl_ssl_port},SSL://{self.host}:{ssl_port}"

    def properties(self) -> dict[str, str]:
        plain_users = " ".join(f'user_{name}="{password}"' for name, password in self.users.items())
        certificates = self.certificates
        authorizer = {"authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
                      "super.users": SUPER_USERS,
                      "allow.everyone.if.no.acl.found": "false"} if self.authorizer else {}
        return {
            **authorizer,
            "ssl.keystore.type": "PEM",
            "ssl.keystore.location": str(certificates.broker_keystore),
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": str(certificates.ca),
            "listener.name.ssl.ssl.client.auth": self.ssl_client_auth,
            "listener.name.sasl_ssl.sasl.enabled.mechanisms": ",".join(MECHANISMS),
            "listener.name.sasl_ssl.plain.sasl.jaas.config": f"{_PLAIN_MODULE} required {plain_users};",
            "listener.name.sasl_ssl.scram-sha-256.sasl.jaas.config": f"{_SCRAM_MODULE} required;",
            "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config": f"{_SCRAM_MODULE} required;",
            "listener.name.sasl_ssl.oauthbearer.sasl.jaas.config":
                f'{_OAUTH_MODULE} required unsecuredLoginStringClaim_sub="admin";',
        }

    def format_arguments(self) -> list[str]:
        """`kafka-storage format` arguments adding every user's SCRAM credentials."""
        return [argument for name, password in self.users.items()
                for mechanism in ("SCRAM-SHA-256", "SCRAM-SHA-512")
                for argument in ("--add-scram", f"{mechanism}=[name={name},password={password}]")]


def secure_listeners_in(data_dir: Path) -> SecureListeners:
    """Secured listeners whose certificates live in `data_dir`/certificates: made on the first start, kept after
    (clients keep trusting the same CA across restarts) until they are about to expire."""
    directory = data_dir / "certificates"
    certificates = CertificateSet(directory, directory / "ca.pem", directory / "broker.pem")
    if not (certificates.ca.exists() and certificates.broker_keystore.exists()
            and certificates.client_keystore("client").exists()) or expiring(certificates):
        certificates = make_test_certificates(directory, clients=("client",))
    return SecureListeners(certificates)


def write_client_properties(secure: SecureListeners, user: str = "admin") -> dict[str, Path]:
    """Kafka client properties files for the secured listeners (as `--command-config` takes them): SASL_SSL with
    SCRAM-SHA-512 as `user`, and SSL with the test client certificate."""
    certificates = secure.certificates
    trust = f"ssl.truststore.type=PEM\nssl.truststore.location={certificates.ca}\n"
    files = {
        "SASL_SSL": (f"{user}-sasl-ssl.properties",
                     f"security.protocol=SASL_SSL\nsasl.mechanism=SCRAM-SHA-512\nsasl.jaas.config={_SCRAM_MODULE} "
                     f"required username=\"{user}\" password=\"{secure.users[user]}\";\n{trust}"),
        "SSL": ("client-ssl.properties",
                f"security.protocol=SSL\n{trust}ssl.keystore.type=PEM\n"
                f"ssl.keystore.location={certificates.client_keystore('client')}\n"),
    }
    paths = {}
    for protocol, (name, text) in files.items():
        path = certificates.directory / name
        path.write_text(text)
        path.chmod(0o600)
        paths[protocol] = path
    return paths
