"""How the coordinator reaches a secured Kafka cluster: a Kafka client properties file (`--command-config`, as
Kafka's own tools take it) read once, checked, and translated for every client the coordinator opens.

Both vocabularies are accepted: the Java client's (`security.protocol`, `sasl.mechanism`, `sasl.jaas.config`,
`ssl.truststore.*`, `ssl.keystore.*` with type PEM, `ssl.key.password`, `ssl.endpoint.identification.algorithm`)
and librdkafka's (`sasl.username`/`sasl.password`, `ssl.ca.location`, `ssl.certificate.location`,
`ssl.key.location`, `enable.ssl.certificate.verification`, `sasl.oauthbearer.*`). Out come librdkafka settings
(`librdkafka_settings`) for the confluent-kafka clients and an `ssl.SSLContext` plus SASL credentials for the
connections the relay opens itself. Every refusal is a `ClientConfigError` naming the key.

Client settings that are not about security (`client.id`, `request.timeout.ms`, ...) are ignored with a
warning, as Kafka's clients warn about a setting they do not know: each of our clients has its own.
"""

from __future__ import annotations

import logging
import re
import ssl
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Mapping

from coordinator.security.errors import ClientConfigError
from coordinator.security.properties import load_properties

if TYPE_CHECKING:
    from coordinator.security.stores import KeyMaterial

log = logging.getLogger("coordinator.security")

PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER")
_LOGIN_MODULES = {
    "PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
    "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "OAUTHBEARER": "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule",
}
_JAAS_FLAGS = ("required", "requisite", "sufficient", "optional")
# Settings read here; anything else under ssl./sasl. is a security setting we cannot honour: refused, not ignored.
_KNOWN = {
    "security.protocol", "sasl.mechanism", "sasl.mechanisms", "sasl.jaas.config", "sasl.username", "sasl.password",
    "ssl.truststore.location", "ssl.truststore.type", "ssl.truststore.password", "ssl.truststore.certificates",
    "ssl.keystore.location", "ssl.keystore.type", "ssl.keystore.password", "ssl.key.password",
    "ssl.endpoint.identification.algorithm", "ssl.ca.location", "ssl.certificate.location", "ssl.key.location",
    "enable.ssl.certificate.verification", "sasl.login.callback.handler.class",
    "sasl.oauthbearer.token.endpoint.url", "sasl.oauthbearer.method", "sasl.oauthbearer.client.id",
    "sasl.oauthbearer.client.secret", "sasl.oauthbearer.scope", "sasl.oauthbearer.config",
    "enable.sasl.oauthbearer.unsecure.jwt", "ssl.enabled.protocols", "ssl.protocol",
}
_SECURITY_PREFIXES = ("ssl.", "sasl.", "security.", "enable.ssl", "enable.sasl")


@dataclass(frozen=True)
class OAuthBearer:
    """OAUTHBEARER credentials: an unsecured token for `principal` (test clusters, Kafka's unsecured validator),
    or a client-credentials grant at an OIDC token endpoint."""

    principal: str | None = None  # unsecured JWT's sub
    token_endpoint_url: str | None = None
    client_id: str | None = None
    client_secret: str | None = field(default=None, repr=False)
    scope: str | None = None

    @property
    def unsecured(self) -> bool:
        return self.token_endpoint_url is None


@dataclass(frozen=True)
class ClientSecurity:
    protocol: str = "PLAINTEXT"
    mechanism: str | None = None
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    oauthbearer: OAuthBearer | None = None
    ca_location: str | None = None  # PEM file of trusted certificates; None: the system's
    ca_pem: str | None = None  # the same, given inline (ssl.truststore.certificates) or read from a JKS/PKCS12 store
    certificate_location: str | None = None  # our certificate chain (mTLS), PEM
    key_location: str | None = None  # its private key, PEM (may be the same file)
    key_password: str | None = field(default=None, repr=False)
    key_material: KeyMaterial | None = None  # our key and chain read from a JKS or PKCS12 keystore (mTLS)
    keystore_name: str | None = None  # that keystore, for the log
    verify_certificates: bool = True
    verify_hostname: bool = True  # ssl.endpoint.identification.algorithm=https (Kafka's and librdkafka's default)

    @property
    def uses_tls(self) -> bool:
        return self.protocol in ("SSL", "SASL_SSL")

    @property
    def uses_sasl(self) -> bool:
        return self.protocol in ("SASL_PLAINTEXT", "SASL_SSL")

    @property
    def principal(self) -> str | None:
        """Our principal as the broker names it (DefaultKafkaPrincipalBuilder): User:<SASL name>; None when
        it depends on the broker's rules (a certificate's DN, an OAUTHBEARER token's claim)."""
        if self.uses_sasl and self.mechanism != "OAUTHBEARER" and self.username:
            return f"User:{self.username}"
        return None

    def describe(self) -> str:
        """For the log: what is used, never a secret."""
        parts = [f"security_protocol={self.protocol}"]
        if self.uses_sasl:
            parts.append(f"sasl_mechanism={self.mechanism}")
            who = self.username or (self.oauthbearer and (self.oauthbearer.principal or self.oauthbearer.client_id))
            parts.append(f"principal={who}")
        if self.uses_tls:
            parts.append(f"truststore={self.ca_location or ('inline' if self.ca_pem else 'system')}")
            parts.append(f"client_certificate={self.certificate_location or self.keystore_name or 'none'}")
            parts.append(f"hostname_verification={'on' if self.verify_hostname else 'off'}")
            if not self.verify_certificates:
                parts.append("certificate_verification=off")
        return " ".join(parts)

    def librdkafka_settings(self) -> dict[str, str]:
        """The settings a confluent-kafka client needs to reach the cluster like this."""
        settings = {"security.protocol": self.protocol.lower()}
        if self.uses_sasl:
            assert self.mechanism is not None
            settings["sasl.mechanism"] = self.mechanism
            if self.mechanism == "OAUTHBEARER":
                settings.update(_librdkafka_oauthbearer(self.oauthbearer or OAuthBearer()))
            else:
                settings["sasl.username"] = self.username or ""
                settings["sasl.password"] = self.password or ""
        if self.uses_tls:
            if self.ca_location:
                settings["ssl.ca.location"] = self.ca_location
            elif self.ca_pem:
                settings["ssl.ca.pem"] = self.ca_pem
            if self.certificate_location:
                settings["ssl.certificate.location"] = self.certificate_location
                settings["ssl.key.location"] = self.key_location or self.certificate_location
            elif self.key_material is not None:
                settings["ssl.certificate.pem"] = self.key_material.chain_pem
                settings["ssl.key.pem"] = self.key_material.key_pem
            if self.key_password:
                settings["ssl.key.password"] = self.key_password
            settings["ssl.endpoint.identification.algorithm"] = "https" if self.verify_hostname else "none"
            if not self.verify_certificates:
                settings["enable.ssl.certificate.verification"] = "false"
        return settings

    def aiokafka_settings(self, context: ssl.SSLContext | None) -> dict[str, object]:
        """aiokafka's keyword arguments to reach the cluster like this (`context`: this security's TLS context, as
        ssl_context() makes it); ClientConfigError for what aiokafka cannot take here (OAUTHBEARER needs a token
        provider of the application's)."""
        settings: dict[str, object] = {"security_protocol": self.protocol}
        if self.uses_sasl:
            if self.mechanism == "OAUTHBEARER":
                raise ClientConfigError("sasl.mechanism", "OAUTHBEARER: aiokafka takes a token provider of the "
                                                          "application's, not settings")
            settings.update(sasl_mechanism=self.mechanism, sasl_plain_username=self.username,
                            sasl_plain_password=self.password)
        if self.uses_tls:
            settings["ssl_context"] = context
        return settings

    def ssl_context(self) -> ssl.SSLContext | None:
        """For the connections we open ourselves (the relay's): TLS 1.2+, the truststore, our certificate;
        the broker's host name is checked against its certificate unless hostname verification is off."""
        if not self.uses_tls:
            return None
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=self.ca_location, cadata=self.ca_pem)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        if self.certificate_location:
            context.load_cert_chain(self.certificate_location, self.key_location or self.certificate_location,
                                    password=self.key_password)
        elif self.key_material is not None:
            from coordinator.security.stores import pem_files

            with pem_files(self.key_material) as path:
                context.load_cert_chain(path)
        context.check_hostname = self.verify_hostname and self.verify_certificates
        if not self.verify_certificates:
            context.verify_mode = ssl.CERT_NONE
        return context


def _librdkafka_oauthbearer(oauth: OAuthBearer) -> dict[str, str]:
    if oauth.unsecured:
        return {"enable.sasl.oauthbearer.unsecure.jwt": "true",
                "sasl.oauthbearer.config": f"principal={oauth.principal}"}
    settings = {"sasl.oauthbearer.method": "oidc", "sasl.oauthbearer.token.endpoint.url": oauth.token_endpoint_url or "",
                "sasl.oauthbearer.client.id": oauth.client_id or "",
                "sasl.oauthbearer.client.secret": oauth.client_secret or ""}
    if oauth.scope:
        settings["sasl.oauthbearer.scope"] = oauth.scope
    return settings


def load_command_config(path: str | Path) -> ClientSecurity:
    """Read and check a client properties file; ClientConfigError names what is wrong."""
    try:
        properties = load_properties(path)
    except OSError as exc:
        raise ClientConfigError("--command-config", f"cannot read {path}: {exc.strerror or exc}") from None
    return client_security(properties, base=Path(path).parent)


def client_security(properties: Mapping[str, str], base: Path | None = None) -> ClientSecurity:
    """The security settings of a client properties mapping (file locations relative to `base`)."""
    props = {key: value.strip() for key, value in properties.items()}
    for key in sorted(props):
        if key not in _KNOWN:
            if key.startswith(_SECURITY_PREFIXES):
                raise ClientConfigError(key, "not a supported security setting (supported: "
                                             "docs/security.md, 'To the cluster')")
            log.warning("event=client_setting_ignored key=%s reason=not_a_security_setting (each of the "
                        "coordinator's clients has its own settings)", key)
    protocol = props.get("security.protocol", "PLAINTEXT").upper()
    if protocol not in PROTOCOLS:
        raise ClientConfigError("security.protocol", f"{props['security.protocol']!r} is not one of "
                                                     f"{', '.join(PROTOCOLS)}")
    settings: dict[str, object] = {"protocol": protocol}
    if protocol in ("SASL_PLAINTEXT", "SASL_SSL"):
        settings.update(_sasl(props))
    if protocol in ("SSL", "SASL_SSL"):
        settings.update(_tls(props, base))
    else:
        for key in sorted(props):
            if key.startswith("ssl.") and key not in ("ssl.endpoint.identification.algorithm",):
                log.warning("event=client_setting_ignored key=%s reason=security.protocol=%s has no TLS", key,
                            protocol)
    return ClientSecurity(**settings)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------- SASL


def _sasl(props: Mapping[str, str]) -> dict[str, object]:
    key = "sasl.mechanism" if "sasl.mechanism" in props else "sasl.mechanisms"
    mechanism = props.get(key, "").upper()
    if not mechanism:
        raise ClientConfigError("sasl.mechanism", f"not set for security.protocol={props['security.protocol']} "
                                                  f"(Kafka's default, GSSAPI/Kerberos, is not supported): one of "
                                                  f"{', '.join(MECHANISMS)}")
    if mechanism not in MECHANISMS:
        raise ClientConfigError(key, f"{props[key]!r} is not supported: one of {', '.join(MECHANISMS)}")
    options = _jaas_options(props["sasl.jaas.config"], mechanism) if "sasl.jaas.config" in props else {}
    if mechanism == "OAUTHBEARER":
        return {"mechanism": mechanism, "oauthbearer": _oauthbearer(props, options)}
    username = options.get("username", props.get("sasl.username"))
    password = options.get("password", props.get("sasl.password"))
    if options.get("tokenauth", "false").lower() == "true":
        raise ClientConfigError("sasl.jaas.config", "delegation tokens (tokenauth=true) are not supported")
    if not username:
        raise ClientConfigError("sasl.jaas.config", f"no username for {mechanism}: sasl.jaas.config="
                                                    f"{_LOGIN_MODULES[mechanism]} required username=\"...\" "
                                                    f"password=\"...\"; (or sasl.username)")
    if password is None:
        raise ClientConfigError("sasl.jaas.config", f"no password for {mechanism} user {username!r} "
                                                    f"(or sasl.password)")
    return {"mechanism": mechanism, "username": username, "password": password}


_JAAS_OPTION = re.compile(r'\s*([A-Za-z_][\w.\-]*)\s*=\s*(?:"((?:\\.|[^"\\])*)"|([^\s;"]+))')


def _jaas_options(text: str, mechanism: str) -> dict[str, str]:
    """`<LoginModule> <flag> key=value ...;` — exactly one login module, as Kafka's JaasContext requires."""
    match = re.match(r"\s*([\w.$]+)\s+(\w+)", text)
    if match is None:
        raise ClientConfigError("sasl.jaas.config", "expected '<LoginModule class> required key=\"value\" ...;'")
    module, flag = match.groups()
    if module != _LOGIN_MODULES[mechanism]:
        raise ClientConfigError("sasl.jaas.config", f"login module {module} does not go with sasl.mechanism="
                                                    f"{mechanism} (expected {_LOGIN_MODULES[mechanism]})")
    if flag.lower() not in _JAAS_FLAGS:
        raise ClientConfigError("sasl.jaas.config", f"control flag {flag!r} is not one of {', '.join(_JAAS_FLAGS)}")
    options: dict[str, str] = {}
    rest = text[match.end():]
    while True:
        option = _JAAS_OPTION.match(rest)
        if option is None:
            break
        name, quoted, bare = option.groups()
        options[name] = re.sub(r"\\(.)", r"\1", quoted) if quoted is not None else bare
        rest = rest[option.end():]
    rest = rest.strip()
    if not rest.startswith(";"):
        raise ClientConfigError("sasl.jaas.config", "expected key=\"value\" options ending with ';'")
    if rest[1:].strip():
        raise ClientConfigError("sasl.jaas.config", "must contain exactly one login module")
    return options


def _oauthbearer(props: Mapping[str, str], options: Mapping[str, str]) -> OAuthBearer:
    endpoint = props.get("sasl.oauthbearer.token.endpoint.url")
    if endpoint:
        client_id = options.get("clientId", props.get("sasl.oauthbearer.client.id"))
        secret = options.get("clientSecret", props.get("sasl.oauthbearer.client.secret"))
        if not client_id or secret is None:
            raise ClientConfigError("sasl.jaas.config", "OAUTHBEARER with a token endpoint needs clientId and "
                                                        "clientSecret")
        return OAuthBearer(token_endpoint_url=endpoint, client_id=client_id, client_secret=secret,
                           scope=options.get("scope", props.get("sasl.oauthbearer.scope")))
    principal = options.get("unsecuredLoginStringClaim_sub")
    if principal is None and "sasl.oauthbearer.config" in props:  # librdkafka: "principal=admin scope=..."
        fields = dict(part.split("=", 1) for part in props["sasl.oauthbearer.config"].split() if "=" in part)
        principal = fields.get("principal")
    if not principal:
        raise ClientConfigError("sasl.jaas.config", "OAUTHBEARER needs sasl.oauthbearer.token.endpoint.url (OIDC) "
                                                    "or an unsecured token's unsecuredLoginStringClaim_sub")
    return OAuthBearer(principal=principal)


# ---------------------------------------------------------------------------------------------- TLS


def _tls(props: Mapping[str, str], base: Path | None) -> dict[str, object]:
    settings: dict[str, object] = {}
    algorithm = props.get("ssl.endpoint.identification.algorithm", "https").lower()
    if algorithm not in ("https", "", "none"):
        raise ClientConfigError("ssl.endpoint.identification.algorithm", f"{algorithm!r}: 'https' (the default) "
                                                                         f"or empty (no host name check)")
    settings["verify_hostname"] = algorithm == "https"
    verification = props.get("enable.ssl.certificate.verification", "true").lower()
    if verification not in ("true", "false"):
        raise ClientConfigError("enable.ssl.certificate.verification", f"{verification!r}: true or false")
    settings["verify_certificates"] = verification == "true"
    settings.update(_truststore(props, base))
    settings.update(_keystore(props, base))
    if "ssl.key.password" in props:
        settings["key_password"] = props["ssl.key.password"]
    return settings


def _truststore(props: Mapping[str, str], base: Path | None) -> dict[str, object]:
    if "ssl.ca.location" in props:
        return {"ca_location": _pem_file(props, "ssl.ca.location", base, "CERTIFICATE")}
    from coordinator.security.stores import read_truststore, typed_store

    store = typed_store(props, "ssl.truststore", base)
    if store is not None:
        path, kind = store
        return {"ca_pem": read_truststore(path, kind, props.get("ssl.truststore.password"))}
    if "ssl.truststore.password" in props:
        raise ClientConfigError("ssl.truststore.password", "not used with a PEM truststore (Kafka refuses it too)")
    _only_pem(props, "ssl.truststore.type")
    if "ssl.truststore.certificates" in props:
        if "CERTIFICATE" not in props["ssl.truststore.certificates"]:
            raise ClientConfigError("ssl.truststore.certificates", "expected PEM certificates")
        return {"ca_pem": props["ssl.truststore.certificates"]}
    if "ssl.truststore.location" in props:
        return {"ca_location": _pem_file(props, "ssl.truststore.location", base, "CERTIFICATE")}
    return {}


def _keystore(props: Mapping[str, str], base: Path | None) -> dict[str, object]:
    if "ssl.certificate.location" in props:  # librdkafka: certificate and key apart
        if "ssl.key.location" not in props:
            raise ClientConfigError("ssl.key.location", "needed with ssl.certificate.location")
        return {"certificate_location": _pem_file(props, "ssl.certificate.location", base, "CERTIFICATE"),
                "key_location": _pem_file(props, "ssl.key.location", base, "PRIVATE KEY")}
    if "ssl.keystore.location" not in props:
        return {}
    from coordinator.security.stores import read_keystore, typed_store

    store = typed_store(props, "ssl.keystore", base)
    if store is not None:
        path, kind = store
        material = read_keystore(path, kind, props.get("ssl.keystore.password"), props.get("ssl.key.password"))
        return {"key_material": material, "keystore_name": f"{path} ({kind})"}
    if "ssl.keystore.password" in props:
        raise ClientConfigError("ssl.keystore.password", "not used with a PEM keystore: give the key's password as "
                                                         "ssl.key.password (Kafka's rule for PEM)")
    _only_pem(props, "ssl.keystore.type")
    location = _pem_file(props, "ssl.keystore.location", base, "CERTIFICATE")
    if "PRIVATE KEY" not in Path(location).read_text(errors="replace"):
        raise ClientConfigError("ssl.keystore.location", f"{location} holds no private key: a PEM keystore is the "
                                                         f"key (PKCS#8) and the certificate chain in one file")
    return {"certificate_location": location, "key_location": location}


def _only_pem(props: Mapping[str, str], key: str) -> None:
    kind = props.get(key, "").upper()
    if kind and kind != "PEM":
        raise ClientConfigError(key, f"{kind}: a store of that type needs its location")


def _pem_file(props: Mapping[str, str], key: str, base: Path | None, block: str) -> str:
    path = Path(props[key]).expanduser()
    if not path.is_absolute() and base is not None and not path.exists():
        path = base / path
    try:
        text = path.read_text(errors="replace")
    except OSError as exc:
        raise ClientConfigError(key, f"cannot read {path}: {exc.strerror or exc}") from None
    if f"-----BEGIN {block}" not in text and not (block == "PRIVATE KEY" and "PRIVATE KEY-----" in text):
        hint = " (a JKS or PKCS12 store? set the type to PEM and convert it)" if block == "CERTIFICATE" else ""
        raise ClientConfigError(key, f"{path} is not a PEM file with a {block}{hint}")
    return str(path.resolve())
