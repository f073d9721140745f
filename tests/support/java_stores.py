"""JKS and PKCS12 stores as a Kafka operator makes them: Java's keytool, from the PEM test CA's files."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from coordinator.embedded.certificates import CertificateSet

PASSWORD = "store-secret"
_QUICK_JVM = ("-J-XX:TieredStopAtLevel=1", "-J-XX:+UseSerialGC")  # a short-lived JVM starts sooner


@dataclass(frozen=True)
class JavaStores:
    keystore_jks: Path  # the broker certificate's key and chain
    keystore_p12: Path
    truststore_jks: Path  # the CA
    truststore_p12: Path
    client_keystore_p12: Path  # client-<name>'s key and chain (mTLS)


def make_java_stores(certificates: CertificateSet, directory: Path, client: str = "coordinator") -> JavaStores:
    """Every store protected by PASSWORD. The PKCS12 keystores are openssl's (`openssl pkcs12 -export`, how a PEM
    key usually becomes one); keytool makes the JKS keystore from it and both truststores (Java's own formats,
    PKCS12 trusted-certificate entries included)."""
    keytool, openssl = shutil.which("keytool"), shutil.which("openssl")
    assert keytool and openssl, "keytool (Java) and openssl are needed to make the stores"
    directory.mkdir(parents=True, exist_ok=True)

    def run(*args: str) -> None:
        subprocess.run(args, check=True, capture_output=True, timeout=60)

    def pkcs12_of(pem: Path, out: Path) -> Path:
        run(openssl, "pkcs12", "-export", "-in", str(pem), "-inkey", str(pem), "-name", "key", "-out", str(out),
            "-passout", f"pass:{PASSWORD}")
        return out

    stores = JavaStores(directory / "keystore.jks", pkcs12_of(certificates.broker_keystore, directory / "keystore.p12"),
                        directory / "truststore.jks", directory / "truststore.p12",
                        pkcs12_of(certificates.client_keystore(client), directory / "client.p12"))
    run(keytool, *_QUICK_JVM, "-importkeystore", "-srckeystore", str(stores.keystore_p12), "-srcstoretype", "PKCS12",
        "-srcstorepass", PASSWORD, "-destkeystore", str(stores.keystore_jks), "-deststoretype", "JKS",
        "-deststorepass", PASSWORD, "-noprompt")
    for target, kind in ((stores.truststore_jks, "JKS"), (stores.truststore_p12, "PKCS12")):
        run(keytool, *_QUICK_JVM, "-importcert", "-alias", "ca", "-file", str(certificates.ca), "-keystore",
            str(target), "-storetype", kind, "-storepass", PASSWORD, "-noprompt")
    return stores
