"""`coordinator serve` as a subprocess against a real broker, driven by our client: the end-to-end tests' service."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from protocol.apis import ApiKey
from protocol.client import KafkaClient
from protocol.error_codes import Errors
from tests.support.wire import nested, request

LOAD_IN_PROGRESS = Errors.COORDINATOR_LOAD_IN_PROGRESS
REBALANCE_IN_PROGRESS = Errors.REBALANCE_IN_PROGRESS
# `--config` settings for tests: groups form at once, short member sessions are allowed
FAST = ("group.initial.rebalance.delay.ms=0", "group.min.session.timeout.ms=1000")


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


class Service:
    def __init__(self, process: asyncio.subprocess.Process, port: int, log_path: Path) -> None:
        self.process = process
        self.port = port
        self.log_path = log_path

    async def client(self, timeout_ms: int = 15_000) -> KafkaClient:
        return await KafkaClient.connect("127.0.0.1", self.port, client_id="e2e-test", timeout_ms=timeout_ms)

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    async def terminate(self, timeout_s: float = 30) -> int:
        self.process.send_signal(signal.SIGTERM)
        return await asyncio.wait_for(self.process.wait(), timeout_s)


@asynccontextmanager
async def service(bootstrap: str, state_topic: str, *config: str, event_topic: str = "",
                  listen: str = "127.0.0.1:0", relay: bool = False, args: tuple[str, ...] = (),
                  extra_env: dict[str, str] | None = None) -> AsyncIterator[Service]:
    """`coordinator serve` with `--config` settings (NAME=VALUE); its log goes to a temporary file. Without
    `relay` it runs with --no-relay (the coordinator alone); `args` go to the command line as they are,
    `extra_env` into its environment."""
    log_file = tempfile.NamedTemporaryFile(prefix="coordinator-e2e-", suffix=".log", delete=False)
    settings = [arg for item in ("offsets.topic.num.partitions=3", *config) for arg in ("--config", item)]
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "coordinator.cli", "serve", "--listen", listen,
        "--bootstrap-server", bootstrap, "--state-topic", state_topic, "--event-topic", event_topic, *settings,
        *(() if relay else ("--no-relay",)), *args,
        stdout=asyncio.subprocess.PIPE, stderr=log_file,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **(extra_env or {})},
    )
    try:
        line = (await asyncio.wait_for(process.stdout.readline(), 60)).decode()  # type: ignore[union-attr]
        assert line.startswith("coordinator listening on 127.0.0.1:"), (line, Path(log_file.name).read_text())
        port = int(line.split()[3].rsplit(":", 1)[1])
        yield Service(process, port, Path(log_file.name))
    except BaseException:
        print(Path(log_file.name).read_text(errors="replace")[-20_000:], file=sys.stderr)  # the service's side
        raise
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
        log_file.close()
        os.unlink(log_file.name)


async def until_loaded(client: KafkaClient, group_id: str = "any", timeout_s: float = 120) -> Any:
    """DescribeGroups until the coordinator has loaded the group's partition (a cold start on a loaded machine
    takes a while: bounded by time, not by a number of tries)."""
    deadline = time.monotonic() + timeout_s
    while True:
        described = await describe(client, group_id)
        if described.error_code != LOAD_IN_PROGRESS:
            return described
        assert time.monotonic() < deadline, f"coordinator never finished loading within {timeout_s:.0f} s"
        await asyncio.sleep(0.1)


async def describe(client: KafkaClient, group_id: str) -> Any:
    response = await client.request(request(ApiKey.DESCRIBE_GROUPS, 5, groups=(group_id,),
                                            include_authorized_operations=False))
    return response.groups[0]


async def commit(client: KafkaClient, group_id: str, generation_id: int, member_id: str,
                 offsets: dict[int, int], topic: str = "orders", timeout_ms: int | None = None) -> list[int]:
    partition = nested(ApiKey.OFFSET_COMMIT, 8, "topics", "partitions")
    entry = nested(ApiKey.OFFSET_COMMIT, 8, "topics")(name=topic, partitions=tuple(
        partition(partition_index=p, committed_offset=o, committed_leader_epoch=-1, committed_metadata=f"m{o}")
        for p, o in offsets.items()))
    response = await client.request(request(ApiKey.OFFSET_COMMIT, 8, group_id=group_id,
                                            generation_id_or_member_epoch=generation_id, member_id=member_id,
                                            group_instance_id=None, topics=(entry,)), timeout_ms=timeout_ms)
    return [p.error_code for t in response.topics for p in t.partitions]


async def fetch_offsets(client: KafkaClient, group_id: str, partitions: tuple[int, ...],
                        topic: str = "orders") -> dict[int, int]:
    entry = nested(ApiKey.OFFSET_FETCH, 7, "topics")(name=topic, partition_indexes=partitions)
    response = await client.request(request(ApiKey.OFFSET_FETCH, 7, group_id=group_id, topics=(entry,),
                                            require_stable=True))
    assert response.error_code == 0, response
    return {p.partition_index: p.committed_offset for t in response.topics for p in t.partitions}
