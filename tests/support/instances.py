"""Shared by the multi-instance tests and bench/failover.py: N `coordinator serve --instance-id` processes on one
state topic and one Kafka cluster, as an operator runs them.

- Each instance is a subprocess with its stdout and log (stderr) in files kept for assertions; a restart appends
  to the same files. Signals: SIGKILL (crash), SIGSTOP/SIGCONT (a frozen process: the zombie), SIGTERM (a clean
  stop). Every instance is killed when the `Instances` context exits, however it exits, and dies with the test
  process if that is killed (PR_SET_PDEATHSIG): no instance outlives the test.
- Ownership is read from Kafka, black-box: the instances form the consumer group "<state topic>.coordinators"
  (docs/architecture.md, "Several instances"), so DescribeGroups of that group (an AdminClient) lists every live
  instance, its endpoint (in its client.id) and the state partitions assigned to it.
- Every wait is bounded and polls its condition; there are no fixed sleeps.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from coordinator.cluster.identity import InstanceEndpoint, parse_client_id
from coordinator.embedded.broker import die_with_parent
from coordinator.group.partitioner import partition_for
from protocol.apis import ApiKey
from protocol.client import KafkaClient
from protocol.error_codes import Errors
from protocol.errors import ConnectionClosed, ProtocolError, RequestTimedOut
from tests.support.polling import wait_until
from tests.support.ports import free_port
from tests.support.wire import nested, request

INSTANCE_SESSION_MS = 6_000  # the broker's default group.min.session.timeout.ms: the fastest detection it allows
STATE_PARTITIONS = 12
NONE, COORDINATOR_LOAD_IN_PROGRESS = Errors.NONE, Errors.COORDINATOR_LOAD_IN_PROGRESS
COORDINATOR_NOT_AVAILABLE, NOT_COORDINATOR = Errors.COORDINATOR_NOT_AVAILABLE, Errors.NOT_COORDINATOR
# the coordinator's own group settings for tests: groups form at once, short member sessions are allowed
FAST_GROUPS = ("group.initial.rebalance.delay.ms=0", "group.min.session.timeout.ms=1000")
TRANSIENT = (OSError, ConnectionClosed, RequestTimedOut, ProtocolError, asyncio.TimeoutError)


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


# ---------------------------------------------------------------------------------------------------- one instance

class Instance:
    """One `coordinator serve --instance-id ID` process (restartable on the same ports, same instance id)."""

    def __init__(self, instance_id: str, command: list[str], port: int, relay_base_port: int | None,
                 log_dir: Path) -> None:
        self.instance_id = instance_id
        self.command = command
        self.port = port
        self.relay_base_port = relay_base_port
        self.log_path = log_dir / f"{instance_id}.log"
        self.out_path = log_dir / f"{instance_id}.out"
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @property
    def address(self) -> tuple[str, int]:
        return "127.0.0.1", self.port

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def start(self) -> None:
        if self.alive:
            raise RuntimeError(f"instance {self.instance_id} is already running")
        self.starts += 1
        with self.log_path.open("ab") as log, self.out_path.open("ab") as out:
            marker = f"=== harness: start {self.starts} of {self.instance_id} ===\n".encode()
            log.write(marker)
            out.write(marker)
            log.flush()
            out.flush()
            self.process = subprocess.Popen(self.command, stdout=out, stderr=log, stdin=subprocess.DEVNULL,
                                            env={**os.environ, "PYTHONUNBUFFERED": "1"},
                                            preexec_fn=die_with_parent)

    async def until_listening(self, timeout_s: float = 90) -> None:
        """Until this start's "coordinator listening on" line is out (or the process died: fail with its log)."""
        marker = f"=== harness: start {self.starts} of {self.instance_id} ===".encode()

        def listening() -> bool:
            if self.process is not None and self.process.poll() is not None:
                raise AssertionError(f"instance {self.instance_id} exited with {self.process.returncode}:\n"
                                     f"{self.log_tail()}")
            text = self.out_path.read_bytes()
            return b"coordinator listening on" in text[text.rfind(marker):]

        await wait_until(listening, timeout_s, f"instance {self.instance_id} to listen")

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def signal(self, sig: signal.Signals) -> None:
        assert self.process is not None and self.process.poll() is None, f"{self.instance_id} is not running"
        self.process.send_signal(sig)

    async def kill(self) -> None:
        """SIGKILL: a crash. Returns once the process is gone."""
        if self.alive:
            self.signal(signal.SIGKILL)
        await self.wait_exit(30)

    def pause(self) -> None:
        """SIGSTOP: the process freezes (a long GC pause, a VM stall) with its sockets open."""
        self.signal(signal.SIGSTOP)

    def resume(self) -> None:
        self.signal(signal.SIGCONT)

    async def terminate(self, timeout_s: float = 60) -> int:
        """SIGTERM: a clean stop (the instance leaves its group, so its partitions move at once); the exit code."""
        self.signal(signal.SIGTERM)
        return await self.wait_exit(timeout_s)

    async def wait_exit(self, timeout_s: float) -> int:
        assert self.process is not None
        process = self.process
        await wait_until(lambda: process.poll() is not None, timeout_s, f"instance {self.instance_id} to exit")
        return process.returncode

    def force_stop(self) -> None:
        """Whatever state it is in (a stopped process too), it is gone after this."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(30)

    def log_text(self, since: int = 0, until: int | None = None) -> str:
        """The log from byte offset `since` to `until` (see `log_offset`): what it logged between two moments."""
        with self.log_path.open("rb") as log:
            log.seek(since)
            return log.read(-1 if until is None else max(0, until - since)).decode(errors="replace")

    def log_offset(self) -> int:
        return self.log_path.stat().st_size

    def log_tail(self, chars: int = 6_000) -> str:
        return self.log_text()[-chars:]


# ---------------------------------------------------------------------------------------------------- ownership

@dataclass(frozen=True)
class Ownership:
    """The instances group as Kafka describes it: which live instance owns which state partition."""

    state: str  # the group's state at the broker (STABLE, PREPARING_REBALANCE, COMPLETING_REBALANCE, ...)
    members: dict[str, InstanceEndpoint]  # instance id -> endpoint, live members only
    owners: dict[int, str]  # state partition -> instance id
    duplicates: tuple[int, ...]  # partitions assigned to more than one member (never expected)

    def of(self, instance_id: str) -> set[int]:
        return {p for p, owner in self.owners.items() if owner == instance_id}

    def complete(self, partitions: int, instance_ids: Iterable[str] | None = None) -> bool:
        """Stable at the broker, every partition owned once, by the given instances (default: any member)."""
        wanted = set(self.members) if instance_ids is None else set(instance_ids)
        return (self.state == "STABLE" and not self.duplicates and set(self.members) == wanted
                and sorted(self.owners) == list(range(partitions)) and set(self.owners.values()) <= wanted)


def describe_ownership(admin: Any, instances_group: str, state_topic: str) -> Ownership:
    description = admin.describe_consumer_groups([instances_group], request_timeout=15)[instances_group].result()
    members: dict[str, InstanceEndpoint] = {}
    owners: dict[int, str] = {}
    duplicates: list[int] = []
    for member in description.members:
        endpoint = parse_client_id(member.client_id)
        if endpoint is None:
            continue  # not an instance (nothing else should join; ignore rather than guess)
        members[endpoint.instance_id] = endpoint
        assigned = member.assignment.topic_partitions if member.assignment is not None else []
        for tp in assigned:
            if tp.topic != state_topic:
                continue
            if tp.partition in owners:
                duplicates.append(tp.partition)
            owners[tp.partition] = endpoint.instance_id
    state = getattr(description.state, "name", str(description.state))
    return Ownership(state, members, owners, tuple(duplicates))


def groups_in_partitions(partitions: Iterable[int], count: int, num_partitions: int, prefix: str) -> list[str]:
    """`count` group ids (PREFIX-n) whose state partition is one of `partitions`, spread over them round-robin as
    far as the hash allows."""
    wanted = sorted(set(partitions))
    assert wanted, "no partitions to place groups in"
    per_partition: dict[int, list[str]] = {p: [] for p in wanted}
    quota = -(-count // len(wanted))
    found: list[str] = []
    n = 0
    while len(found) < count:
        group_id = f"{prefix}-{n}"
        n += 1
        partition = partition_for(group_id, num_partitions)
        if partition in per_partition and len(per_partition[partition]) < quota:
            per_partition[partition].append(group_id)
            found.append(group_id)
    return found


# ---------------------------------------------------------------------------------------------------- N instances

class Instances:
    """`async with Instances(bootstrap, 3) as cluster:` three instances serving one fresh state topic, every
    partition owned. `cluster["i2"]` is one instance; `await cluster.ownership()` reads the owner map from Kafka."""

    def __init__(self, bootstrap: str, count: int = 3, *, partitions: int = STATE_PARTITIONS, relay: bool = False,
                 event_topic: str = "", instance_session_ms: int = INSTANCE_SESSION_MS,
                 config: Iterable[str] = FAST_GROUPS, extra_args: Iterable[str] = (),
                 state_topic: str | None = None, log_dir: str | Path | None = None, multi: bool = True) -> None:
        """`multi=False`: the same processes without --instance-id (single-instance mode, owning every partition:
        the baseline a failover is compared with)."""
        self.kafka = bootstrap
        self.partitions = partitions
        self.state_topic = state_topic or unique("__state")
        self.instances_group = f"{self.state_topic}.coordinators"
        self.event_topic = event_topic
        self.instance_session_ms = instance_session_ms
        self._keep_dir = log_dir is not None
        self.log_dir = Path(log_dir) if log_dir is not None else Path(tempfile.mkdtemp(prefix="instances-"))
        self.log_dir.mkdir(parents=True, exist_ok=True)
        settings = [arg for item in (f"offsets.topic.num.partitions={partitions}", *config)
                    for arg in ("--config", item)]
        self.instances: dict[str, Instance] = {}
        for k in range(1, count + 1):
            instance_id = f"i{k}"
            port = free_port()
            relay_base = _relay_base_port() if relay else None
            membership = ("--instance-id", instance_id, "--instance-session-timeout-ms",
                          str(instance_session_ms)) if multi else ()
            command = [sys.executable, "-m", "coordinator.cli", "serve", *membership,
                       "--bootstrap-server", bootstrap, "--listen", f"127.0.0.1:{port}",
                       "--state-topic", self.state_topic, "--event-topic", event_topic, *settings,
                       *(("--relay-base-port", str(relay_base)) if relay_base is not None else ("--no-relay",)),
                       *extra_args]
            self.instances[instance_id] = Instance(instance_id, command, port, relay_base, self.log_dir)
        self.multi = multi
        self._admin: Any = None

    def __getitem__(self, instance_id: str) -> Instance:
        return self.instances[instance_id]

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self.instances.values())

    @property
    def bootstrap(self) -> str:
        """Every instance's address, as a client's bootstrap list."""
        return ",".join(instance.bootstrap for instance in self)

    def live(self) -> list[Instance]:
        return [instance for instance in self if instance.alive]

    async def __aenter__(self) -> Instances:
        from confluent_kafka.admin import AdminClient

        self._admin = AdminClient({"bootstrap.servers": self.kafka, "log_level": 3})
        try:
            await asyncio.to_thread(self._create_state_topic)
            for instance in self:
                instance.start()
            await asyncio.gather(*(instance.until_listening() for instance in self))
            if self.multi:
                await self.until_settled()
        except BaseException:
            self._dump_logs("start")
            self._stop_all()
            raise
        return self

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self._stop_all()
        if exc_type is not None:
            self._dump_logs("failure")
        elif not self._keep_dir:
            for path in self.log_dir.iterdir():
                path.unlink()
            self.log_dir.rmdir()

    def _stop_all(self) -> None:
        for instance in self:
            with contextlib.suppress(Exception):
                instance.force_stop()

    def _dump_logs(self, why: str) -> None:
        for instance in self:
            if instance.log_path.exists():
                print(f"----- {instance.instance_id} log ({why}; kept in {instance.log_path}), last lines:\n"
                      f"{instance.log_tail()}", file=sys.stderr)

    def _create_state_topic(self) -> None:
        """Created up front like an operator would (compacted), so N instances starting at once do not race to it."""
        from confluent_kafka.admin import NewTopic

        topic = NewTopic(self.state_topic, self.partitions, 1, config={"cleanup.policy": "compact"})
        self._admin.create_topics([topic])[self.state_topic].result(30)

    # ------------------------------------------------------------------------------------------------ ownership

    async def ownership(self) -> Ownership:
        try:
            return await asyncio.to_thread(describe_ownership, self._admin, self.instances_group, self.state_topic)
        except Exception as exc:  # group not there yet, broker busy: nobody owns anything as far as we know
            return Ownership(f"unknown ({exc})", {}, {}, ())

    async def until_settled(self, instance_ids: Iterable[str] | None = None,
                            timeout_s: float | None = None) -> Ownership:
        """Until the live instances (or the ones given) own every partition between them, the group Stable."""
        wanted = sorted(instance_ids) if instance_ids is not None else [i.instance_id for i in self.live()]
        timeout_s = timeout_s if timeout_s is not None else 3 * self.instance_session_ms / 1000 + 60
        last: list[Ownership] = []

        async def settled() -> Ownership | None:
            owned = await self.ownership()
            last[:] = [owned]
            return owned if owned.complete(self.partitions, wanted) else None

        try:
            return await wait_until(settled, timeout_s, f"instances {wanted} to own every partition", 0.25)
        except AssertionError as exc:
            raise AssertionError(f"{exc}; last seen: {last[-1] if last else None}") from None

    def partition_of(self, group_id: str) -> int:
        return partition_for(group_id, self.partitions)

    async def restart(self, instance_id: str) -> None:
        instance = self[instance_id]
        instance.start()
        await instance.until_listening()


def _relay_base_port() -> int:
    """A relay base port whose broker listener (base + broker node id 1) is free."""
    return free_port() - 1  # below the ephemeral range (tests/support/ports.py)


# ---------------------------------------------------------------------------------------------------- requests

async def connect(address: tuple[str, int], timeout_ms: int = 10_000) -> KafkaClient:
    return await KafkaClient.connect(address[0], address[1], client_id="instances-test", timeout_ms=timeout_ms)


async def find_coordinator(client: KafkaClient, group_id: str) -> tuple[int, tuple[str, int] | None]:
    """(error code, owner address) as FindCoordinator answers it."""
    response = await client.request(request(ApiKey.FIND_COORDINATOR, 3, key=group_id, key_type=0))
    code = int(response.error_code)
    return code, ((response.host, int(response.port)) if code == NONE else None)


def describe_request(group_ids: list[str]) -> Any:
    return request(ApiKey.DESCRIBE_GROUPS, 5, groups=tuple(group_ids), include_authorized_operations=False)


async def describe_groups(client: KafkaClient, group_ids: list[str]) -> dict[str, Any]:
    response = await client.request(describe_request(group_ids))
    return {group.group_id: group for group in response.groups}


async def committed_offsets(client: KafkaClient, group_id: str, topic: str,
                            partitions: Iterable[int]) -> dict[int, int] | None:
    """The group's committed offsets as OffsetFetch (require_stable) gives them: None when the group is not
    served there (NOT_COORDINATOR, loading); a partition whose answer is an error (UNSTABLE_OFFSET_COMMIT: a commit
    in flight) is left out rather than read as -1."""
    entry = nested(ApiKey.OFFSET_FETCH, 7, "topics")(name=topic, partition_indexes=tuple(partitions))
    response = await client.request(request(ApiKey.OFFSET_FETCH, 7, group_id=group_id, topics=(entry,),
                                            require_stable=True))
    if response.error_code != NONE:
        return None
    return {p.partition_index: p.committed_offset for t in response.topics for p in t.partitions
            if p.error_code == NONE}


def read_topic(bootstrap: str, topic: str, timeout_s: float = 60) -> list[dict[str, Any]]:
    """Every JSON record of `topic` from its beginning to its current end (all partitions), with the partition
    and offset added (`_partition`, `_offset`)."""
    return [{**json.loads(value), "_partition": partition, "_offset": offset}
            for _key, value, partition, offset in read_raw(bootstrap, topic, timeout_s) if value]


def read_raw(bootstrap: str, topic: str, timeout_s: float = 60
             ) -> list[tuple[bytes | None, bytes | None, int, int]]:
    """Every record of `topic` (committed ones, tombstones included) from its beginning to its current end, as
    (key, value, partition, offset)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("instances-reader"),
                         "enable.auto.commit": False, "isolation.level": "read_committed", "log_level": 3})
    try:
        metadata = consumer.list_topics(topic, timeout=timeout_s)
        partitions = sorted(metadata.topics[topic].partitions)
        marks = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout_s) for p in partitions}
        ends = {p: high for p, (_low, high) in marks.items()}
        empty = {p for p, (low, high) in marks.items() if high <= low}  # no position to reach there
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        records: list[tuple[bytes | None, bytes | None, int, int]] = []
        deadline = time.monotonic() + timeout_s
        while True:
            # the position, not the last offset read: transaction markers take offsets too
            positions = {tp.partition: tp.offset for tp in consumer.position(consumer.assignment())}
            if all(p in empty or positions[p] >= ends[p] for p in partitions):
                break
            if time.monotonic() > deadline:
                raise AssertionError(f"{topic} not read to its end within {timeout_s} s: {positions} of {ends}")
            message = consumer.poll(0.5)
            if message is None or message.error() is not None:
                continue
            records.append((message.key(), message.value(), message.partition() or 0, message.offset() or 0))
        return records
    finally:
        consumer.close()
