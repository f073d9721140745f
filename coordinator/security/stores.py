"""Key and trust stores as Kafka takes them (`ssl.keystore.type`, `ssl.truststore.type`): PEM (KIP-651), PKCS12
and JKS, read into PEM for Python's `ssl` and librdkafka.

Kafka's rules (DefaultSslEngineFactory): the type defaults to JKS, whose Java reader also takes a PKCS12 file
(`keystore.type.compat`), so a JKS-typed store may be either; a PKCS12-typed store must be PKCS12. A PKCS12 or JKS
keystore is opened with `ssl.keystore.password`, its private key with `ssl.key.password` (default: the store's
password). A truststore's password only checks the store's integrity in Java; PKCS12 may need it to decrypt its
certificates. PKCS12 is read with the `cryptography` package, JKS with `pyjks` (the project's `secure` and `jks`
extras); without them such a store is refused at start, saying which package it needs.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from coordinator.security.errors import ClientConfigError

STORE_TYPES = ("JKS", "PKCS12", "PEM")
_JKS_MAGIC = b"\xfe\xed\xfe\xed"


@dataclass(frozen=True)
class KeyMaterial:
    """A private key (PKCS#8, unencrypted) and its certificate chain, leaf first, both PEM."""

    key_pem: str = field(repr=False)
    chain_pem: str


def store_type(value: str | None, setting: str) -> str:
    """The store type named (Kafka's default: JKS); ClientConfigError for one Kafka does not know."""
    kind = (value or "JKS").strip().upper()
    if kind not in STORE_TYPES:
        raise ClientConfigError(setting, f"{kind}: one of {', '.join(STORE_TYPES)}")
    return kind


def typed_store(props: Mapping[str, str], prefix: str, base: Path | None) -> tuple[Path, str] | None:
    """(path, type) of a JKS or PKCS12 store `prefix`.location; None for PEM (its type, or a PEM file without
    one: Kafka's default type is JKS, whose Java reader takes PKCS12 too, and we take PEM content as PEM)."""
    kind = store_type(props.get(f"{prefix}.type"), f"{prefix}.type")
    location = props.get(f"{prefix}.location")
    if location is None:
        return None
    path = Path(location).expanduser()
    if not path.is_absolute() and base is not None and not path.exists():
        path = base / path
    if kind == "PEM" or (f"{prefix}.type" not in props and _looks_like_pem(path)):
        return None
    return path.resolve(), kind


def _looks_like_pem(path: Path) -> bool:
    try:
        with path.open("rb") as file:
            return b"-----BEGIN" in file.read(65_536)
    except OSError:
        return True  # said by the PEM reader, naming the setting


def read_keystore(path: Path, kind: str, store_password: str | None, key_password: str | None, *,
                  setting: str = "ssl.keystore.location") -> KeyMaterial:
    """The key and chain of a PKCS12 or JKS keystore (`kind` as store_type gives it, not PEM)."""
    data = _read(path, setting)
    if not store_password and not key_password:
        raise ClientConfigError("ssl.keystore.password", f"needed to read the {kind} keystore {path}")
    if kind == "JKS" and data.startswith(_JKS_MAGIC):
        return _jks_key(data, path, store_password or key_password or "", key_password)
    if data.startswith(_JKS_MAGIC):
        raise ClientConfigError("ssl.keystore.type", f"PKCS12, but {path} is a JKS keystore (set JKS)")
    return _pkcs12_key(data, path, [p for p in (store_password, key_password) if p])


def read_truststore(path: Path, kind: str, password: str | None, *,
                    setting: str = "ssl.truststore.location") -> str:
    """The trusted certificates of a PKCS12 or JKS truststore, as PEM."""
    data = _read(path, setting)
    if kind == "JKS" and data.startswith(_JKS_MAGIC):
        return _jks_certificates(data, path, password)
    if data.startswith(_JKS_MAGIC):
        raise ClientConfigError("ssl.truststore.type", f"PKCS12, but {path} is a JKS truststore (set JKS)")
    pkcs12 = _pkcs12_module("ssl.truststore.type")
    from cryptography.hazmat.primitives.serialization import Encoding

    try:
        loaded = pkcs12.load_pkcs12(data, password.encode() if password else None)
    except ValueError as exc:
        raise ClientConfigError("ssl.truststore.password", f"cannot read {path} as PKCS12 with "
                                                           f"{'this' if password else 'no'} password: {exc}") from None
    certificates = [entry.certificate for entry in loaded.additional_certs]
    if loaded.cert is not None:
        certificates.insert(0, loaded.cert.certificate)
    if not certificates:
        raise ClientConfigError(setting, f"{path} holds no certificate")
    return "".join(c.public_bytes(Encoding.PEM).decode() for c in certificates)


@contextlib.contextmanager
def pem_files(material: KeyMaterial) -> Iterator[str]:
    """A private file holding `material` (key then chain), for `SSLContext.load_cert_chain`, which reads files
    only; removed on exit."""
    with tempfile.TemporaryDirectory(prefix="coordinator-key-") as directory:  # mode 0700
        path = os.path.join(directory, "keystore.pem")
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "w") as file:
            file.write(material.key_pem + material.chain_pem)
        yield path


def _read(path: Path, setting: str) -> bytes:
    try:
        return path.expanduser().read_bytes()
    except OSError as exc:
        raise ClientConfigError(setting, f"cannot read {path}: {exc.strerror or exc}") from None


def _pkcs12_module(setting: str) -> Any:
    try:
        from cryptography.hazmat.primitives.serialization import pkcs12
    except ImportError:
        raise ClientConfigError(setting, "a PKCS12 store is read with the `cryptography` package: pip install "
                                         "'.[secure]'") from None
    return pkcs12


def _pkcs12_key(data: bytes, path: Path, passwords: list[str]) -> KeyMaterial:
    pkcs12 = _pkcs12_module("ssl.keystore.type")
    from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat

    loaded, error = None, None
    for password in passwords:  # the store's, then the key's (Java may protect them apart; PKCS12 here: one)
        try:
            loaded = pkcs12.load_pkcs12(data, password.encode())
            break
        except ValueError as exc:
            error = exc
    if loaded is None:
        raise ClientConfigError("ssl.keystore.password", f"cannot read {path} as PKCS12 with it: {error}")
    if loaded.key is None or loaded.cert is None:
        raise ClientConfigError("ssl.keystore.location", f"{path} holds no private key with its certificate")
    key = loaded.key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption()).decode()
    chain = [loaded.cert.certificate, *(entry.certificate for entry in loaded.additional_certs)]
    return KeyMaterial(key, "".join(c.public_bytes(Encoding.PEM).decode() for c in chain))


def _jks_module(setting: str) -> Any:
    try:
        import jks  # pyjks
    except ImportError:
        raise ClientConfigError(setting, "a JKS store is read with the `pyjks` package: pip install '.[jks]' (or "
                                         "convert it: keytool -importkeystore -deststoretype PKCS12)") from None
    return jks


def _load_jks(data: bytes, path: Path, password: str | None, setting: str) -> Any:
    jks = _jks_module(setting)
    try:  # without a password the integrity check is skipped, as Java does
        return jks.KeyStore.loads(data, password or None, try_decrypt_keys=False)
    except jks.util.KeystoreSignatureException:
        raise ClientConfigError(setting.replace("location", "password"), f"cannot read {path} as JKS with it: "
                                                                         f"the store's integrity check fails") from None
    except (jks.util.KeystoreException, ValueError, EOFError) as exc:
        raise ClientConfigError(setting, f"{path} is not a readable JKS store: {exc!r}") from None


def _jks_key(data: bytes, path: Path, store_password: str, key_password: str | None) -> KeyMaterial:
    jks = _jks_module("ssl.keystore.type")
    store = _load_jks(data, path, store_password, "ssl.keystore.location")
    if len(store.private_keys) != 1:  # Kafka's keystore holds the one key it serves with
        raise ClientConfigError("ssl.keystore.location", f"{path} holds {len(store.private_keys)} private keys: "
                                                         f"one is needed")
    entry = next(iter(store.private_keys.values()))
    try:
        entry.decrypt(key_password or store_password)
    except jks.util.KeystoreException:
        raise ClientConfigError("ssl.key.password", f"does not decrypt the key in {path}") from None
    key = _pem("PRIVATE KEY", entry.pkey_pkcs8)
    return KeyMaterial(key, "".join(_pem("CERTIFICATE", der) for _kind, der in entry.cert_chain))


def _jks_certificates(data: bytes, path: Path, password: str | None) -> str:
    store = _load_jks(data, path, password, "ssl.truststore.location")
    certificates = [entry.cert for entry in store.certs.values()]
    if not certificates:
        raise ClientConfigError("ssl.truststore.location", f"{path} holds no trusted certificate")
    return "".join(_pem("CERTIFICATE", der) for der in certificates)


def _pem(label: str, der: bytes) -> str:
    import base64
    import textwrap

    body = "\n".join(textwrap.wrap(base64.b64encode(der).decode(), 64))
    return f"-----BEGIN {label}-----\n{body}\n-----END {label}-----\n"
