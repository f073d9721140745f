"""`coordinator simulate --real 2` against `coordinator serve` with its relay in front of a real Kafka broker: beside
the simulated members, a confluent-kafka and an aiokafka consumer join their group through the relay, both get
partitions, both consume records a real producer wrote through the relay, both leave the group when simulate ends
(close -> LeaveGroup: the group is Empty at once, not after a session timeout), and the command exits 0."""

from __future__ import annotations

import asyncio
import json
import os
import sys

from tests.support.service import describe, service, unique, until_loaded

SETTINGS = ("group.initial.rebalance.delay.ms=300", "group.min.session.timeout.ms=1000")


async def test_simulate_with_real_consumers_through_the_relay(kafka_bootstrap: str) -> None:
    async with service(kafka_bootstrap, unique("__state"), *SETTINGS, relay=True) as running:
        admin = await running.client()
        await until_loaded(admin)
        prefix = unique("sim")
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "coordinator.cli", "simulate", "--coordinator", f"127.0.0.1:{running.port}",
            "--bootstrap-server", kafka_bootstrap, "--groups", "1", "--members", "2", "--topic", unique("real"),
            "--partitions", "4", "--group-prefix", prefix, "--session-timeout-ms", "6000",
            "--heartbeat-interval-ms", "1000", "--duration", "15", "--settle-timeout", "30", "--real", "2", "--json",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            env={**os.environ, "PYTHONUNBUFFERED": "1"})
        try:
            out, err = await asyncio.wait_for(process.communicate(), 150)
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()
        assert process.returncode == 0, err.decode()[-5000:]
        summary = json.loads(out.decode().strip().splitlines()[-1])
        real = summary["real_consumers"]
        assert real["produced"] > 0, real
        assert [c["client"] for c in real["consumers"]] == ["confluent-kafka", "aiokafka"]
        for consumer in real["consumers"]:
            assert consumer["rebalances"] >= 1, real  # it got an assignment
            assert consumer["records"] > 0, real  # and read records the producer wrote through the relay
        assert summary["members_stable"] == summary["members_surviving"] == 2, summary
        assert real["group"] == f"{prefix}-real"
        left = await describe(admin, real["group"])  # session timeout 10 s: members still there had they not left
        assert (left.group_state, len(left.members)) == ("Empty", 0), left
        await admin.close()
        assert await running.terminate() == 0
