"""Group-level configuration of consumer groups (coordinator/group/modern/group_configs.py) on a manual clock: Kafka
4.1's checks of a group's values against the coordinator's bounds (GroupConfig.validate), the cache (read before a
group's first heartbeat, read again when older than the refresh interval or when altered, bounded, a failed read
logged once and what was known kept), and the values reaching ConsumerGroupHeartbeat's answer and the member's
session timer. `group.consumer.assignors` as a setting. The cluster's side (DescribeConfigs against a real Kafka
4.1.1 broker, an alteration through the relay) is in tests/interop/test_consumer_group_differential.py."""

from __future__ import annotations

import asyncio
import datetime
import logging
from collections.abc import Mapping

import pytest

from coordinator.config import CoordinatorConfig
from coordinator.group.modern.group_configs import (HEARTBEAT_INTERVAL, SESSION_TIMEOUT, GroupConfig, GroupConfigError,
                                                    GroupConfigs, effective_config)
from coordinator.group_configs import Described
from coordinator.group.modern.heartbeat import HeartbeatRequest
from coordinator.relay.group_configs import alteration_observer, altered_groups
from coordinator.timer import ManualClock
from kio.schema.errors import ErrorCode
from protocol import apis
from protocol.codec import encode_response_frame
from protocol.error_codes import Errors
from protocol.messages import build, item_class
from tests.support.consumer_group_env import GROUP, Env

BOUNDS = CoordinatorConfig(group_consumer_min_session_timeout_ms=2_000, group_consumer_session_timeout_ms=4_000,
                           group_consumer_min_heartbeat_interval_ms=500, group_consumer_heartbeat_interval_ms=1_000,
                           group_config_refresh_interval_ms=10_000, group_config_max_groups=3)


class Cluster:
    """The answers DescribeConfigs gives, as this test sets them; every read written down."""

    def __init__(self) -> None:
        self.overrides: dict[str, dict[str, str]] = {}
        self.errors: dict[str, int] = {}
        self.reads: list[list[str]] = []
        self.unreachable = False
        self.gate: asyncio.Event | None = None  # set: reads answer only once it is

    async def describe(self, group_ids: list[str]) -> Mapping[str, Described]:
        self.reads.append(list(group_ids))
        if self.gate is not None:
            await self.gate.wait()
        if self.unreachable:
            raise ConnectionError("the cluster did not answer")
        return {g: self.errors[g] if g in self.errors else dict(self.overrides.get(g, {})) for g in group_ids}


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def configs(cluster: Cluster, clock: ManualClock, config: CoordinatorConfig = BOUNDS) -> GroupConfigs:
    return GroupConfigs(config, clock, cluster.describe)


# --- Kafka's checks -------------------------------------------------------------------------------------------

def test_values_the_group_does_not_set_are_the_coordinators() -> None:
    assert effective_config({}, BOUNDS) == GroupConfig(4_000, 1_000)
    assert effective_config({HEARTBEAT_INTERVAL: "700"}, BOUNDS) == GroupConfig(4_000, 700)
    assert effective_config({SESSION_TIMEOUT: "3000", HEARTBEAT_INTERVAL: "600"}, BOUNDS) == GroupConfig(3_000, 600)


@pytest.mark.parametrize("overrides, message", [
    ({HEARTBEAT_INTERVAL: "400"},
     "consumer.heartbeat.interval.ms must be greater than or equal to group.consumer.min.heartbeat.interval.ms"),
    ({HEARTBEAT_INTERVAL: "15001"},
     "consumer.heartbeat.interval.ms must be less than or equal to group.consumer.max.heartbeat.interval.ms"),
    ({SESSION_TIMEOUT: "1999"},
     "consumer.session.timeout.ms must be greater than or equal to group.consumer.min.session.timeout.ms"),
    ({SESSION_TIMEOUT: "60001"},
     "consumer.session.timeout.ms must be less than or equal to group.consumer.max.session.timeout.ms"),
    ({SESSION_TIMEOUT: "3000", HEARTBEAT_INTERVAL: "3000"},
     "consumer.session.timeout.ms must be greater than consumer.heartbeat.interval.ms"),
    ({HEARTBEAT_INTERVAL: "5000"},  # against the coordinator's session timeout (4000)
     "consumer.session.timeout.ms must be greater than consumer.heartbeat.interval.ms"),
    # the interval's bounds are checked before the session's
    ({HEARTBEAT_INTERVAL: "1", SESSION_TIMEOUT: "1"},
     "consumer.heartbeat.interval.ms must be greater than or equal to group.consumer.min.heartbeat.interval.ms"),
    ({SESSION_TIMEOUT: "soon"}, "Invalid value soon for configuration consumer.session.timeout.ms: Not a number of "
                                "type INT"),
    ({SESSION_TIMEOUT: "0"}, "Invalid value 0 for configuration consumer.session.timeout.ms: Value must be at "
                             "least 1"),
])
def test_kafkas_checks_in_kafkas_order_with_its_messages(overrides: dict[str, str], message: str) -> None:
    with pytest.raises(GroupConfigError) as refused:
        effective_config(overrides, BOUNDS)
    assert str(refused.value) == message


# --- the cache ------------------------------------------------------------------------------------------------

async def test_a_group_is_read_once_then_again_when_older_than_the_refresh_interval() -> None:
    cluster, clock = Cluster(), ManualClock(0)
    cache = configs(cluster, clock)
    cluster.overrides["g"] = {HEARTBEAT_INTERVAL: "700"}
    assert not cache.known("g")
    await cache.first_read("g")
    assert cache.known("g") and cache.get("g") == GroupConfig(4_000, 700) and cluster.reads == [["g"]]
    cluster.overrides["g"] = {HEARTBEAT_INTERVAL: "800"}
    clock.advance(9_999)
    assert cache.get("g").heartbeat_interval_ms == 700
    await settle()
    assert cluster.reads == [["g"]]  # not due yet
    clock.advance(1)
    assert cache.get("g").heartbeat_interval_ms == 700  # the value known now; the read goes on in the background
    await settle()
    assert cluster.reads == [["g"], ["g"]] and cache.get("g").heartbeat_interval_ms == 800
    await cache.close()


async def test_groups_due_together_are_read_in_one_request() -> None:
    cluster, clock = Cluster(), ManualClock(0)
    cache = configs(cluster, clock, CoordinatorConfig(group_config_max_groups=10))
    cluster.gate = asyncio.Event()
    waits = [asyncio.create_task(cache.first_read(g)) for g in ("a", "b", "c")]
    await settle()
    assert cluster.reads == [["a", "b", "c"]]
    waits += [asyncio.create_task(cache.first_read(g)) for g in ("d", "e")]  # asked while that read is on its way
    await settle()
    cluster.gate.set()
    await asyncio.wait_for(asyncio.gather(*waits), 5)
    assert cluster.reads == [["a", "b", "c"], ["d", "e"]]
    await cache.close()


async def test_an_alteration_reads_the_group_again_at_once_and_a_moment_later(monkeypatch: pytest.MonkeyPatch
                                                                             ) -> None:
    monkeypatch.setattr("coordinator.group.modern.group_configs.RECHECK_AFTER_ALTER_S", 0.05)
    cluster, clock = Cluster(), ManualClock(0)
    cache = configs(cluster, clock)
    await cache.first_read("g")
    cluster.overrides["g"] = {SESSION_TIMEOUT: "3000"}
    cache.invalidate(["g", "never-read"])  # a group not kept here is read when it is next asked for
    await settle()
    assert cluster.reads == [["g"], ["g"]] and cache.get("g") == GroupConfig(3_000, 1_000)
    await asyncio.wait_for(_until(lambda: len(cluster.reads) == 3), 5)  # the second read
    assert cluster.reads[-1] == ["g"]
    await cache.close()


async def test_a_group_altered_while_its_read_is_on_its_way_is_read_again(monkeypatch: pytest.MonkeyPatch
                                                                          ) -> None:
    monkeypatch.setattr("coordinator.group.modern.group_configs.RECHECK_AFTER_ALTER_S", 0.05)
    cluster, clock = Cluster(), ManualClock(0)
    cache = configs(cluster, clock)
    cluster.gate = asyncio.Event()
    first = asyncio.create_task(cache.first_read("g"))
    await settle()
    cache.get("g")  # asked for again meanwhile: one read is enough
    cache.invalidate(["g"])  # the read on its way may hold the values from before
    cluster.overrides["g"] = {HEARTBEAT_INTERVAL: "700"}
    cluster.gate.set()
    await asyncio.wait_for(first, 5)
    await asyncio.wait_for(_until(lambda: len(cluster.reads) == 3), 5)
    assert cluster.reads == [["g"], ["g"], ["g"]] and cache.get("g").heartbeat_interval_ms == 700
    await cache.close()


async def _until(condition) -> None:  # type: ignore[no-untyped-def]
    while not condition():
        await asyncio.sleep(0.05)


async def test_at_most_max_groups_are_kept_the_one_read_longest_ago_first() -> None:
    cluster, clock = Cluster(), ManualClock(0)
    cache = configs(cluster, clock)  # 3 groups
    for group_id in ("a", "b", "c"):
        await cache.first_read(group_id)
        clock.advance(1_000)
    clock.advance(8_000)  # a is due again (10 s), b and c are not
    cache.get("a")
    await settle()
    await cache.first_read("d")
    assert len(cache) == 3 and not cache.known("b") and all(cache.known(g) for g in ("a", "c", "d"))
    await cache.close()


async def test_a_failed_read_is_logged_once_and_keeps_what_was_known(caplog: pytest.LogCaptureFixture) -> None:
    cluster, clock = Cluster(), ManualClock(0)
    cache = configs(cluster, clock)
    cluster.overrides["g"] = {HEARTBEAT_INTERVAL: "700"}
    await cache.first_read("g")
    cluster.unreachable = True
    with caplog.at_level(logging.WARNING, "coordinator.group"):
        clock.advance(10_000)
        cache.get("g")
        await settle()
        await cache.first_read("new")  # never read: the defaults, without waiting again
        clock.advance(10_000)
        cache.get("g")
        await settle()
    assert len(cluster.reads) == 4
    assert cache.get("g") == GroupConfig(4_000, 700) and cache.get("new") == GroupConfig(4_000, 1_000)
    assert cache.known("new")
    assert [r.getMessage() for r in caplog.records].count(
        "event=group_config_read_failed groups=1 error=ConnectionError('the cluster did not answer') detail=groups "
        "keep what was known (the defaults if never read); logged once until a read succeeds") == 1
    cluster.unreachable = False
    cluster.overrides["g"] = {HEARTBEAT_INTERVAL: "900"}
    clock.advance(10_000)
    cache.get("g")
    await settle()
    assert cache.get("g").heartbeat_interval_ms == 900
    await cache.close()


async def test_a_group_the_cluster_refuses_keeps_the_defaults(caplog: pytest.LogCaptureFixture) -> None:
    cluster, clock = Cluster(), ManualClock(0)
    cache = configs(cluster, clock)
    cluster.errors["g"] = int(Errors.GROUP_AUTHORIZATION_FAILED)
    cluster.overrides["h"] = {HEARTBEAT_INTERVAL: "100"}  # below this coordinator's minimum
    with caplog.at_level(logging.WARNING, "coordinator.group"):
        await cache.first_read("g")
        await cache.first_read("h")
    assert cache.get("g") == cache.get("h") == GroupConfig(4_000, 1_000)
    messages = " ".join(r.getMessage() for r in caplog.records)
    assert "event=group_config_read_refused group=g error_code=30" in messages
    assert ("event=group_config_refused group=h configs={'consumer.heartbeat.interval.ms': '100'} "
            "error=consumer.heartbeat.interval.ms must be greater than or equal to "
            "group.consumer.min.heartbeat.interval.ms") in messages
    await cache.close()


async def test_a_first_read_that_takes_too_long_lets_the_heartbeat_go_on(monkeypatch: pytest.MonkeyPatch) -> None:
    cluster, clock = Cluster(), ManualClock(0)
    cache = configs(cluster, clock)
    cluster.gate = asyncio.Event()
    monkeypatch.setattr("coordinator.group.modern.group_configs.FIRST_READ_WAIT_S", 0.05)
    cluster.overrides["g"] = {HEARTBEAT_INTERVAL: "700"}
    await asyncio.wait_for(cache.first_read("g"), 5)
    # the defaults meanwhile; the group's next heartbeats do not wait again, and the read goes on
    assert cache.known("g") and cache.get("g") == GroupConfig(4_000, 1_000)
    cluster.gate.set()
    await asyncio.wait_for(_until(lambda: cache.get("g").heartbeat_interval_ms == 700), 5)
    cluster.gate = asyncio.Event()
    waiting = asyncio.create_task(cache.first_read("h"))
    await settle()
    await cache.close()  # a waiter is never left behind
    await asyncio.wait_for(waiting, 5)
    await asyncio.wait_for(cache.first_read("i"), 5)  # closed: nothing is read any more
    assert cluster.reads == [["g"], ["h"]]


async def test_without_a_cluster_every_group_has_the_defaults_at_once() -> None:
    cache = GroupConfigs(BOUNDS, ManualClock(0))
    assert cache.known("g") and cache.get("g") == GroupConfig(4_000, 1_000)


# --- in ConsumerGroupHeartbeat ---------------------------------------------------------------------------------

def _env(cluster: Cluster, **config: int) -> Env:
    env = Env(group_consumer_min_session_timeout_ms=2_000, group_consumer_session_timeout_ms=4_000,
              group_consumer_min_heartbeat_interval_ms=500, group_consumer_heartbeat_interval_ms=1_000, **config)
    env.runtime.consumer_groups.group_configs.describe = cluster.describe
    return env


def _session_timer_ms(env: Env, member_id: str) -> int:
    return env.runtime.consumer_groups._timers[("session", GROUP, member_id)].timeout_ms


async def test_the_first_heartbeat_of_a_group_has_its_values() -> None:
    cluster = Cluster()
    cluster.overrides[GROUP] = {SESSION_TIMEOUT: "3000", HEARTBEAT_INTERVAL: "600"}
    env = _env(cluster)
    try:
        joined = await env.heartbeat("a", 0)
        assert (joined.error, joined.heartbeat_interval_ms) == (Errors.NONE, 600)
        assert _session_timer_ms(env, "a") == 3_000 and cluster.reads == [[GROUP]]
        # fenced at the group's session timeout, not the coordinator's
        env.advance(2_999)
        assert "a" in env.group().members
        env.advance(1)
        await settle()
        assert "a" not in env.group().members
    finally:
        await env.runtime.shutdown()
        await env.timer.close()


async def test_a_change_reaches_each_member_at_its_next_heartbeat_on_either_path() -> None:
    cluster = Cluster()
    env = _env(cluster)
    try:
        joined = await env.heartbeat("a", 0)
        assert joined.heartbeat_interval_ms == 1_000 and _session_timer_ms(env, "a") == 4_000
        cluster.overrides[GROUP] = {SESSION_TIMEOUT: "3000", HEARTBEAT_INTERVAL: "700"}
        env.runtime.consumer_groups.group_configs.invalidate([GROUP])
        await settle()
        assert _session_timer_ms(env, "a") == 4_000  # the running session is not shortened
        service = env.runtime.consumer_groups
        service.schedule_session(GROUP, "a")  # armed again from anywhere: the group's new value
        assert _session_timer_ms(env, "a") == 3_000
        for shortcut in (True, False):
            service.steady_shortcut = shortcut
            steady = await env.heartbeat("a", joined.member_epoch)
            assert (steady.error, steady.heartbeat_interval_ms) == (Errors.NONE, 700)
            assert _session_timer_ms(env, "a") == 3_000
        left = await env.heartbeat("a", -1)
        assert left.heartbeat_interval_ms == 0  # Kafka's leave answer carries none
    finally:
        await env.runtime.shutdown()
        await env.timer.close()


async def test_members_loaded_before_their_group_was_read_get_its_session_timeout() -> None:
    cluster = Cluster()
    env = _env(cluster)
    try:
        await env.heartbeat("a", 0)
        records = list(env.store.consumer_records)
        cluster.overrides[GROUP] = {SESSION_TIMEOUT: "2500"}
        fresh = _env(cluster)  # another coordinator loads the group's records
        try:
            shard = fresh.runtime.shard_for(GROUP)
            fresh.runtime.consumer_groups.load(shard, records)
            assert _session_timer_ms(fresh, "a") == 4_000  # armed at once, the group not read yet
            await asyncio.wait_for(_until(lambda: fresh.runtime.consumer_groups.group_configs.known(GROUP)), 5)
            assert _session_timer_ms(fresh, "a") == 2_500
        finally:
            await fresh.runtime.shutdown()
            await fresh.timer.close()
    finally:
        await env.runtime.shutdown()
        await env.timer.close()


async def test_only_groups_that_exist_or_are_joined_are_read() -> None:
    cluster = Cluster()
    env = _env(cluster)
    try:
        for group_id, epoch in (("elsewhere", 3), ("elsewhere", -1), ("", 0), ("  ", 1)):
            refused = await env.runtime.consumer_group_heartbeat(HeartbeatRequest(group_id, "m", epoch))
            assert refused.error in (Errors.GROUP_ID_NOT_FOUND, Errors.INVALID_REQUEST)
        await settle()
        assert cluster.reads == []
        await env.heartbeat("a", 0)
        assert cluster.reads == [[GROUP]]
    finally:
        await env.runtime.shutdown()
        await env.timer.close()


# --- group.consumer.assignors ---------------------------------------------------------------------------------

async def test_the_configured_assignors_are_offered_and_the_first_is_the_default() -> None:
    env = Env(group_consumer_assignors=("org.apache.kafka.coordinator.group.assignor.RangeAssignor",))
    try:
        refused = await env.heartbeat("a", 0, server_assignor="uniform")
        assert (refused.error, refused.message) == (
            Errors.UNSUPPORTED_ASSIGNOR, "ServerAssignor uniform is not supported. Supported assignors: range.")
        await env.heartbeat("a", 0)
        [described] = env.runtime.consumer_groups.describe([GROUP])
        assert described.assignor_name == "range"
    finally:
        await env.runtime.shutdown()
        await env.timer.close()


async def test_the_supported_assignors_are_listed_as_kafkas_hash_set_lists_them() -> None:
    env = Env(group_consumer_assignors=("range", "uniform"))
    try:
        refused = await env.heartbeat("a", 0, server_assignor="sticky")
        assert refused.message == "ServerAssignor sticky is not supported. Supported assignors: uniform, range."
        await env.heartbeat("a", 0)
        [described] = env.runtime.consumer_groups.describe([GROUP])
        assert described.assignor_name == "range"  # the first configured
    finally:
        await env.runtime.shutdown()
        await env.timer.close()


@pytest.mark.parametrize("value, names", [
    ("uniform,range", ("uniform", "range")),
    (" org.apache.kafka.coordinator.group.assignor.RangeAssignor , uniform ", ("range", "uniform")),
    ("range", ("range",)),
])
def test_assignors_by_name_or_kafkas_class_name(value: str, names: tuple[str, ...]) -> None:
    assert CoordinatorConfig.from_properties({"group.consumer.assignors": value}).consumer_group_assignor_names == names


@pytest.mark.parametrize("value, reason", [
    ("", "group.consumer.assignors must name at least one assignor"),
    ("uniform,org.apache.kafka.coordinator.group.assignor.UniformAssignor", "names an assignor twice"),
    ("com.example.MyAssignor", "'com.example.MyAssignor' is not one of Kafka's built-in assignors"),
])
def test_assignors_that_cannot_run_here_are_refused(value: str, reason: str) -> None:
    with pytest.raises(ValueError) as refused:
        CoordinatorConfig.from_properties({"group.consumer.assignors": value})
    assert reason in str(refused.value)


# --- the relay's side: which groups an alteration it forwards altered -------------------------------------------

@pytest.mark.parametrize("api_key, version", [(44, 0), (44, 1), (33, 0), (33, 1), (33, 2)])
def test_the_groups_an_alteration_answer_reports_altered(api_key: int, version: int) -> None:
    response = apis.response_class(api_key, version)
    result = item_class(response, "responses")
    body = build(response, throttle_time=datetime.timedelta(0), responses=(
        result(error_code=ErrorCode.none, error_message=None, resource_type=32, resource_name="g1"),
        result(error_code=ErrorCode.invalid_config, error_message="no", resource_type=32, resource_name="g2"),
        result(error_code=ErrorCode.none, error_message=None, resource_type=2, resource_name="a-topic"),
        result(error_code=ErrorCode.none, error_message=None, resource_type=32, resource_name="g3")))
    frame = encode_response_frame(7, apis.response_header_version(api_key, version), body)
    assert altered_groups(memoryview(frame), api_key, version) == ["g1", "g3"]
    told: list[list[str]] = []
    observe = alteration_observer(api_key, version, told.append)
    assert observe(memoryview(frame)) is None and told == [["g1", "g3"]]  # relayed as it is
    assert observe(memoryview(frame[:-3])) is None and told == [["g1", "g3"]]  # a frame it cannot read: no harm
