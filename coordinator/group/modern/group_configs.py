"""Group-level configuration of consumer groups (KIP-848's dynamic group configs, Kafka 4.1).

An operator sets `consumer.session.timeout.ms` or `consumer.heartbeat.interval.ms` on one group (`kafka-configs
--entity-type groups --entity-name G --alter --add-config ...`); Kafka's controller checks and stores them, and its
group coordinator takes the group's value wherever it reads these settings (GroupConfigManager): a member's session
timer is armed with it at each heartbeat, and each heartbeat's answer carries the group's interval. A name the group
does not set takes the coordinator's own setting.

This coordinator stands beside the cluster and reads them with DescribeConfigs (resource type GROUP): a value whose
source is GROUP_CONFIG is set on the group; any other is the broker's default, and ours applies instead. They are
kept per group:
- a heartbeat reads the cache, never the cluster. A group not in it is read before its first heartbeat is answered
  (a bounded wait on that request only), as Kafka's coordinator has every group's configuration at hand;
- an entry older than `group.config.refresh.interval.ms` is read again in the background at its group's next
  heartbeat (a change made straight at the cluster applies within that interval), and at once, then again a moment
  later (the broker answering may not have the change yet), when the relay forwards a successful
  (Incremental)AlterConfigs of the group;
- at most `group.config.max.groups` entries: the one read longest ago goes first (an entry in use is read again
  every interval, so it is never the oldest);
- a read that fails is logged once (until one succeeds) and the group keeps what was known: our defaults for a
  group never read.
The controller checked the values against the broker's bounds; they are checked again against ours with Kafka's
rules and messages (GroupConfig.validate), since the two may differ: a group whose configuration this coordinator
would refuse keeps our defaults, with a log line.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping
from dataclasses import dataclass

from coordinator.config import CoordinatorConfig
from coordinator.group_configs import Described
from coordinator.timer import Clock

log = logging.getLogger("coordinator.group")

SESSION_TIMEOUT = "consumer.session.timeout.ms"
HEARTBEAT_INTERVAL = "consumer.heartbeat.interval.ms"
NAMES = (SESSION_TIMEOUT, HEARTBEAT_INTERVAL)
READ_BATCH = 100  # groups per DescribeConfigs
FIRST_READ_WAIT_S = 5.0  # how long a group's first heartbeat waits for its configuration (then: our defaults)
RECHECK_AFTER_ALTER_S = 1.0

Describe = Callable[[list[str]], Awaitable[Mapping[str, Described]]]


@dataclass(frozen=True, slots=True)
class GroupConfig:
    session_timeout_ms: int
    heartbeat_interval_ms: int


class GroupConfigError(ValueError):
    """A group configuration Kafka's GroupConfig.validate refuses (InvalidConfigurationException's message)."""


def effective_config(overrides: Mapping[str, str], config: CoordinatorConfig) -> GroupConfig:
    """The group's values: its own where it sets them, ours elsewhere, checked as GroupConfig.validate checks the
    broker's defaults merged with the group's (in its order, with its messages). Raises GroupConfigError."""
    session_ms = _int(overrides, SESSION_TIMEOUT, config.group_consumer_session_timeout_ms)
    interval_ms = _int(overrides, HEARTBEAT_INTERVAL, config.group_consumer_heartbeat_interval_ms)
    for name, value, bound, broker_name, below in (
            (HEARTBEAT_INTERVAL, interval_ms, config.group_consumer_min_heartbeat_interval_ms,
             "group.consumer.min.heartbeat.interval.ms", True),
            (HEARTBEAT_INTERVAL, interval_ms, config.group_consumer_max_heartbeat_interval_ms,
             "group.consumer.max.heartbeat.interval.ms", False),
            (SESSION_TIMEOUT, session_ms, config.group_consumer_min_session_timeout_ms,
             "group.consumer.min.session.timeout.ms", True),
            (SESSION_TIMEOUT, session_ms, config.group_consumer_max_session_timeout_ms,
             "group.consumer.max.session.timeout.ms", False)):
        if below and value < bound:
            raise GroupConfigError(f"{name} must be greater than or equal to {broker_name}")
        if not below and value > bound:
            raise GroupConfigError(f"{name} must be less than or equal to {broker_name}")
    if session_ms <= interval_ms:
        raise GroupConfigError(f"{SESSION_TIMEOUT} must be greater than {HEARTBEAT_INTERVAL}")
    return GroupConfig(session_ms, interval_ms)


def _int(overrides: Mapping[str, str], name: str, default: int) -> int:
    """ConfigDef's INT with atLeast(1)."""
    text = overrides.get(name)
    if text is None:
        return default
    try:
        value = int(text.strip())
    except ValueError:
        raise GroupConfigError(f"Invalid value {text} for configuration {name}: Not a number of type INT") from None
    if not -2**31 <= value < 2**31:
        raise GroupConfigError(f"Invalid value {text} for configuration {name}: Not a number of type INT")
    if value < 1:
        raise GroupConfigError(f"Invalid value {value} for configuration {name}: Value must be at least 1")
    return value


class _Entry:
    __slots__ = ("config", "stale_at_ms", "overrides")

    def __init__(self, config: GroupConfig, stale_at_ms: int, overrides: Mapping[str, str] | None) -> None:
        self.config = config
        self.stale_at_ms = stale_at_ms  # read again when asked for from then on
        self.overrides = overrides  # as last read (None: never read successfully)


class GroupConfigs:
    """Each consumer group's configuration, read from the cluster by `describe` (None: there is no cluster to ask,
    every group has our defaults). Runs on the event loop that owns the groups."""

    def __init__(self, config: CoordinatorConfig, clock: Clock, describe: Describe | None = None) -> None:
        self.config = config
        self.clock = clock
        self.describe = describe
        self.defaults = GroupConfig(config.group_consumer_session_timeout_ms,
                                    config.group_consumer_heartbeat_interval_ms)
        # told when a group is first read (its values before: None), or read again with other values
        self.on_change: Callable[[str, GroupConfig | None, GroupConfig], None] | None = None
        self._refresh_ms = config.group_config_refresh_interval_ms
        self._max_groups = config.group_config_max_groups
        self._entries: OrderedDict[str, _Entry] = OrderedDict()  # oldest read first
        self._due: dict[str, None] = {}  # groups to read, in the order asked
        self._reading: set[str] = set()  # groups whose read is on its way
        self._first_reads: dict[str, asyncio.Future[None]] = {}  # groups never read, awaited by their heartbeat
        self._reader: asyncio.Task[None] | None = None
        self._rechecks: dict[int, asyncio.TimerHandle] = {}  # the second read after an alteration, by number
        self._recheck_numbers = itertools.count()
        self._failing = False  # the last read failed (logged once)
        self._closed = False
        self._refusals_logged: set[int] = set()  # error codes the cluster answered for a group, logged once each

    # --- the heartbeat's side (no waiting) ------------------------------------------------------------------
    def get(self, group_id: str, now_ms: int | None = None) -> GroupConfig:
        """The group's values at `now_ms` (default: the clock's); a group not read yet, or read too long ago, is
        read in the background. On every heartbeat: one lookup when the entry is fresh."""
        entry = self._entries.get(group_id)
        if entry is not None and (now_ms if now_ms is not None else self.clock.now_ms()) < entry.stale_at_ms:
            return entry.config
        if self.describe is not None:
            self._read_soon(group_id)
        return entry.config if entry is not None else self.defaults

    def known(self, group_id: str) -> bool:
        """The group has been read (or there is nothing to read): its heartbeat need not wait."""
        return group_id in self._entries or self.describe is None or self._closed or not group_id.strip()

    async def first_read(self, group_id: str) -> None:
        """Returns once the group has been read (or its read failed), at most FIRST_READ_WAIT_S later."""
        if self.known(group_id):
            return
        waiter = self._first_reads.get(group_id)
        if waiter is None:
            waiter = self._first_reads[group_id] = asyncio.get_running_loop().create_future()
        self._read_soon(group_id)
        try:
            await asyncio.wait_for(asyncio.shield(waiter), FIRST_READ_WAIT_S)
        except TimeoutError:
            log.warning("event=group_config_read_slow group=%s detail=answered with the defaults while the read "
                        "goes on", group_id)
            if group_id not in self._entries:  # the group's next heartbeats do not wait again meanwhile
                self._entries[group_id] = _Entry(self.defaults, self.clock.now_ms(), None)
                self._evict()

    def invalidate(self, group_ids: Iterable[str]) -> None:
        """The groups' configurations were altered (through the relay): read again now, and once more a moment
        later, since the broker answering may take a moment to learn the change from the controller. A group
        neither kept nor being read is read when it is next asked for."""
        if self.describe is None:
            return
        known = [group_id for group_id in group_ids if group_id in self._entries or group_id in self._reading]
        if not known:
            return
        for group_id in known:
            self._read_soon(group_id, again=True)
        number = next(self._recheck_numbers)
        self._rechecks[number] = asyncio.get_running_loop().call_later(RECHECK_AFTER_ALTER_S, self._recheck, number,
                                                                       known)

    def _recheck(self, number: int, group_ids: list[str]) -> None:
        del self._rechecks[number]
        for group_id in group_ids:
            if group_id in self._entries or group_id in self._reading:
                self._read_soon(group_id, again=True)

    def __len__(self) -> int:
        return len(self._entries)

    # --- reading ------------------------------------------------------------------------------------------
    def _read_soon(self, group_id: str, *, again: bool = False) -> None:
        """`again`: even if a read of the group is on its way (it may have been answered before an alteration)."""
        if self._closed or (group_id in self._reading and not again) or not group_id.strip():
            return
        self._due[group_id] = None
        if self._reader is None or self._reader.done():
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:  # no loop (a synchronous caller): read when one asks from the loop
                return
            self._reader = loop.create_task(self._read_due(), name="group-config-read")

    async def _read_due(self) -> None:
        while self._due:
            batch = list(itertools.islice(self._due, READ_BATCH))
            for group_id in batch:
                del self._due[group_id]
            self._reading.update(batch)
            try:
                assert self.describe is not None
                described = await self.describe(batch)
            except asyncio.CancelledError:
                self._release(batch)
                raise
            except Exception as exc:  # the cluster's trouble never reaches a heartbeat
                self._read_failed(batch, exc)
            else:
                self._read(batch, described)
            self._release(batch)

    def _read(self, batch: list[str], described: Mapping[str, Described]) -> None:
        if self._failing:
            self._failing = False
            log.info("event=group_config_read_recovered")
        now_ms = self.clock.now_ms()
        for group_id in batch:
            answer = described.get(group_id)
            if isinstance(answer, Mapping):
                self._store(group_id, self._checked(group_id, answer), now_ms, dict(answer))
            else:
                code = answer if isinstance(answer, int) else -1  # -1: the answer left the group out
                if code not in self._refusals_logged:
                    self._refusals_logged.add(code)
                    log.warning("event=group_config_read_refused group=%s error_code=%d detail=the group keeps what "
                                "was known; logged once per error code", group_id, code)
                self._keep(group_id, now_ms)

    def _checked(self, group_id: str, overrides: Mapping[str, str]) -> GroupConfig:
        try:
            return effective_config(overrides, self.config)
        except GroupConfigError as exc:
            entry = self._entries.get(group_id)
            if entry is None or entry.overrides != overrides:  # once per configuration read
                log.warning("event=group_config_refused group=%s configs=%s error=%s detail=the group keeps this "
                            "coordinator's defaults", group_id, dict(overrides), exc)
            return self.defaults

    def _read_failed(self, batch: list[str], exc: Exception) -> None:
        if not self._failing:
            self._failing = True
            log.warning("event=group_config_read_failed groups=%d error=%r detail=groups keep what was known (the "
                        "defaults if never read); logged once until a read succeeds", len(batch), exc)
        now_ms = self.clock.now_ms()
        for group_id in batch:
            self._keep(group_id, now_ms)

    def _keep(self, group_id: str, now_ms: int) -> None:
        """Not read this time: what was known stays, until the next refresh."""
        entry = self._entries.get(group_id)
        self._store(group_id, entry.config if entry is not None else self.defaults, now_ms,
                    entry.overrides if entry is not None else None)

    def _store(self, group_id: str, config: GroupConfig, now_ms: int, overrides: Mapping[str, str] | None) -> None:
        entry = self._entries.pop(group_id, None)
        before = entry.config if entry is not None else None
        self._entries[group_id] = _Entry(config, now_ms + self._refresh_ms, overrides)
        self._evict()
        if config != before and self.on_change is not None:
            self.on_change(group_id, before, config)

    def _evict(self) -> None:
        while len(self._entries) > self._max_groups:
            self._entries.popitem(last=False)

    def _release(self, batch: Collection[str]) -> None:
        self._reading.difference_update(batch)
        for group_id in batch:
            waiter = self._first_reads.pop(group_id, None)
            if waiter is not None and not waiter.done():
                waiter.set_result(None)

    async def close(self) -> None:
        """Stops reading; every heartbeat waiting for a first read goes on with the defaults."""
        self._closed = True
        for handle in self._rechecks.values():
            handle.cancel()
        self._rechecks.clear()
        self._due.clear()
        if self._reader is not None and not self._reader.done():
            self._reader.cancel()
            try:
                await self._reader
            except asyncio.CancelledError:
                pass
        self._release(list(self._first_reads))

