"""Scenarios for the reference-cycle tests: every way a direct connection, a member and a group can end,
driven by blocking sockets in a worker thread (so the client side creates no cyclic garbage of its own), and the
check itself: the collector off, then whatever a collection finds unreachable (gc.DEBUG_SAVEALL).

Used by tests/unit/test_server_connection_cycles.py (GroupRuntime + in-memory store + CoordinatorServer, on
asyncio and uvloop) and tests/integration/test_service_cycles.py (the whole service on real Kafka). Why it
matters: coordinator/runtime_health.py freezes whatever survives two young collections, so a reference cycle
that was alive then and dies later is never freed.
"""

from __future__ import annotations

import asyncio
import collections
import gc
import io
import logging
import os
import socket
import struct
import sys
import time
from pathlib import Path
from typing import Any, Callable

from coordinator.group.runtime import GroupRuntime
from coordinator.server import CoordinatorServer
from protocol.apis import ApiKey
from protocol.codec import decode_response, encode_request
from tests.support.polling import wait_until
from tests.support.wire import heartbeat, ms, nested, request, subscription_metadata

REPO_ROOT = Path(__file__).resolve().parents[2]
# Members whose client went away expire after this; members in use must outlive a worker thread that a loaded
# machine does not schedule for a while (heartbeats are sent only between steps).
SESSION_MS = 5_000
REBALANCE_MS = 5_000
FUZZ_FRAMES = 1_500
FUZZ_CORPUS = "served"  # every (API, version) the server answers
WAIT_S = 60.0


class Peer:
    """A client on a blocking socket (for a worker thread): frames out, decoded responses in."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=WAIT_S)
        self.correlation_id = 0
        self.sent: collections.deque[Any] = collections.deque()

    def send(self, body: Any) -> None:
        self.correlation_id += 1
        self.sock.sendall(encode_request(self.correlation_id, "cycles", body))
        self.sent.append(body)

    def receive(self) -> Any:
        body = self.sent.popleft()
        (size,) = struct.unpack(">i", self._exactly(4))
        _, response = decode_response(int(body.__api_key__), int(body.__version__), self._exactly(size))
        return response

    def call(self, body: Any) -> Any:
        self.send(body)
        return self.receive()

    def raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def closed_by_server(self) -> bool:
        try:
            while self.sock.recv(65536):
                pass
        except ConnectionResetError:
            pass
        return True

    def close(self) -> None:
        self.sock.close()

    def _exactly(self, n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = self.sock.recv(n - len(data))
            if not chunk:
                raise ConnectionError("closed by the server")
            data += chunk
        return data


def join_request(group_id: str, member_id: str = "", instance_id: str | None = None) -> Any:
    protocol = nested(ApiKey.JOIN_GROUP, 9, "protocols")(name="range", metadata=subscription_metadata("t"))
    return request(ApiKey.JOIN_GROUP, 9, group_id=group_id, session_timeout=ms(SESSION_MS),
                   rebalance_timeout=ms(REBALANCE_MS), member_id=member_id, group_instance_id=instance_id,
                   protocol_type="consumer", protocols=(protocol,), reason=None)


def _sync(group_id: str, generation_id: int, member_id: str, assignments: dict[str, bytes] | None = None) -> Any:
    entry = nested(ApiKey.SYNC_GROUP, 5, "assignments")
    return request(ApiKey.SYNC_GROUP, 5, group_id=group_id, generation_id=generation_id, member_id=member_id,
                   group_instance_id=None, protocol_type="consumer", protocol_name="range",
                   assignments=tuple(entry(member_id=m, assignment=a) for m, a in (assignments or {}).items()))


def _commit(group_id: str, generation_id: int, member_id: str, topic: str) -> Any:
    partition = nested(ApiKey.OFFSET_COMMIT, 8, "topics", "partitions")(
        partition_index=0, committed_offset=42, committed_leader_epoch=-1, committed_metadata="")
    entry = nested(ApiKey.OFFSET_COMMIT, 8, "topics")(name=topic, partitions=(partition,))
    return request(ApiKey.OFFSET_COMMIT, 8, group_id=group_id, generation_id_or_member_epoch=generation_id,
                   member_id=member_id, group_instance_id=None, topics=(entry,))


def _fetch(group_id: str) -> Any:
    return request(ApiKey.OFFSET_FETCH, 7, group_id=group_id, topics=None, require_stable=False)


def _leave(group_id: str, member_id: str, instance_id: str | None = None) -> Any:
    member = nested(ApiKey.LEAVE_GROUP, 5, "members")(member_id=member_id, group_instance_id=instance_id,
                                                      reason=None)
    return request(ApiKey.LEAVE_GROUP, 5, group_id=group_id, members=(member,))


def _first_member(peer: Peer, group_id: str) -> tuple[int, str]:
    """KIP-394 join, then the join that completes the rebalance at once (no initial delay): (generation, id)."""
    required = peer.call(join_request(group_id))
    assert required.error_code == 79, required  # MEMBER_ID_REQUIRED
    joined = peer.call(join_request(group_id, required.member_id))
    assert joined.error_code == 0, joined
    return joined.generation_id, joined.member_id


def stable_member(port: int, group_id: str) -> tuple[Peer, int, str]:
    peer = Peer(port)
    generation, member_id = _first_member(peer, group_id)
    synced = peer.call(_sync(group_id, generation, member_id, {member_id: b"a"}))
    assert synced.error_code == 0, synced
    return peer, generation, member_id


# --------------------------------------------------------------------------------------------- the scenarios


class Scenarios:
    """Run in a worker thread; `on_loop` runs a coroutine function on the server's loop and waits for it."""

    def __init__(self, port: int, on_loop: Callable[..., Any], parked: Callable[[], int], topic: str) -> None:
        self.port, self.on_loop, self.parked = port, on_loop, parked
        self.topic = topic  # committed to (behind the relay, OffsetCommit checks that the topic exists)

    def wait_parked(self, count: int) -> None:
        deadline = time.monotonic() + WAIT_S
        while self.parked() < count:
            assert time.monotonic() < deadline, f"{count} parked requests expected, {self.parked()} parked"
            time.sleep(0.005)

    def every_api_then_close(self, group_id: str) -> None:
        peer, generation, member_id = stable_member(self.port, group_id)
        assert peer.call(request(ApiKey.API_VERSIONS, 3, client_software_name="cycles",
                                 client_software_version="1")).error_code == 0
        assert peer.call(heartbeat(group_id, generation, member_id)).error_code == 0  # the fast path
        assert peer.call(heartbeat(group_id, generation, member_id, version=3)).error_code == 0  # the general one
        assert peer.call(_commit(group_id, generation, member_id, self.topic)).topics[0].partitions[0].error_code == 0
        assert peer.call(_fetch(group_id)).error_code == 0
        assert peer.call(request(ApiKey.DESCRIBE_GROUPS, 5, groups=(group_id,),
                                 include_authorized_operations=False)).groups[0].error_code == 0
        assert peer.call(request(ApiKey.LIST_GROUPS, 4, states_filter=())).error_code == 0
        assert peer.call(request(ApiKey.FIND_COORDINATOR, 4, key_type=0, coordinator_keys=(group_id,))) \
            .coordinators[0].error_code == 0
        assert peer.call(_leave(group_id, member_id)).error_code == 0
        peer.close()

    def delete_group(self, group_id: str) -> None:
        peer = Peer(self.port)
        deleted = peer.call(request(ApiKey.DELETE_GROUPS, 2, groups_names=(group_id,)))
        assert deleted.results[0].error_code == 0, deleted
        peer.close()

    def closed_mid_frame(self, group_id: str) -> None:
        frame = encode_request(1, "cycles", join_request(group_id))
        for cut in (2, 4, 11, len(frame) // 2, len(frame) - 1):
            peer = Peer(self.port)
            peer.raw(frame[:cut])
            peer.close()

    def never_rejoined(self, group_id: str) -> None:
        """A KIP-394 member id handed out, never used: it expires (and its Empty group goes at the cleanup)."""
        peer = Peer(self.port)
        assert peer.call(join_request(group_id)).error_code == 79
        peer.close()

    def static_member_replaced(self, group_id: str) -> None:
        """A static member's process restarts: the new one takes the instance id over (the old member is fenced,
        the new id written before it is answered), then leaves by instance id."""
        old = Peer(self.port)
        joined = old.call(join_request(group_id, instance_id="instance-1"))
        assert joined.error_code == 0, joined
        assert old.call(_sync(group_id, joined.generation_id, joined.member_id,
                              {joined.member_id: b"a"})).error_code == 0
        old.close()
        new = Peer(self.port)
        replaced = new.call(join_request(group_id, instance_id="instance-1"))
        assert replaced.error_code == 0 and replaced.member_id != joined.member_id, replaced
        assert new.call(_leave(group_id, replaced.member_id, "instance-1")).error_code == 0
        new.close()

    def closed_while_join_parked(self, group_id: str) -> None:
        """The newcomer's JoinGroup parks until the member already there rejoins; the newcomer goes away
        first, then expires (its session), the first member leaves."""
        first, generation, first_id = stable_member(self.port, group_id)
        newcomer = Peer(self.port)
        required = newcomer.call(join_request(group_id))
        parked_before = self.parked()
        newcomer.send(join_request(group_id, required.member_id))
        self.wait_parked(parked_before + 1)
        newcomer.close()
        assert first.call(heartbeat(group_id, generation, first_id)).error_code == 27  # REBALANCE_IN_PROGRESS
        rejoined = first.call(join_request(group_id, first_id))  # completes the join, answers the gone newcomer too
        assert rejoined.error_code == 0 and len(rejoined.members) == 2, rejoined
        synced = first.call(_sync(group_id, rejoined.generation_id, first_id, {first_id: b"a"}))
        assert synced.error_code in (0, 27), synced
        assert first.call(_leave(group_id, first_id)).error_code == 0
        first.close()

    def closed_while_sync_parked(self, group_id: str) -> None:
        """A follower's SyncGroup parks until the leader's assignment is stored; the follower goes away."""
        leader, generation, leader_id = stable_member(self.port, group_id)
        follower = Peer(self.port)
        required = follower.call(join_request(group_id))
        follower.send(join_request(group_id, required.member_id))
        rejoined = leader.call(join_request(group_id, leader_id))
        assert rejoined.error_code == 0, rejoined
        joined = follower.receive()
        assert joined.error_code == 0, joined
        parked_before = self.parked()
        follower.send(_sync(group_id, joined.generation_id, joined.member_id))
        self.wait_parked(parked_before + 1)
        follower.close()
        synced = leader.call(_sync(group_id, rejoined.generation_id, leader_id,
                                   {leader_id: b"a", joined.member_id: b"b"}))
        assert synced.error_code == 0, synced
        leader.close()  # both sessions expire now

    def parked_then_unloaded(self, runtime: GroupRuntime, group_id: str) -> None:
        """A parked JoinGroup and a parked SyncGroup (two groups of one partition) answered NOT_COORDINATOR when
        the partition is given up; the connections stay open, then close."""
        partition = runtime.partition_for(group_id)
        other = next(f"{group_id}-{i}" for i in range(1_000) if runtime.partition_for(f"{group_id}-{i}") == partition)
        first, _, first_id = stable_member(self.port, group_id)
        parked_before = self.parked()
        newcomer = Peer(self.port)
        required = newcomer.call(join_request(group_id))
        newcomer.send(join_request(group_id, required.member_id))
        leader, generation, leader_id = stable_member(self.port, other)
        follower = Peer(self.port)
        required = follower.call(join_request(other))
        follower.send(join_request(other, required.member_id))
        rejoined = leader.call(join_request(other, leader_id))
        joined = follower.receive()
        follower.send(_sync(other, joined.generation_id, joined.member_id))
        self.wait_parked(parked_before + 2)
        self.on_loop(runtime.unload, [partition])
        assert newcomer.receive().error_code == 16  # NOT_COORDINATOR
        assert follower.receive().error_code == 16
        assert first.call(heartbeat(group_id, 1, first_id)).error_code == 16
        self.on_loop(runtime.load, [partition])  # served again (from the store), for the next rounds
        for peer in (first, newcomer, leader, follower):
            peer.close()
        del rejoined, generation

    def hostile(self, group_id: str) -> None:
        join = encode_request(1, "cycles", join_request(group_id))
        body_start = 4 + 2 + 2 + 4 + 2 + len("cycles") + 1  # size, key, version, correlation id, client id, tags
        lying_string = join[:body_start] + b"\x7f" + join[body_start + 1:]  # group id's length far too long
        unknown_api = struct.pack(">ihhih", 10, 999, 0, 1, -1)
        unsupported = struct.pack(">ihhih", 10, ApiKey.JOIN_GROUP, 99, 1, -1)
        for data, closes in ((struct.pack(">i", 0x7FFFFFFF), True), (struct.pack(">i", -5), True),
                             (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", True), (struct.pack(">i", 3) + b"abc", True),
                             (unknown_api, True), (unsupported, True), (lying_string, True),
                             (join + b"\x00\x00\x00\x07garbage", True)):
            peer = Peer(self.port)
            peer.raw(data)
            if closes:
                assert peer.closed_by_server()
            peer.close()
        peer = Peer(self.port)  # an ApiVersions version we do not know is answered (KIP-511), then we close
        peer.raw(struct.pack(">ihhih", 10, ApiKey.API_VERSIONS, 99, 1, -1))
        (size,) = struct.unpack(">i", peer._exactly(4))
        peer._exactly(size)
        peer.close()


async def _fuzz(port: int) -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tests.fuzz", "--target", f"127.0.0.1:{port}", "--corpus", FUZZ_CORPUS,
        "--frames", str(FUZZ_FRAMES), "--seed", "23", "--waves", "1",
        cwd=REPO_ROOT, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
    _, stderr = await asyncio.wait_for(process.communicate(), 300)
    assert process.returncode == 0, stderr.decode()[-2_000:]


async def run_scenarios(server: CoordinatorServer, runtime: GroupRuntime, round_: int, *, fuzz: bool,
                        extra: Callable[[Scenarios], None] | None = None, topic: str = "t",
                        settle: bool = True) -> None:
    """Every scenario once (groups named after `round_`); then, with `settle`, wait until every connection,
    member and group they made is gone (without: only until the clients' connections are closed)."""
    loop = asyncio.get_running_loop()

    def on_loop(coroutine_function: Callable[..., Any], *args: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine_function(*args), loop).result(WAIT_S)

    scenarios = Scenarios(server.port, on_loop, lambda: len(server._busy), topic)
    g = f"cycles-r{round_}"
    await asyncio.to_thread(scenarios.every_api_then_close, f"{g}-apis")
    await asyncio.to_thread(scenarios.delete_group, f"{g}-apis")
    await asyncio.to_thread(scenarios.closed_mid_frame, f"{g}-mid")
    await asyncio.to_thread(scenarios.never_rejoined, f"{g}-pending")
    await asyncio.to_thread(scenarios.static_member_replaced, f"{g}-static")
    await asyncio.to_thread(scenarios.closed_while_join_parked, f"{g}-join")
    await asyncio.to_thread(scenarios.closed_while_sync_parked, f"{g}-sync")
    await asyncio.to_thread(scenarios.parked_then_unloaded, runtime, f"{g}-unload")
    await asyncio.to_thread(scenarios.hostile, f"{g}-hostile")
    if extra is not None:
        await asyncio.to_thread(extra, scenarios)
    if fuzz:
        await _fuzz(server.port)
    await wait_until(lambda: server.connection_count == 0, WAIT_S, "every connection closed", 0.02)
    if not settle:
        return
    await wait_until(lambda: not server._busy, WAIT_S, "every parked request answered", 0.02)
    await wait_until(lambda: all(not group.members for group in runtime.groups.values()), WAIT_S,
                     "every member gone", 0.02)
    await runtime.expire_offsets()  # retires the groups left Empty without offsets
    for _ in range(20):  # lost connections and expired operations finish on the next iterations
        await asyncio.sleep(0.01)


class CollectorOff:
    """`with CollectorOff() as off:` the collector is off inside; on leaving, one collection whose unreachable
    objects (what only the cyclic collector could have freed) land in `off.garbage`. The service's log lines are
    formatted and dropped as in production, into `off.log` (a capturing handler, like pytest's, would keep
    their tracebacks, and all they reach, alive: a cycle behind them would go unseen)."""

    def __init__(self) -> None:
        self.garbage: list[object] = []
        self.log = ""
        self._stream = io.StringIO()
        self._handler = logging.StreamHandler(self._stream)
        self._logger = logging.getLogger("coordinator")
        self._saved = (self._logger.propagate, self._logger.level)

    def __enter__(self) -> CollectorOff:
        self._logger.addHandler(self._handler)
        self._logger.propagate = False
        self._logger.setLevel(logging.INFO)
        gc.collect()
        gc.disable()
        gc.set_debug(gc.DEBUG_SAVEALL)  # everything a collection finds unreachable lands in gc.garbage
        return self

    def __exit__(self, *exc_info: object) -> None:
        try:
            gc.collect()
            self.garbage = list(gc.garbage)
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
            gc.enable()
            self._logger.removeHandler(self._handler)
            self._logger.propagate, self._logger.level = self._saved
            self.log = self._stream.getvalue()


def summary(objects: list[object]) -> str:
    names = collections.Counter(f"{type(o).__module__}.{type(o).__qualname__}" for o in objects)
    return ", ".join(f"{name} x{count}" for name, count in names.most_common())
