"""The whole service on real Kafka leaves nothing behind for the cyclic collector.

tests/unit/test_server_connection_cycles.py runs the scenarios of tests/support/cycles.py against the server
and the group runtime with an in-memory store; here they run against `running_service` as `coordinator
serve --no-relay` assembles it: the Kafka state store (transactional writes, the loader when a partition is
unloaded and loaded again, tombstones), the event topic and the rebalance tracing (exported over OTLP to a
receiver in another process), the runtime-health probes and the GC policy; once without the relay on asyncio,
once behind the relay on uvloop (how `coordinator serve` runs by default), where group requests also park
behind relayed ones. Every write, load, event and
span of every scenario must be freed by reference counting alone (the policy freezes whatever lives through
two young collections: a cycle among them would be kept forever).
"""

from __future__ import annotations

import asyncio
import sys
import time

import pytest
import uvloop

from coordinator.app import ServiceOptions, running_service
from coordinator.config import CoordinatorConfig
from coordinator.server.config import ServerConfig
from coordinator.relay import RelayConfig
from protocol.apis import ApiKey
from tests.support.cycles import (REPO_ROOT, CollectorOff, Peer, Scenarios, join_request, run_scenarios, stable_member,
                                  summary)
from tests.support.service import unique
from tests.support.wire import request

pytestmark = pytest.mark.integration

GROUPS = CoordinatorConfig(group_initial_rebalance_delay_ms=0, group_min_session_timeout_ms=100,
                           offsets_topic_num_partitions=3)
_RECEIVER = ("from tests.support.otlp_receiver import OtlpReceiver; import sys; r = OtlpReceiver().start(); "
             "print(r.endpoint, flush=True); sys.stdin.read()")


def _relayed_then_parked(scenarios: Scenarios) -> None:
    """Behind the relay: a relayed request opens the connection's upstream link, a JoinGroup parks behind it,
    the client goes away with both in flight (and once more after the relayed answer came back)."""
    for read_metadata in (False, True):
        group_id = f"cycles-relayed-{read_metadata}-{time.monotonic_ns()}"
        first = stable_member(scenarios.port, group_id)[0]  # the newcomer's JoinGroup waits for it to rejoin
        peer = Peer(scenarios.port)
        peer.send(request(ApiKey.METADATA, 1, topics=()))
        if read_metadata:
            assert peer.receive().brokers
        required = peer.call(join_request(group_id)) if read_metadata else None
        parked = scenarios.parked()
        if required is not None:
            peer.send(join_request(group_id, required.member_id))
            scenarios.wait_parked(parked + 1)
        peer.close()
        first.close()


async def _left_for_the_collector(bootstrap: str, monkeypatch: pytest.MonkeyPatch,
                                  relay: RelayConfig | None) -> CollectorOff:
    receiver = await asyncio.create_subprocess_exec(sys.executable, "-c", _RECEIVER, cwd=REPO_ROOT,
                                                    stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)
    try:
        assert receiver.stdout is not None
        endpoint = (await asyncio.wait_for(receiver.stdout.readline(), 30)).decode().strip()
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
        monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "200")
        options = ServiceOptions(server=ServerConfig(listen_host="127.0.0.1", listen_port=0), group=GROUPS,
                                 bootstrap=bootstrap, state_topic=unique("__cycles_state"),
                                 event_topic=unique("__cycles_events"), relay=relay)
        extra = _relayed_then_parked if relay is not None else None
        topic = options.state_topic  # committed to: it exists (behind the relay, OffsetCommit checks that)
        async with running_service(options) as service:
            await asyncio.wait_for(service.loaded.wait(), 120)
            # warm-up, then the measured round
            await run_scenarios(service.server, service.coordinator, 0, fuzz=False, extra=extra, topic=topic,
                                settle=False)
            with CollectorOff() as off:
                await run_scenarios(service.server, service.coordinator, 1, fuzz=True, extra=extra, topic=topic)
                await asyncio.sleep(0.5)  # the span processor's batch leaves
    finally:
        if receiver.returncode is None:
            receiver.stdin.close()  # type: ignore[union-attr]
            await asyncio.wait_for(receiver.wait(), 30)
    return off


def _check(off: CollectorOff) -> None:
    assert "event=rebalance_prepare" in off.log and "event=partitions_unloaded" in off.log
    assert "has failed, removing it from the group" in off.log  # sessions expired within the window
    assert off.garbage == [], f"freed only by the cyclic collector (leaked once frozen): {summary(off.garbage)}"


async def test_the_service_frees_connections_groups_writes_and_spans_without_the_cyclic_collector(
        kafka_bootstrap: str, monkeypatch: pytest.MonkeyPatch) -> None:
    _check(await _left_for_the_collector(kafka_bootstrap, monkeypatch, relay=None))


def test_the_service_behind_its_relay_frees_everything_without_the_cyclic_collector_on_uvloop(
        kafka_bootstrap: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """`coordinator serve` as it runs by default: the relay in front, uvloop."""
    _check(uvloop.run(_left_for_the_collector(kafka_bootstrap, monkeypatch, relay=RelayConfig())))
