"""Direct connections and the groups they form leave nothing behind for the cyclic collector.

The service's GC policy (coordinator/runtime_health.py) freezes whatever survives two young collections, so a
reference cycle that was alive then and dies later is never freed: a leak per connection, member or group.
tests/interop/test_relay_connection_cycles.py guards the relay's connections; this guards what a client
reaches without the relay, with the collector off, through a real `CoordinatorServer` + `GroupRuntime`
(in-memory store) on asyncio and on uvloop (scenarios in tests/support/cycles.py):

- connections closed cleanly after every group API, closed mid-frame, closed while their JoinGroup or
  SyncGroup is parked in the purgatory (answered later to nobody);
- hostile frames the server answers by closing, then the mutation fuzzer (tests/fuzz) from another process;
- our own bug in a handler, before and after it parked (the funnel logs the traceback and closes);
- members removed by session expiry, rebalance timeout and LeaveGroup, groups deleted (DeleteGroups) and
  retired by the offset cleanup;
- a partition unloaded (what coordinator/cluster/ownership.py does when Kafka revokes it, or its zombie guard
  suspends it) while a JoinGroup and a SyncGroup are parked: answered NOT_COORDINATOR, groups dropped.

The client side is blocking sockets in a thread, so it makes no cyclic garbage of its own: afterwards the
collector must find nothing at all (on failure the types found are listed).
"""

from __future__ import annotations

import asyncio
from typing import Any

import uvloop

from coordinator.config import CoordinatorConfig
from coordinator.group.api import OffsetDeleteRequest, OffsetDeleteResponse
from coordinator.group.runtime import GroupRuntime
from coordinator.group.store import InMemoryGroupStore
from coordinator.server import CoordinatorServer, ServerConfig
from coordinator.timer import SystemTimer
from protocol.apis import ApiKey
from tests.support.cycles import CollectorOff, Peer, Scenarios, run_scenarios, summary
from tests.support.service_front import ServiceFront
from tests.support.wire import request

# A short initial delay: the first join of every group goes through InitialDelayedJoin as in production.
CONFIG = CoordinatorConfig(group_initial_rebalance_delay_ms=50, group_min_session_timeout_ms=100)


class _Buggy(ServiceFront):
    """The runtime, but OffsetDelete fails as a bug of ours would: at once, or after the handler parked."""

    async def delete_offsets(self, req: OffsetDeleteRequest) -> OffsetDeleteResponse:
        if req.group_id == "parks-first":
            await asyncio.sleep(0.01)  # parks the connection on a future first
        raise RuntimeError("a bug of ours")


def _our_bugs(scenarios: Scenarios) -> None:
    for group_id in ("fails-at-once", "parks-first"):
        peer = Peer(scenarios.port)
        peer.send(request(ApiKey.OFFSET_DELETE, 0, group_id=group_id, topics=()))
        assert peer.closed_by_server()
        peer.close()


async def _left_for_the_collector() -> tuple[list[object], str]:
    """What only the cyclic collector could free after the scenarios, and the service's log meanwhile."""
    timer = SystemTimer("cycles")
    timer.start()
    runtime = GroupRuntime(CONFIG, timer, InMemoryGroupStore())
    server = CoordinatorServer(ServerConfig(listen_host="127.0.0.1", listen_port=0, shutdown_grace_ms=1_000),
                               _Buggy(runtime))
    await server.start()
    try:
        await run_scenarios(server, runtime, 0, fuzz=False, extra=_our_bugs, settle=False)  # warm-up
        with CollectorOff() as off:
            await run_scenarios(server, runtime, 1, fuzz=True, extra=_our_bugs)
    finally:
        await server.close()
        await runtime.shutdown()
        await timer.close()
    return off.garbage, off.log


def _check(garbage: list[Any], log: str) -> None:
    assert log.count("event=handler_failed") >= 2, "the failing handlers ran"
    assert "has failed, removing it from the group" in log  # sessions expired within the window
    assert garbage == [], f"freed only by the cyclic collector (leaked once frozen): {summary(garbage)}"


async def test_direct_connections_and_groups_are_freed_without_the_cyclic_collector() -> None:
    _check(*await _left_for_the_collector())


def test_direct_connections_and_groups_are_freed_without_the_cyclic_collector_on_uvloop() -> None:
    _check(*uvloop.run(_left_for_the_collector()))
