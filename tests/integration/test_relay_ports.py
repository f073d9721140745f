"""Two coordinator instances with the relay on one host: consecutive listen ports meet the other's broker
listener (listen port + 1 + node id). The second is refused at start with the flag that fixes it, and starts with
that flag; the two then serve side by side (real `coordinator serve` processes, the real broker)."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest
from confluent_kafka.admin import AdminClient

from tests.support.ports import free_run
from tests.support.service import service, unique

pytestmark = pytest.mark.integration


async def test_a_relay_port_clash_on_one_host_is_refused_with_the_flag_that_fixes_it(kafka_bootstrap: str) -> None:
    node_id = min(AdminClient({"bootstrap.servers": kafka_bootstrap}).list_topics(timeout=30).brokers)
    state_topic = unique("__state_ports")
    first = free_run(node_id + 3)
    clashing = first + 1 + node_id  # where the first instance's relay puts broker `node_id` by default
    other_base = free_run(node_id + 2)
    async with service(kafka_bootstrap, state_topic, listen=f"127.0.0.1:{clashing}", relay=True,
                       args=("--instance-id", "b", "--relay-base-port", str(other_base))) as b:
        refused = await asyncio.to_thread(
            subprocess.run, [sys.executable, "-m", "coordinator.cli", "serve", "--listen", f"127.0.0.1:{first}",
                             "--bootstrap-server", kafka_bootstrap, "--state-topic", state_topic,
                             "--event-topic", "", "--config", "offsets.topic.num.partitions=3",
                             "--instance-id", "a"],
            capture_output=True, text=True, timeout=180)
        assert refused.returncode == 1, refused.stdout + refused.stderr[-3000:]
        said = refused.stderr.splitlines()[-1]
        assert said.startswith("coordinator serve: could not start: RelayPortsTaken: "), refused.stderr[-3000:]
        assert f"broker {node_id} needs port {clashing}" in said and "--relay-base-port" in said

        base = free_run(node_id + 2)
        async with service(kafka_bootstrap, state_topic, listen=f"127.0.0.1:{first}", relay=True,
                           args=("--instance-id", "a", "--relay-base-port", str(base))) as a:
            line = ""
            while "broker listeners" not in line:
                line = (await asyncio.wait_for(a.process.stdout.readline(), 120)).decode()  # type: ignore[union-attr]
                assert line, a.log_text()[-3000:]
            assert f"{node_id}→{base + node_id}" in line
            assert a.process.returncode is None and b.process.returncode is None  # both serving
            assert await a.terminate() == 0
        assert await b.terminate() == 0
