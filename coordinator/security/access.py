"""Who may do what on our listeners, with the broker's property names (`--config NAME=VALUE`):
`ssl.principal.mapping.rules`, `sasl.enabled.mechanisms`, `sasl.oauthbearer.sub.claim.name`, `super.users`,
`allow.everyone.if.no.acl.found`, `connections.max.reauth.ms` (KIP-368, on SASL listeners; per listener and
mechanism as `listener.name.<listener>[.<mechanism>].connections.max.reauth.ms`), and ours,
`acl.refresh.interval.ms` (how often the cluster's ACLs are read again). The broker's own values of these are not
readable through any API: give ours the cluster's."""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from typing import Mapping

from coordinator.security.acl_cache import DEFAULT_REFRESH_INTERVAL_MS
from coordinator.security.authorizer import Authorizer, parse_super_users
from coordinator.security.client_config import ClientConfigError
from coordinator.security.principals import DEFAULT_RULES, SslPrincipalMapper
from coordinator.security.sasl_passthrough import PASSABLE_MECHANISMS, ReauthLimits

log = logging.getLogger("coordinator.security")

ACCESS_NAMES = frozenset({"ssl.principal.mapping.rules", "sasl.enabled.mechanisms", "sasl.oauthbearer.sub.claim.name",
                          "super.users", "allow.everyone.if.no.acl.found", "acl.refresh.interval.ms",
                          "connections.max.reauth.ms"})
_REAUTH = "connections.max.reauth.ms"
# Kafka's listener prefix (ListenerName.configPrefix) and per-mechanism prefix (saslMechanismPrefix), both lower case
_LISTENER_REAUTH = re.compile(r"^listener\.name\.([^.]+)\.(?:([^.]+)\.)?connections\.max\.reauth\.ms$")


@dataclass(frozen=True)
class AccessSettings:
    principal_mapper: SslPrincipalMapper = field(default_factory=SslPrincipalMapper)
    # Kafka's default (GSSAPI) cannot pass through: every mechanism that can is enabled unless narrowed
    sasl_mechanisms: tuple[str, ...] = PASSABLE_MECHANISMS
    super_users: frozenset[str] = frozenset()
    allow_everyone_if_no_acl_found: bool = False
    refresh_interval_ms: int = DEFAULT_REFRESH_INTERVAL_MS
    oauthbearer_claim: str = "sub"  # the claim the brokers' OAUTHBEARER validator takes the principal from
    # connections.max.reauth.ms by mechanism: longest SASL session before re-authentication (0: none)
    max_reauth_ms: ReauthLimits = field(default_factory=ReauthLimits)

    def authorizer(self) -> Authorizer:
        return Authorizer(self.super_users, self.allow_everyone_if_no_acl_found)


def split_access_settings(properties: Mapping[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """(the access settings, everything else) of `--config` settings."""
    access = {name: value for name, value in properties.items() if _is_access_name(name)}
    return access, {name: value for name, value in properties.items() if not _is_access_name(name)}


def _is_access_name(name: str) -> bool:
    return name in ACCESS_NAMES or _LISTENER_REAUTH.match(name) is not None


def access_settings(properties: Mapping[str, str], *, listener: str | None = None) -> AccessSettings:
    """ClientConfigError names the setting at fault. `listener`: our listeners' name (Kafka's default, the
    security protocol: SASL_SSL), whose `listener.name.` settings apply."""
    try:
        mapper = SslPrincipalMapper(properties.get("ssl.principal.mapping.rules", DEFAULT_RULES))
    except ValueError as exc:
        raise ClientConfigError("ssl.principal.mapping.rules", str(exc)) from None
    mechanisms = tuple(m.strip().upper() for m in properties.get("sasl.enabled.mechanisms",
                                                                 ",".join(PASSABLE_MECHANISMS)).split(",")
                       if m.strip())
    unsupported = [m for m in mechanisms if m not in PASSABLE_MECHANISMS]
    if unsupported or not mechanisms:
        raise ClientConfigError("sasl.enabled.mechanisms", f"{', '.join(unsupported) or 'none'}: our listeners "
                                                           f"pass through {', '.join(PASSABLE_MECHANISMS)}")
    allow = properties.get("allow.everyone.if.no.acl.found", "false").strip().lower()
    if allow not in ("true", "false"):
        raise ClientConfigError("allow.everyone.if.no.acl.found", f"{allow!r}: true or false")
    interval = properties.get("acl.refresh.interval.ms", str(DEFAULT_REFRESH_INTERVAL_MS)).strip()
    if not interval.isdigit() or int(interval) < 100:
        raise ClientConfigError("acl.refresh.interval.ms", f"{interval!r}: milliseconds, at least 100")
    claim = properties.get("sasl.oauthbearer.sub.claim.name", "sub").strip()
    if not claim:
        raise ClientConfigError("sasl.oauthbearer.sub.claim.name", "empty: the claim naming the principal")
    return AccessSettings(mapper, mechanisms, parse_super_users(properties.get("super.users", "")), allow == "true",
                          int(interval), claim, reauth_limits(properties, listener))


def reauth_limits(properties: Mapping[str, str], listener: str | None) -> ReauthLimits:
    """`listener`'s connections.max.reauth.ms per mechanism, looked up as Kafka's SaslChannelBuilder does; the
    settings of other listeners are logged and left (we have none of that name)."""
    default = _milliseconds(properties, _REAUTH)
    by_mechanism: dict[str, int] = {}
    for name in sorted(properties):
        match = _LISTENER_REAUTH.match(name)
        if match is None:
            continue
        listener_name, mechanism = match.group(1), match.group(2)
        if listener_name != listener_name.lower() or (mechanism or "") != (mechanism or "").lower():
            # Kafka looks these names up in lower case only: it would ignore this one without a word
            raise ClientConfigError(name, "Kafka reads listener and mechanism names here in lower case (e.g. "
                                          "listener.name.sasl_ssl.scram-sha-256.connections.max.reauth.ms)")
        value = _milliseconds(properties, name)
        if listener is None or listener_name != listener.lower():
            log.warning("event=listener_setting_ignored key=%s reason=no listener %s here (ours: %s)", name,
                        listener_name, listener.lower() if listener else "none")
        elif mechanism is None:
            default = value  # the listener's own, over the broker-wide one
        else:
            by_mechanism[mechanism.upper()] = value
    return ReauthLimits(default, tuple(sorted(by_mechanism.items())))


def _milliseconds(properties: Mapping[str, str], name: str) -> int:
    text = properties.get(name, "0").strip()
    if not text.isdigit():
        raise ClientConfigError(name, f"{text!r}: milliseconds, 0 for none (Kafka's default)")
    return int(text)
