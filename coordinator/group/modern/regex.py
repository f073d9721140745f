"""Regular expression subscriptions (KIP-848, Kafka 4.1's GroupMetadataManager): RE2 syntax, full match, resolved
against every topic of the cluster, asynchronously, as Kafka's coordinator does it.

A heartbeat that brings a regular expression nobody in the group subscribes to yet checks it
(INVALID_REGULAR_EXPRESSION) and asks for a resolution; one already resolved in the group bumps the epoch at once.
A resolution runs after the heartbeat is answered, over all the group's regular expressions, at most every 10 s,
when one is not resolved yet, a topic was created in the cluster, or the last one is older than
`group.consumer.regex.refresh.interval.ms` (10 min). Like Kafka, it writes every resolution (record 16, with the
new timestamp) whether or not its topics changed; when some regular expression now matches other topics, or the
new matches change the subscribed topics' metadata, it also bumps the group epoch, and the next heartbeat computes
the target. A member's subscription is its names plus its regular expression's topics.

With an authorizer, a resolution keeps only the topics the principal of the heartbeat that asked for it may
DESCRIBE when it runs (filterTopicDescribeAuthorizedTopics): the resolution is the group's, so every member with
that regular expression gets those topics. An ACL change alone resolves nothing again; the next resolution (a new
regular expression in the group, a topic created in the cluster, or the refresh interval passed) applies the ACLs
then.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from typing import Any

import re2

from coordinator.group.modern.errors import ApiError
from coordinator.group.modern.group import ConsumerGroup
from coordinator.group.modern.member import ConsumerGroupMember
from coordinator.group.modern.records import ConsumerGroupRecord, RecordType, RegexRecord, Tombstone
from coordinator.group.modern.topics import bumped_group_epoch, metadata_hash
from coordinator.topics import TopicsView
from protocol.error_codes import Errors

log = logging.getLogger("coordinator.group")

REGEX_BATCH_REFRESH_INTERVAL_MS = 10_000
REGEX_REFRESH_INTERVAL_MS = 600_000  # group.consumer.regex.refresh.interval.ms's default
# of the topics given, those the requesting principal may DESCRIBE (None: the cluster has no authorizer)
DescribableTopics = Callable[[Iterable[str]], Collection[str]]
_OPTIONS = re2.Options()
_OPTIONS.log_errors = False  # a client's bad pattern is its error, answered; not a line on our stderr


@functools.lru_cache(maxsize=1024)
def compiled(regex: str) -> Any:  # re2's compiled pattern (the binding has no type information)
    return re2.compile(regex, options=_OPTIONS)


# RE2's error texts as RE2/J (Kafka's binding) words them; Kafka's message carries RE2/J's description alone
_RE2J_DESCRIPTIONS = {
    "missing ]": "missing closing ]",
    "missing )": "missing closing )",
    "unexpected )": "regexp/syntax: internal error",  # RE2/J reports an unmatched ) so
    "bad repetition operator": "invalid nested repetition operator",
    "invalid repetition size": "invalid repeat count",
    "trailing \\": "trailing backslash at end of expression",
    "no argument for repetition operator": "missing argument to repetition operator",
    "invalid perl operator": "invalid or unsupported Perl syntax",
    "invalid named capture group": "invalid named capture",
}


def check(regex: str) -> None:
    try:
        compiled(regex)
    except re2.error as exc:
        detail = exc.args[0].decode(errors="replace") if exc.args and isinstance(exc.args[0], bytes) else str(exc)
        code = detail.split(": ", 1)[0]
        description = _RE2J_DESCRIPTIONS.get(code, code)
        raise ApiError(Errors.INVALID_REGULAR_EXPRESSION,
                       f"SubscribedTopicRegex `{regex}` is not a valid regular expression: {description}.") from exc


@dataclass(frozen=True, slots=True)
class Refresh:
    """Regular expressions to resolve after the heartbeat; unless `forced`, only if a topic was created since the
    last resolution (Kafka learns of created topics from its metadata image; we list the topics first)."""

    regexes: frozenset[str]
    forced: bool


def regexes_after(group: ConsumerGroup, member: ConsumerGroupMember, updated: ConsumerGroupMember,
                  records: list[ConsumerGroupRecord], topics: TopicsView, now_wall_ms: int, *,
                  refresh_interval_ms: int = REGEX_REFRESH_INTERVAL_MS) -> tuple[bool, Refresh | None]:
    """Kafka's maybeUpdateRegularExpressions: (bump the epoch now?, what to resolve after the heartbeat). The
    resolutions' timestamps are wall-clock ms, like Kafka's."""
    old, new = member.subscribed_topic_regex, updated.subscribed_topic_regex
    if old == new and not group.has_regex_subscribers():  # the usual heartbeat: nothing to count
        return False, None
    subscribed = group.subscribed_regexes()
    bump = require = False
    if old != new:
        if old and subscribed[old] == 1:  # its last subscriber moves on: the resolution goes
            records.append(Tombstone(RecordType.REGULAR_EXPRESSION, group.group_id, regex=old))
        if new:
            if subscribed[new] == 0:
                check(new)
                require = True
            else:
                bump = new in group.resolved_regexes
    if not require and not subscribed:
        return bump, None
    last_refresh_ms = group.last_regex_refresh_ms
    if last_refresh_ms is not None and now_wall_ms <= last_refresh_ms + REGEX_BATCH_REFRESH_INTERVAL_MS:
        return bump, None
    wanted = group.subscribed_regexes(updated)
    require = require or len(wanted) != len(group.resolved_regexes)
    require = require or group.last_regex_version < topics.version
    require = require or (last_refresh_ms is not None and now_wall_ms > last_refresh_ms + refresh_interval_ms)
    return bump, Refresh(frozenset(wanted), require) if wanted else None


def resolve(regexes: frozenset[str], names: list[str], *,
            describable: DescribableTopics | None = None) -> dict[str, tuple[str, ...]]:
    """Each regular expression's topics (full match) the principal may describe; one that does not compile
    resolves to nothing. A topic denied is left out of every regular expression."""
    resolved: dict[str, tuple[str, ...]] = {}
    for regex in regexes:
        try:
            pattern = compiled(regex)
        except re2.error:
            log.error("Couldn't parse regular expression '%s'. Ignoring it.", regex)
            resolved[regex] = ()
            continue
        resolved[regex] = tuple(sorted(name for name in names if pattern.fullmatch(name) is not None))
    if describable is None:
        return resolved
    allowed = describable({name for matched in resolved.values() for name in matched})
    return {regex: tuple(name for name in matched if name in allowed) for regex, matched in resolved.items()}


def resolution_records(group: ConsumerGroup, resolved: dict[str, tuple[str, ...]], version: int, now_wall_ms: int,
                       topics: TopicsView) -> list[ConsumerGroupRecord]:
    """Kafka's handleRegularExpressionsResult: the resolutions of the regular expressions still subscribed to, and
    a group epoch bump if one now matches other topics or the subscribed topics' metadata changed."""
    records: list[ConsumerGroupRecord] = []
    subscribed = group.subscribed_regexes()
    bump = False
    kept: dict[str, tuple[str, ...]] = {}
    for regex, matched in resolved.items():
        if subscribed[regex] == 0:
            continue
        old = group.resolved_regexes.get(regex)
        bump = bump or (old.topics if old is not None else ()) != matched
        kept[regex] = matched
        records.append(RegexRecord(group.group_id, regex, matched, version, now_wall_ms))
    new_hash = metadata_hash(group.subscribed_topic_names(resolved=kept), topics)
    if bump or new_hash != group.metadata_hash:
        records.append(bumped_group_epoch(group.group_id, group.group_epoch + 1, new_hash))
    return records
