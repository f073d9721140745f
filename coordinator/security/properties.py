"""Java `.properties` files as Kafka's tools read them (java.util.Properties.load): `key=value`, `key: value` or
`key value`; `#` and `!` comment lines; a line ending in an odd number of backslashes continues on the next
(whose leading white space is dropped); `\\t \\n \\r \\f \\uXXXX` escapes, any other escaped character stands for
itself. A later key wins, as in Java."""

from __future__ import annotations

from pathlib import Path

_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}
_SEPARATORS = "=:"
_SPACE = " \t\f"


def load_properties(path: str | Path) -> dict[str, str]:
    return parse_properties(Path(path).read_text(encoding="utf-8"))


def parse_properties(text: str) -> dict[str, str]:
    properties: dict[str, str] = {}
    for line in _logical_lines(text):
        key, value = _split(line)
        properties[key] = value
    return properties


def _logical_lines(text: str) -> list[str]:
    lines, current = [], None
    for raw in text.splitlines():
        part = raw.lstrip(_SPACE)
        if current is None and (not part or part[0] in "#!"):
            continue
        trailing = len(part) - len(part.rstrip("\\"))
        continues = trailing % 2 == 1
        if continues:
            part = part[:-1]
        current = part if current is None else current + part
        if not continues:
            lines.append(current)
            current = None
    if current is not None:
        lines.append(current)
    return lines


def _split(line: str) -> tuple[str, str]:
    """Key up to the first unescaped separator or white space; then white space, one separator, white space."""
    index = 0
    while index < len(line):
        char = line[index]
        if char == "\\":
            index += 2
            continue
        if char in _SEPARATORS or char in _SPACE:
            break
        index += 1
    key, rest = line[:index], line[index:].lstrip(_SPACE)
    if rest[:1] in (":", "="):
        rest = rest[1:].lstrip(_SPACE)
    return _unescape(key), _unescape(rest)


def _unescape(text: str) -> str:
    if "\\" not in text:
        return text
    out, index = [], 0
    while index < len(text):
        char = text[index]
        if char != "\\" or index + 1 == len(text):
            out.append(char)
            index += 1
            continue
        escaped = text[index + 1]
        if escaped == "u" and len(text) >= index + 6:
            out.append(chr(int(text[index + 2 : index + 6], 16)))
            index += 6
            continue
        out.append(_ESCAPES.get(escaped, escaped))
        index += 2
    return "".join(out)
