"""Who a connection on our listeners is, as Kafka's DefaultKafkaPrincipalBuilder names it:

- PLAINTEXT, or SSL without a client certificate: User:ANONYMOUS;
- SSL with a certificate: `ssl.principal.mapping.rules` applied to the certificate subject written as Java's
  `X500Principal.getName()` does (RFC 2253; SslPrincipalMapper's rules: `DEFAULT` or
  `RULE:pattern/replacement/[L|U]`, the first rule whose pattern matches the whole name wins, `$n` back
  references, no rule matching fails the connection);
- SASL (the certificate, if any, ignored): User:<authorization id> as the broker authenticated it — PLAIN's and
  SCRAM's user name, OAUTHBEARER's `sub` claim (the claim Kafka's default validators take).
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from dataclasses import dataclass

from coordinator.security.authorizer import ANONYMOUS

DEFAULT_RULES = "DEFAULT"
_RULE = r"(DEFAULT)|RULE:((\\.|[^\\/])*)/((\\.|[^\\/])*)/([LU]?).*?|(.*?)"
_RULE_SPLITTER = re.compile(r"\s*(" + _RULE + r")\s*(,\s*|$)")
_RULE_PARSER = re.compile(_RULE)


class PrincipalMappingError(Exception):
    """No mapping rule applies to a certificate's name: Kafka fails the authentication."""


@dataclass(frozen=True)
class _Rule:
    pattern: re.Pattern[str] | None  # None: DEFAULT
    replacement: str = ""
    case: str = ""  # "L", "U" or ""

    def apply(self, name: str) -> str | None:
        if self.pattern is None:
            return name
        if self.pattern.fullmatch(name) is None:
            return None
        result = self.pattern.sub(lambda match: _java_replacement(self.replacement, match), name)
        if self.case == "L":
            return result.lower()
        if self.case == "U":
            return result.upper()
        return result


class SslPrincipalMapper:
    """`ssl.principal.mapping.rules`, parsed as Kafka parses them (ValueError for an invalid rule)."""

    def __init__(self, rules: str | None = None) -> None:
        self.text = DEFAULT_RULES if rules is None else rules
        parsed = [_parse(rule) for rule in _split(self.text)]
        self.rules = [rule for rule in parsed if rule is not None]

    def name(self, distinguished_name: str) -> str:
        for rule in self.rules:
            mapped = rule.apply(distinguished_name)
            if mapped is not None:
                return mapped
        raise PrincipalMappingError(f"No rules apply to {distinguished_name}, rules {self.text}")


def _split(text: str) -> list[str]:
    return [match.group(1) for match in _RULE_SPLITTER.finditer(text.strip())]


def _parse(rule: str) -> _Rule | None:
    match = _RULE_PARSER.match(rule)
    if match is None or match.end() != len(rule):
        unmatched = rule[match.end():] if match else rule
        raise ValueError(f"Invalid rule: `{rule}`, unmatched substring: `{unmatched}`")
    if match.group(1) is not None:
        return _Rule(None)
    if match.group(2) is not None:
        try:
            pattern = re.compile(match.group(2))
        except re.error as exc:
            raise ValueError(f"Invalid rule: `{rule}`: {exc}") from None
        return _Rule(pattern, match.group(4), match.group(6))
    return None  # an empty rule is ignored


def _java_replacement(replacement: str, match: re.Match[str]) -> str:
    """Java's Matcher.appendReplacement: `\\x` is x, `$n` is group n (digits taken while they name a group);
    SslPrincipalMapper turns a reference to a group that does not exist into the literal text."""
    groups = len(match.groups())
    out: list[str] = []
    index = 0
    while index < len(replacement):
        char = replacement[index]
        if char == "\\" and index + 1 < len(replacement):
            out.append(replacement[index + 1])
            index += 2
            continue
        if char == "$" and index + 1 < len(replacement) and replacement[index + 1].isdigit():
            end = index + 2
            number = int(replacement[index + 1])
            if number > groups and groups > 0:  # SslPrincipalMapper's escapeLiteralBackReferences: literal
                out.append(char)
                index += 1
                continue
            while end < len(replacement) and replacement[end].isdigit() and number * 10 + int(replacement[end]) <= groups:
                number = number * 10 + int(replacement[end])
                end += 1
            if number > groups:
                raise ValueError(f"No group {number} in the rule's pattern")
            out.append(match.group(number) or "")
            index = end
            continue
        out.append(char)
        index += 1
    return "".join(out)


# ---------------------------------------------------------------------------------------------- certificates

# X500Name's RFC 2253 keywords; any other attribute is written OID=#<DER value in hex>.
_RFC2253_KEYWORDS = {
    "2.5.4.3": "CN", "2.5.4.6": "C", "2.5.4.7": "L", "2.5.4.8": "ST", "2.5.4.10": "O", "2.5.4.11": "OU",
    "2.5.4.9": "STREET", "0.9.2342.19200300.100.1.25": "DC", "0.9.2342.19200300.100.1.1": "UID",
}
# DER string types Java renders as text (AVA.isDerString, not canonical): UTF8, Printable, T61, IA5, General, BMP
_TEXT_TAGS = {12: "utf-8", 19: "latin-1", 20: "latin-1", 22: "latin-1", 27: "latin-1", 30: "utf-16-be"}
_ESCAPED = ',=+<>#;"\\'


def _der(data: bytes, offset: int) -> tuple[int, int, int]:
    """(tag, start of the content, end of the content) of the DER element at `offset`."""
    tag = data[offset]
    length = data[offset + 1]
    start = offset + 2
    if length & 0x80:
        count = length & 0x7F
        length = int.from_bytes(data[start:start + count], "big")
        start += count
    end = start + length
    if end > len(data):
        raise ValueError("truncated DER")
    return tag, start, end


def _children(data: bytes, start: int, end: int) -> list[tuple[int, int, int, int]]:
    """(tag, element start, content start, content end) of each element in data[start:end]."""
    found = []
    while start < end:
        tag, content, stop = _der(data, start)
        found.append((tag, start, content, stop))
        start = stop
    return found


def _oid(encoded: bytes) -> str:
    first, rest = divmod(encoded[0], 40) if encoded[0] < 80 else (2, encoded[0] - 80)
    parts, value = [first, rest], 0
    for byte in encoded[1:]:
        value = (value << 7) | (byte & 0x7F)
        if not byte & 0x80:
            parts.append(value)
            value = 0
    return ".".join(str(part) for part in parts)


def subject_name(certificate_der: bytes) -> str:
    """The certificate's subject as Java's X500Principal.getName() writes it (RFC 2253): last RDN first,
    `+` between the attributes of one RDN, Java's escapes."""
    _tag, start, end = _der(certificate_der, 0)
    _tag, tbs_start, tbs_end = _der(certificate_der, start)
    fields = _children(certificate_der, tbs_start, tbs_end)
    if fields and fields[0][0] == 0xA0:  # [0] version
        fields = fields[1:]
    _tag, _element, subject_start, subject_end = fields[4]  # serial, signature, issuer, validity, subject
    rdns = []
    for _set_tag, _set_element, set_start, set_end in _children(certificate_der, subject_start, subject_end):
        avas = []
        for _seq, _element, seq_start, seq_end in _children(certificate_der, set_start, set_end):
            (_o, _oe, oid_start, oid_end), (value_tag, value_element, value_start, value_end) = \
                _children(certificate_der, seq_start, seq_end)[:2]
            avas.append(_ava(_oid(certificate_der[oid_start:oid_end]), value_tag,
                             certificate_der[value_element:value_end], certificate_der[value_start:value_end]))
        rdns.append("+".join(avas))
    return ",".join(reversed(rdns))


def _ava(oid: str, tag: int, element: bytes, content: bytes) -> str:
    keyword = _RFC2253_KEYWORDS.get(oid)
    if keyword is None or tag not in _TEXT_TAGS:
        return f"{keyword or oid}=#{binascii.hexlify(element).decode()}"
    text = content.decode(_TEXT_TAGS[tag], errors="replace")
    escaped = "".join("\\" + c if c in _ESCAPED else "\\00" if c == "\0" else c for c in text)
    lead = len(escaped) - len(escaped.lstrip(" \r"))
    trail = len(escaped) - len(escaped.rstrip(" \r"))
    if lead == len(escaped):
        return f"{keyword}=" + "".join("\\" + c for c in escaped)
    middle = escaped[lead:len(escaped) - trail]
    return (f"{keyword}=" + "".join("\\" + c for c in escaped[:lead]) + middle
            + "".join("\\" + c for c in escaped[len(escaped) - trail:]))


def tls_principal(certificate_der: bytes | None, mapper: SslPrincipalMapper) -> str:
    """An SSL listener's principal: ANONYMOUS without a client certificate; PrincipalMappingError when no rule
    applies."""
    if not certificate_der:
        return ANONYMOUS
    return "User:" + mapper.name(subject_name(certificate_der))


# ---------------------------------------------------------------------------------------------- SASL


def oauthbearer_subject(client_first: bytes, claim: str = "sub") -> str | None:
    """The principal claim of the token in an OAUTHBEARER client-first message (RFC 7628:
    `n,,\\x01auth=Bearer <jwt>\\x01\\x01`); the broker validates the token, we only read whom it names."""
    try:
        text = client_first.decode()
        for part in text.split("\x01"):
            if part.startswith("auth="):
                token = part[len("auth="):].split(" ", 1)[1].strip()
                payload = token.split(".")[1]
                claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
                value = claims.get(claim) if isinstance(claims, dict) else None
                return value if isinstance(value, str) and value else None
    except (UnicodeDecodeError, IndexError, ValueError, binascii.Error):
        return None
    return None
