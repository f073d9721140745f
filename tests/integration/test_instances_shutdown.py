"""One instance of several (`--instance-id`) in-process against a real broker: the zombie guard's confirmation reads
the instances group through the owner map's one AdminClient (a description sent after the call), and a shutdown
leaves no thread of ours behind (membership consumer, owner map, guard pulse, event producer)."""

from __future__ import annotations

import asyncio
import threading
import time

from coordinator.app import ServiceOptions, running_service
from coordinator.config import CoordinatorConfig
from coordinator.server.config import ServerConfig
from tests.support.service import unique

PARTITIONS = 3
WAIT_S = 90  # joining the instances group and loading on a loaded machine: bounded, not timed


def ours(threads: set[threading.Thread]) -> set[str]:
    """Threads the service starts (the loop's default executor's workers are the test loop's, not ours)."""
    return {t.name for t in threads if t.is_alive() and not t.name.startswith("asyncio_")}


async def test_confirmation_reads_through_the_owner_map_and_shutdown_leaves_no_thread(kafka_bootstrap: str) -> None:
    before = set(threading.enumerate())
    options = ServiceOptions(server=ServerConfig(listen_host="127.0.0.1", listen_port=0),
                             group=CoordinatorConfig(offsets_topic_num_partitions=PARTITIONS,
                                                     group_initial_rebalance_delay_ms=0),
                             bootstrap=kafka_bootstrap, state_topic=unique("__state"),
                             event_topic=unique("__events"), instance_id="solo")
    async with running_service(options) as service:
        await asyncio.wait_for(service.loaded.wait(), WAIT_S)
        ownership = service.ownership
        assert ownership is not None and ownership.membership is not None
        started = ours(set(threading.enumerate()) - before)
        assert {"membership-", "owner-map-", "ownership-pulse-", "event-producer-poll"} <= {
            next((p for p in ("membership-", "owner-map-", "ownership-pulse-") if n.startswith(p)), n)
            for n in started}, started

        read_assignment = ownership._read_assignment  # what the guard's confirmation calls (app.py wires it)
        assert read_assignment is not None
        deadline = time.monotonic() + WAIT_S
        while (assigned := await read_assignment(ownership.membership)) is None:  # None: still rebalancing
            assert time.monotonic() < deadline, "the instances group never described stable"
            await asyncio.sleep(0.2)
        assert assigned == ownership.owned == set(range(PARTITIONS))  # the only instance: every partition

    # every close() joins its thread: nothing is left the moment the service has stopped
    assert not ours(set(threading.enumerate()) - before), sorted(ours(set(threading.enumerate()) - before))
