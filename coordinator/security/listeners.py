"""Our listeners (the coordinator's and the relay's per-broker ones) in Kafka's terms: `--listen` takes Kafka's
listener syntax (`SSL://host:port`; a bare `host:port` is PLAINTEXT) and TLS is set with the broker's property
names (`ssl.keystore.location` with `ssl.keystore.type` PEM, PKCS12 or JKS, `ssl.keystore.password`,
`ssl.key.password`, `ssl.truststore.location`, `ssl.truststore.type`, `ssl.truststore.password`, `ssl.client.auth`,
`ssl.enabled.protocols`), through `--config NAME=VALUE` or a properties file (stores.py reads PKCS12 and JKS).

Kafka's semantics: `ssl.client.auth` none (default) / requested (a certificate is asked for, not required) /
required (a client without a trusted certificate is refused during the handshake). A PEM keystore is the
private key (PKCS#8) and the certificate chain in one file (KIP-651); a PEM truststore takes no password.
SASL on our listeners (SASL_SSL, SASL_PLAINTEXT) passes the client's exchange through to the cluster
(sasl_passthrough.py).
"""

from __future__ import annotations

import logging
import re
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from coordinator.security.client_config import ClientConfigError
from coordinator.security.stores import pem_files, read_keystore, read_truststore, typed_store

log = logging.getLogger("coordinator.security")

LISTENER_TLS_NAMES = frozenset({
    "ssl.keystore.location", "ssl.keystore.type", "ssl.key.password", "ssl.keystore.password",
    "ssl.truststore.location", "ssl.truststore.type", "ssl.truststore.password", "ssl.client.auth",
    "ssl.enabled.protocols",
})
_CLIENT_AUTH = {"none": ssl.CERT_NONE, "requested": ssl.CERT_OPTIONAL, "required": ssl.CERT_REQUIRED}
_TLS_VERSIONS = {"TLSv1.2": ssl.TLSVersion.TLSv1_2, "TLSv1.3": ssl.TLSVersion.TLSv1_3}
_LISTENER = re.compile(r"^(?:([A-Za-z_]+)://)?(\[[^\]]*\]|[^:\[\]]*):(\d+)$")


@dataclass(frozen=True)
class Listener:
    protocol: str  # PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL
    host: str
    port: int

    @property
    def uses_tls(self) -> bool:
        return self.protocol in ("SSL", "SASL_SSL")

    @property
    def uses_sasl(self) -> bool:
        return self.protocol in ("SASL_PLAINTEXT", "SASL_SSL")

    def __str__(self) -> str:
        return f"{self.protocol}://{self.host}:{self.port}"


def parse_listener(text: str) -> Listener:
    """`[PROTOCOL://]host:port` as Kafka's `listeners` entries; ValueError says what is wrong."""
    match = _LISTENER.match(text.strip())
    if match is None:
        raise ValueError(f"expected [PROTOCOL://]HOST:PORT, got {text!r}")
    protocol, host, port = (match.group(1) or "PLAINTEXT").upper(), match.group(2).strip("[]"), int(match.group(3))
    if protocol not in ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"):
        raise ValueError(f"{protocol!r} is not a security protocol: PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL")
    if not 0 <= port <= 65_535:
        raise ValueError(f"{port} is not a port")
    return Listener(protocol, host, port)


def split_listener_settings(properties: Mapping[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """(our listeners' TLS settings, everything else) of `--config` settings."""
    tls = {name: value for name, value in properties.items() if name in LISTENER_TLS_NAMES}
    return tls, {name: value for name, value in properties.items() if name not in LISTENER_TLS_NAMES}


def server_ssl_context(listener: Listener, settings: Mapping[str, str]) -> ssl.SSLContext | None:
    """The TLS context of an SSL or SASL_SSL listener (None without TLS); ClientConfigError names the setting at
    fault."""
    if not listener.uses_tls:
        for name in sorted(settings):
            log.warning("event=listener_setting_ignored key=%s reason=listener %s has no TLS", name, listener)
        return None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.options |= ssl.OP_NO_RENEGOTIATION  # a client's TLS 1.2 renegotiation is refused (as Kafka's broker)
    _set_versions(context, settings.get("ssl.enabled.protocols", "TLSv1.2,TLSv1.3"))
    _load_keystore(context, settings, listener)
    client_auth = settings.get("ssl.client.auth", "none").strip().lower()
    if client_auth not in _CLIENT_AUTH:
        raise ClientConfigError("ssl.client.auth", f"{client_auth!r}: none, requested or required")
    context.verify_mode = _CLIENT_AUTH[client_auth]
    _load_truststore(context, settings, client_auth)
    return context


def _set_versions(context: ssl.SSLContext, text: str) -> None:
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in _TLS_VERSIONS]
    if unknown or not names:
        raise ClientConfigError("ssl.enabled.protocols", f"{text!r}: TLSv1.2 and/or TLSv1.3 (older versions are "
                                                         f"not offered)")
    versions = sorted(_TLS_VERSIONS[name] for name in names)
    context.minimum_version, context.maximum_version = versions[0], versions[-1]


def _load_keystore(context: ssl.SSLContext, settings: Mapping[str, str], listener: Listener) -> None:
    store = typed_store(settings, "ssl.keystore", None)
    if store is not None:  # JKS or PKCS12
        material = read_keystore(*store, settings.get("ssl.keystore.password"), settings.get("ssl.key.password"))
        with pem_files(material) as path:
            context.load_cert_chain(path)
        return
    if "ssl.keystore.password" in settings:
        raise ClientConfigError("ssl.keystore.password", "not used with a PEM keystore: the key's password is "
                                                         "ssl.key.password")
    location = settings.get("ssl.keystore.location")
    if not location:
        raise ClientConfigError("ssl.keystore.location", f"needed by listener {listener}: a PEM file with the "
                                                         f"private key and the certificate chain")
    text = _read(location, "ssl.keystore.location")
    if "PRIVATE KEY-----" not in text or "-----BEGIN CERTIFICATE" not in text:
        raise ClientConfigError("ssl.keystore.location", f"{location} must hold the private key and the "
                                                         f"certificate chain (PEM)")
    try:
        context.load_cert_chain(location, location, password=settings.get("ssl.key.password"))
    except ssl.SSLError as exc:
        raise ClientConfigError("ssl.keystore.location", f"{location}: {exc.reason or exc} (a wrong "
                                                         f"ssl.key.password?)") from None


def _load_truststore(context: ssl.SSLContext, settings: Mapping[str, str], client_auth: str) -> None:
    store = typed_store(settings, "ssl.truststore", None)
    if store is not None:  # JKS or PKCS12
        context.load_verify_locations(cadata=read_truststore(*store, settings.get("ssl.truststore.password")))
        return
    if "ssl.truststore.password" in settings:
        raise ClientConfigError("ssl.truststore.password", "not used with a PEM truststore")
    location = settings.get("ssl.truststore.location")
    if location:
        if "-----BEGIN CERTIFICATE" not in _read(location, "ssl.truststore.location"):
            raise ClientConfigError("ssl.truststore.location", f"{location} holds no PEM certificate")
        context.load_verify_locations(cafile=location)
    elif client_auth != "none":
        raise ClientConfigError("ssl.truststore.location", f"needed with ssl.client.auth={client_auth}: the CA "
                                                           f"certificates that sign the clients' certificates")


def _read(location: str, key: str) -> str:
    try:
        return Path(location).expanduser().read_text(errors="replace")
    except OSError as exc:
        raise ClientConfigError(key, f"cannot read {location}: {exc.strerror or exc}") from None
