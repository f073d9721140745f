"""Who may do what on our listeners, with the broker's property names (`--config NAME=VALUE`):
`ssl.principal.mapping.rules`, `sasl.enabled.mechanisms`, `sasl.oauthbearer.sub.claim.name`, `super.users`,
`allow.everyone.if.no.acl.found`, `connections.max.reauth.ms` (KIP-368, on SASL listeners), and
ours, `acl.refresh.interval.ms` (how often the cluster's ACLs are read again). The broker's own values of these
are not readable through any API: give ours the cluster's."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from coordinator.security.acl_cache import DEFAULT_REFRESH_INTERVAL_MS
from coordinator.security.authorizer import Authorizer, parse_super_users
from coordinator.security.client_config import ClientConfigError
from coordinator.security.principals import DEFAULT_RULES, SslPrincipalMapper
from coordinator.security.sasl_passthrough import PASSABLE_MECHANISMS

ACCESS_NAMES = frozenset({"ssl.principal.mapping.rules", "sasl.enabled.mechanisms", "sasl.oauthbearer.sub.claim.name",
                          "super.users", "allow.everyone.if.no.acl.found", "acl.refresh.interval.ms",
                          "connections.max.reauth.ms"})


@dataclass(frozen=True)
class AccessSettings:
    principal_mapper: SslPrincipalMapper = field(default_factory=SslPrincipalMapper)
    # Kafka's default (GSSAPI) cannot pass through: every mechanism that can is enabled unless narrowed
    sasl_mechanisms: tuple[str, ...] = PASSABLE_MECHANISMS
    super_users: frozenset[str] = frozenset()
    allow_everyone_if_no_acl_found: bool = False
    refresh_interval_ms: int = DEFAULT_REFRESH_INTERVAL_MS
    oauthbearer_claim: str = "sub"  # the claim the brokers' OAUTHBEARER validator takes the principal from
    max_reauth_ms: int = 0  # connections.max.reauth.ms: longest SASL session before re-authentication (0: none)

    def authorizer(self) -> Authorizer:
        return Authorizer(self.super_users, self.allow_everyone_if_no_acl_found)


def split_access_settings(properties: Mapping[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """(the access settings, everything else) of `--config` settings."""
    access = {name: value for name, value in properties.items() if name in ACCESS_NAMES}
    return access, {name: value for name, value in properties.items() if name not in ACCESS_NAMES}


def access_settings(properties: Mapping[str, str]) -> AccessSettings:
    """ClientConfigError names the setting at fault."""
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
    max_reauth = properties.get("connections.max.reauth.ms", "0").strip()
    if not max_reauth.isdigit():
        raise ClientConfigError("connections.max.reauth.ms", f"{max_reauth!r}: milliseconds, 0 for none (Kafka's "
                                                              f"default)")
    return AccessSettings(mapper, mechanisms, parse_super_users(properties.get("super.users", "")), allow == "true",
                          int(interval), claim, int(max_reauth))
