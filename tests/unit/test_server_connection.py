"""Per-connection behaviour: in-order processing behind a parked request, limits, graceful shutdown."""

from __future__ import annotations

import asyncio
import contextvars
import logging
import socket
import struct
import time

import pytest
import uvloop

from coordinator.security.authorizer import Acls, Authorizer, Operation, ResourceType
from coordinator.server.context import java_host_string
from protocol.errors import ConnectionClosed
from protocol.apis import ApiKey
from protocol.fastpath import pack_heartbeat_request
from tests.support.polling import wait_until
from tests.support.server import RunningServer
from tests.support.service_front import ServiceFront
from tests.support.wire import heartbeat, join, join_with_member_id, ms, nested, request, subscription_metadata, sync


async def _stable_member(env: RunningServer, group_id: str = "g", *, session_timeout_ms: int = 6000):
    client = await env.client()
    joined = await join_with_member_id(client, group_id, session_timeout_ms=session_timeout_ms)
    synced = await sync(client, group_id, joined.generation_id, joined.member_id, {joined.member_id: b""})
    assert synced.error_code == 0
    return client, joined.member_id


async def _parked_join(env: RunningServer, client, group_id: str = "g", *,
                       rebalance_timeout_ms: int = 10_000) -> asyncio.Future:
    """A second member's JoinGroup, which parks until the first member rejoins (a rebalance) or the rebalance
    timeout ends the join phase."""
    first = await join(client, group_id)
    assert first.error_code == 79  # MEMBER_ID_REQUIRED
    protocol = nested(ApiKey.JOIN_GROUP, 9, "protocols")(name="range", metadata=subscription_metadata("t"))
    body = request(ApiKey.JOIN_GROUP, 9, group_id=group_id, session_timeout=ms(6000),
                   rebalance_timeout=ms(rebalance_timeout_ms), member_id=first.member_id, group_instance_id=None, protocol_type="consumer",
                   protocols=(protocol,), reason=None)
    busy_before = len(env.server._busy)
    parked = client.send(body)
    for _ in range(200):  # until the server has read it and the handler parked
        if len(env.server._busy) > busy_before:
            return parked
        await asyncio.sleep(0.005)
    raise AssertionError("the JoinGroup did not park")


async def test_pipelined_heartbeats_wait_behind_a_parked_join_and_come_back_in_order() -> None:
    async with RunningServer() as env:
        leader, leader_id = await _stable_member(env)
        newcomer = await env.client()
        completed: list[str] = []
        parked = await _parked_join(env, newcomer)
        parked.add_done_callback(lambda _f: completed.append("join"))
        beats = [newcomer.send(heartbeat("g", 1, leader_id)) for _ in range(100)]
        for i, beat in enumerate(beats):
            beat.add_done_callback(lambda _f, i=i: completed.append(f"hb{i}"))

        # the leader's own connection is not held up while the newcomer's is
        assert (await leader.request(heartbeat("g", 1, leader_id))).error_code == 27  # REBALANCE_IN_PROGRESS
        await asyncio.sleep(0.3)
        assert completed == [] and not parked.done()

        rejoined = await join(leader, "g", leader_id)  # completes the rebalance
        assert rejoined.error_code == 0 and rejoined.generation_id == 2
        assert (await parked).generation_id == 2
        await asyncio.gather(*beats)
        assert completed == ["join"] + [f"hb{i}" for i in range(100)]


async def test_too_many_connections_closes_the_newest(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="coordinator.server")
    async with RunningServer(max_connections=2) as env:
        first, second = await env.client(), await env.client()
        with pytest.raises((ConnectionClosed, ConnectionError, OSError)):
            await env.client()
        assert "reason=too_many_connections" in caplog.text
        assert not first.is_closed and not second.is_closed
        await first.close()
        await wait_until(lambda: env.server.connection_count < 2, 10, "the server to see the first close")
        third = await env.client()  # room again
        assert third.api_versions


async def test_idle_connections_close_but_one_with_a_parked_request_stays(caplog) -> None:
    caplog.set_level(logging.INFO, logger="coordinator.server")
    # the leader's heartbeats 50 ms apart keep it active; a loaded machine's stall of the test's loop (the
    # server's too) must exceed 450 ms to make it look idle
    async with RunningServer(idle_timeout_ms=500) as env:
        leader, leader_id = await _stable_member(env)
        idle = await env.client()
        newcomer = await env.client()
        parked = await _parked_join(env, newcomer)
        deadline = time.monotonic() + 8  # within the parked join's rebalance timeout
        while not idle.is_closed:  # the leader stays active; the others say nothing
            assert time.monotonic() < deadline, "the idle connection stayed open"
            await asyncio.sleep(0.05)
            await leader.request(heartbeat("g", 1, leader_id))
        assert "reason=idle" in caplog.text
        assert not newcomer.is_closed and not parked.done()
        await join(leader, "g", leader_id)
        assert (await parked).error_code == 0


async def test_reading_stops_once_max_buffered_bytes_wait_behind_a_parked_request() -> None:
    limit = 64 * 1024
    async with RunningServer(max_buffered_bytes=limit) as env:
        # the leader's heartbeats wait behind the parked join, so its session and the join phase must outlast
        # however long a loaded machine takes to read 64 KB: they end the rebalance, and the reading pause with it
        leader, leader_id = await _stable_member(env, session_timeout_ms=60_000)
        newcomer = await env.client()
        parked = await _parked_join(env, newcomer, rebalance_timeout_ms=60_000)
        beats = [newcomer.send(heartbeat("g", 1, leader_id)) for _ in range(20_000)]  # ~1.3 MB
        (connection,) = [c for c in env.server._busy]
        deadline = time.monotonic() + 30  # however slowly a loaded machine reads: until reading stops, bounded
        while not connection._reading_paused:
            assert time.monotonic() < deadline, connection.buffered_bytes
            await asyncio.sleep(0.01)
        assert limit <= connection.buffered_bytes < limit + 300 * 1024  # at most one more read past the limit
        await join(leader, "g", leader_id)
        await parked
        results = await asyncio.gather(*beats)
        assert len(results) == 20_000


async def test_a_frame_over_max_frame_bytes_closes_the_connection(caplog) -> None:
    caplog.set_level(logging.INFO, logger="coordinator.server")
    async with RunningServer(max_frame_bytes=1024) as env:
        client = await env.client()
        big = request(18, 3, client_software_name="x" * 2000, client_software_version="1")
        with pytest.raises(ConnectionClosed):
            await client.request(big)
        assert "reason=invalid_frame_size" in caplog.text


async def test_shutdown_answers_parked_requests_then_closes_and_refuses_new_connections() -> None:
    async with RunningServer(shutdown_grace_ms=200) as env:
        await _stable_member(env)
        newcomer = await env.client()
        parked = await _parked_join(env, newcomer)
        closing = asyncio.create_task(env.server.close())
        response = await asyncio.wait_for(parked, 5)
        assert response.error_code == 16  # NOT_COORDINATOR: the coordinator unloaded its groups
        await closing
        await asyncio.wait_for(newcomer.wait_closed(), 5)
        with pytest.raises(OSError):
            await env.client()
        assert env.timer.size == 0


@pytest.mark.parametrize(("peer", "expected"), [
    ("127.0.0.1", "/127.0.0.1"), ("::1", "/0:0:0:0:0:0:0:1"), ("fe80::1%eth0", "/fe80:0:0:0:0:0:0:1"),
    ("2001:db8::ff00:42:8329", "/2001:db8:0:0:0:ff00:42:8329"), ("::ffff:10.1.2.3", "/10.1.2.3"),
])
def test_client_host_is_written_like_java_inet_address(peer: str, expected: str) -> None:
    assert java_host_string(peer) == expected


async def test_a_peer_that_does_not_read_its_responses_is_not_read_either() -> None:
    """Write-side back-pressure: once the transport's write buffer is full we stop reading that peer, so
    neither its unread responses nor its unprocessed requests pile up in our memory."""
    from protocol import codec

    async with RunningServer() as env:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # the peer's kernel buffer holds little
        sock.connect(("127.0.0.1", env.port))
        reader, writer = await asyncio.open_connection(sock=sock)
        topic = nested(ApiKey.METADATA, 12, "topics")
        names = tuple(topic(name=f"topic-{i:04d}-" + "x" * 80, topic_id=None) for i in range(1000))
        frame = codec.encode_request(1, "flood", request(ApiKey.METADATA, 12, topics=names,
                                                         allow_auto_topic_creation=False,
                                                         include_topic_authorized_operations=False))
        count = 100  # ~10 MB of requests; each response echoes 1000 topics, ~10 MB in all
        writer.write(frame * count)
        sending = asyncio.create_task(writer.drain())
        deadline = time.monotonic() + 60  # ~20 MB through loopback on a loaded machine: bounded by time, not tries
        while time.monotonic() < deadline:
            connections = list(env.server._connections)
            if connections and connections[0]._writing_paused:
                break
            await asyncio.sleep(0.02)
        (connection,) = connections
        assert connection._writing_paused and connection._reading_paused
        assert connection.buffered_bytes < len(frame) + 300 * 1024
        assert not sending.done()  # the kernel buffers are full: the peer is blocked, not us
        for _ in range(count):
            size = struct.unpack(">i", await reader.readexactly(4))[0]
            await reader.readexactly(size)
        await sending
        writer.close()


@pytest.mark.parametrize("host", ["0.0.0.0", "::"])
def test_a_wildcard_listener_needs_an_advertised_host(host: str) -> None:
    from coordinator.server import ServerConfig

    with pytest.raises(ValueError, match="advertised"):
        ServerConfig(listen_host=host)
    assert ServerConfig(listen_host=host, advertised_host="coordinator.example").advertised_host == "coordinator.example"


async def test_serve_runs_until_stopped_then_shuts_down_through_the_hook() -> None:
    from coordinator.config import CoordinatorConfig
    from coordinator.group.runtime import GroupRuntime
    from coordinator.group.store import InMemoryGroupStore
    from coordinator.server import ServerConfig, serve
    from coordinator.timer import SystemTimer
    from protocol.client import KafkaClient

    timer = SystemTimer("serve-test")
    timer.start()
    coordinator = GroupRuntime(CoordinatorConfig(), timer, InMemoryGroupStore())
    started: list = []
    hook_calls: list[str] = []

    async def shutdown_groups() -> None:
        hook_calls.append("shutdown")
        await coordinator.shutdown()
        await timer.close()

    stop = asyncio.Event()
    serving = asyncio.create_task(serve(ServerConfig(listen_port=0, node_id=3), coordinator, stop=stop,
                                        on_started=started.append, on_shutdown=shutdown_groups))
    while not started:
        await asyncio.sleep(0.01)
    client = await KafkaClient.connect("127.0.0.1", started[0].port)
    found = await client.request(request(ApiKey.FIND_COORDINATOR, 3, key="g", key_type=0))
    assert (found.node_id, found.port) == (3, started[0].port)
    stop.set()
    await asyncio.wait_for(serving, 10)
    assert hook_calls == ["shutdown"] and not coordinator.is_active
    await asyncio.wait_for(client.wait_closed(), 5)


class _BrokenAuthorizer(Authorizer):
    """Enforcing, no ACL (everything allowed), and a bug: a check on group "boom" raises."""

    def __init__(self) -> None:
        super().__init__(allow_everyone_if_no_acl_found=True)
        self.use(Acls())

    def allows(self, principal: str, host: str, operation: Operation, resource_type: ResourceType, name: str, *,
               audited: bool = True) -> bool:
        if name == "boom":
            raise RuntimeError("boom")
        return super().allows(principal, host, operation, resource_type, name, audited=audited)


async def test_an_exception_escaping_a_protocol_callback_closes_only_that_connection_through_one_funnel(
        caplog: pytest.LogCaptureFixture) -> None:
    """Our bug below buffer_updated (here: the authorizer raising on the Heartbeat read on its direct path, which
    has no handler around it) is logged once at ERROR with its traceback and closes that connection; asyncio
    never sees it ("Fatal error on transport")."""
    caplog.set_level(logging.INFO)
    async with RunningServer(authorizer=_BrokenAuthorizer()) as env:
        bystander, member_id = await _stable_member(env)
        peer = await env.raw()
        await peer.send(pack_heartbeat_request(4, 1, "client", "boom", 1, member_id))
        assert await peer.closed_by_server()
        assert (await bystander.request(heartbeat("g", 1, member_id))).error_code == 0
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert [r.getMessage().split()[0:2] for r in errors] == [["event=connection_failed", "callback=buffer_updated"]]
    assert errors[0].exc_info is not None and errors[0].name == "coordinator.server"
    assert any("reason=internal_error" in r.getMessage() for r in caplog.records)


_REQUEST_SPAN: contextvars.ContextVar[str | None] = contextvars.ContextVar("request_span", default=None)


async def test_a_parked_handler_resets_its_context_variables_where_it_set_them_and_leaks_none() -> None:
    """As OpenTelemetry's `start_as_current_span` does around a request: set a context variable, park, reset it.
    The first step and the rest must run in one context of the handler's own (else the reset raises and the
    value stays current for the connection's later requests)."""
    async with RunningServer(front=ServiceFront) as env:
        original = env.service.join_group
        seen_before: list[str | None] = []
        reset_errors: list[BaseException] = []

        async def join_group(req):
            seen_before.append(_REQUEST_SPAN.get())
            token = _REQUEST_SPAN.set(f"join {req.member_id!r}")
            try:
                return await original(req)
            finally:
                try:
                    _REQUEST_SPAN.reset(token)
                except ValueError as exc:
                    reset_errors.append(exc)

        env.service.join_group = join_group
        env.service.start_join_group = None  # the coroutine way (a service without the synchronous start)
        leader, leader_id = await _stable_member(env)
        newcomer = await env.client()
        parked = await _parked_join(env, newcomer)  # parks: its first step and the rest are apart
        rejoined = await join(leader, "g", leader_id)
        assert rejoined.error_code == 0 and (await parked).error_code == 0
        again = await join(newcomer, "g", (await parked).member_id)  # a later request on the parked connection
        assert again.error_code in (0, 27)
        assert reset_errors == []
        assert seen_before == [None] * len(seen_before) and len(seen_before) >= 5


async def test_parked_join_and_sync_are_answered_without_a_task_each() -> None:
    """A rebalance resumes every parked member at once: JoinGroup and SyncGroup carry on in the awaited future's
    callback (no Task, no extra loop turns), and the requests pipelined behind them still come back in order."""
    async with RunningServer(front=ServiceFront) as env:
        tasks_after_wait: list[object] = []
        for name in ("join_group", "sync_group"):
            original = getattr(env.service, name)

            async def waited(req, original=original):
                response = await original(req)
                tasks_after_wait.append(asyncio.current_task())
                return response

            setattr(env.service, name, waited)
            setattr(env.service, f"start_{name}", None)  # the coroutine way
        leader, leader_id = await _stable_member(env)
        newcomer = await env.client()
        parked = await _parked_join(env, newcomer)
        rejoined = await join(leader, "g", leader_id)
        joined = await parked
        assert rejoined.error_code == 0 and joined.error_code == 0
        assert rejoined.generation_id == joined.generation_id
        busy_before = len(env.server._busy)
        follower_sync = newcomer.send(request(  # parks until the leader's assignment is written
            ApiKey.SYNC_GROUP, 5, group_id="g", generation_id=joined.generation_id, member_id=joined.member_id,
            group_instance_id=None, protocol_type="consumer", protocol_name="range", assignments=()))
        behind = newcomer.send(heartbeat("g", joined.generation_id, joined.member_id))
        for _ in range(200):
            if len(env.server._busy) > busy_before:
                break
            await asyncio.sleep(0.005)
        else:
            raise AssertionError("the follower's SyncGroup did not park")
        leader_sync = await sync(leader, "g", rejoined.generation_id, leader_id,
                                 {leader_id: b"L", joined.member_id: b"F"})
        synced = await follower_sync
        assert leader_sync.error_code == 0 and synced.error_code == 0 and synced.assignment == b"F"
        assert (await behind).error_code == 0
        assert len(tasks_after_wait) >= 4 and tasks_after_wait == [None] * len(tasks_after_wait)


async def test_join_and_sync_are_served_without_a_coroutine_and_leak_no_context_variable() -> None:
    """The runtime's synchronous starts: a parked JoinGroup/SyncGroup is the future group logic answers, written
    in its done callback; the requests pipelined behind it still come back in order, and a context variable
    group logic sets stays in that request's own context."""
    async with RunningServer(front=ServiceFront) as env:
        outcomes: list[object] = []
        seen_before: list[str | None] = []
        for name in ("start_join_group", "start_sync_group"):
            original = getattr(env.service, name)

            def started(req, original=original):
                seen_before.append(_REQUEST_SPAN.get())
                _REQUEST_SPAN.set(f"{req.member_id!r}")  # never reset: must not outlive the request
                outcome = original(req)
                outcomes.append(outcome)
                return outcome

            setattr(env.service, name, started)
        leader, leader_id = await _stable_member(env)
        newcomer = await env.client()
        parked = await _parked_join(env, newcomer)
        rejoined = await join(leader, "g", leader_id)
        joined = await parked
        assert rejoined.error_code == 0 and joined.error_code == 0
        follower_sync = newcomer.send(request(
            ApiKey.SYNC_GROUP, 5, group_id="g", generation_id=joined.generation_id, member_id=joined.member_id,
            group_instance_id=None, protocol_type="consumer", protocol_name="range", assignments=()))
        behind = newcomer.send(heartbeat("g", joined.generation_id, joined.member_id))
        leader_sync = await sync(leader, "g", rejoined.generation_id, leader_id,
                                 {leader_id: b"L", joined.member_id: b"F"})
        synced = await follower_sync
        assert leader_sync.error_code == 0 and synced.error_code == 0 and synced.assignment == b"F"
        assert (await behind).error_code == 0
        parked_ones = [o for o in outcomes if isinstance(o, asyncio.Future)]
        assert len(parked_ones) >= 4 and all(o.done() for o in parked_ones)
        assert not any(asyncio.iscoroutine(o) for o in outcomes)
        assert seen_before == [None] * len(seen_before)


async def test_a_join_or_sync_answered_at_once_does_not_park_the_connection() -> None:
    """Group logic answers an error on the spot (a done future): written in the same turn, the connection never
    counted as busy, the request behind it answered after it."""
    async with RunningServer() as env:
        client, member_id = await _stable_member(env)
        parks_before = env.server.parks
        stale = client.send(request(
            ApiKey.SYNC_GROUP, 5, group_id="g", generation_id=99, member_id=member_id, group_instance_id=None,
            protocol_type="consumer", protocol_name="range", assignments=()))
        behind = client.send(heartbeat("g", 1, member_id))
        assert (await stale).error_code == 22  # ILLEGAL_GENERATION
        assert (await behind).error_code == 0
        assert env.server.parks == parks_before


# The transport-level behaviour (in-order responses, pausing reads, shutdown) also holds on uvloop, the optional
# faster loop: the same tests, run on it.

def test_pipelining_behind_a_parked_join_on_uvloop() -> None:
    uvloop.run(test_pipelined_heartbeats_wait_behind_a_parked_join_and_come_back_in_order())


def test_back_pressure_on_uvloop() -> None:
    uvloop.run(test_reading_stops_once_max_buffered_bytes_wait_behind_a_parked_request())


def test_graceful_shutdown_on_uvloop() -> None:
    uvloop.run(test_shutdown_answers_parked_requests_then_closes_and_refuses_new_connections())


async def test_a_steady_consumer_group_heartbeat_is_answered_without_a_coroutine() -> None:
    """ConsumerGroupHeartbeat through the runtime's synchronous start: the join (records to write) is parked on,
    the steady heartbeat behind it answered on the spot from its frame (the runtime's steady path), an error
    answered through the general writer."""
    async with RunningServer(front=ServiceFront) as env:
        outcomes: list[object] = []
        original = env.service.start_consumer_group_heartbeat
        original_steady = env.service.steady_consumer_group_heartbeat

        def started(req):  # type: ignore[no-untyped-def]
            outcome = original(req)
            outcomes.append(outcome)
            return outcome

        def steady(req):  # type: ignore[no-untyped-def]
            outcome = original_steady(req)
            outcomes.append(("steady", type(outcome).__name__))
            return outcome

        env.service.start_consumer_group_heartbeat = started
        env.service.steady_consumer_group_heartbeat = steady
        client = await env.client()
        base = dict(group_id="cg", member_id="m-1", instance_id=None, rack_id=None, subscribed_topic_regex=None,
                    server_assignor=None)
        joined = await client.request(request(
            ApiKey.CONSUMER_GROUP_HEARTBEAT, 1, member_epoch=0, rebalance_timeout=ms(30_000),
            subscribed_topic_names=("t",), topic_partitions=(), **base))
        assert (joined.error_code, joined.member_epoch) == (0, 1)
        steady = await client.request(request(
            ApiKey.CONSUMER_GROUP_HEARTBEAT, 1, member_epoch=1, rebalance_timeout=ms(-1),
            subscribed_topic_names=None, topic_partitions=None, **base))
        assert (steady.error_code, steady.member_epoch, steady.assignment) == (0, 1, None)
        fenced = await client.request(request(
            ApiKey.CONSUMER_GROUP_HEARTBEAT, 1, member_epoch=7, rebalance_timeout=ms(-1),
            subscribed_topic_names=None, topic_partitions=None, **base))
        assert fenced.error_code == 110  # FENCED_MEMBER_EPOCH, with Kafka's message
        assert fenced.error_message.startswith("The consumer group member has a greater member epoch (7)")
        assert isinstance(outcomes[0], asyncio.Future)  # the join's answer, once its records are written
        assert [o if isinstance(o, tuple) else type(o).__name__ for o in outcomes[1:]] == [
            ("steady", "HeartbeatResponse"), ("steady", "NoneType"), "HeartbeatResponse"]


class _KeptTransport:
    """What a Connection writes to, without a socket: every write kept."""

    def __init__(self) -> None:
        self.written: list[bytes] = []

    def get_extra_info(self, name: str, default: object = None) -> object:
        return ("127.0.0.1", 5555) if name in ("peername", "sockname") else default

    def write(self, data: bytes) -> None:
        self.written.append(bytes(data))

    def pause_reading(self) -> None: ...
    def resume_reading(self) -> None: ...
    def abort(self) -> None: ...
    def close(self) -> None: ...


async def test_an_answer_given_up_on_at_shutdown_leaves_the_next_parked_request_alone() -> None:
    """cancel_in_flight after the parked JoinGroup's future was answered but before its done callback ran (the
    answer already scheduled on the loop): that callback neither writes the answer given up on nor clears the
    request parked after it, which is answered by its own future, once."""
    from types import SimpleNamespace

    from coordinator.group.api import JoinGroupResponse
    from coordinator.server.config import ServerConfig
    from coordinator.server.connection import Connection
    from coordinator.server.context import Node
    from protocol import codec
    from protocol.error_codes import Errors

    futures: list[asyncio.Future] = []

    def start_join_group(_request: object) -> asyncio.Future:
        futures.append(asyncio.get_running_loop().create_future())
        return futures[-1]

    host = SimpleNamespace(config=ServerConfig(), relay=None, directory=None,
                           coordinator=SimpleNamespace(start_join_group=start_join_group),
                           clock=SimpleNamespace(now_ms=lambda: 0), node=Node(0, "127.0.0.1", 9092, "test"),
                           closing=False, authorizer=None, admit=lambda _c: True, forget=lambda _c: None,
                           parked=lambda _c: None, unparked=lambda _c: None)
    transport = _KeptTransport()
    connection = Connection(host)  # type: ignore[arg-type]
    connection.connection_made(transport)  # type: ignore[arg-type]
    protocol = nested(ApiKey.JOIN_GROUP, 9, "protocols")(name="range", metadata=subscription_metadata("t"))

    def send_join(correlation_id: int) -> None:
        frame = codec.encode_request(correlation_id, "c", request(
            ApiKey.JOIN_GROUP, 9, group_id="g", session_timeout=ms(6000), rebalance_timeout=ms(10_000),
            member_id="m-1", group_instance_id=None, protocol_type="consumer", protocols=(protocol,), reason=None))
        buffer = connection.get_buffer(len(frame))
        buffer[:len(frame)] = frame
        connection.buffer_updated(len(frame))

    def answer(member_id: str) -> JoinGroupResponse:
        return JoinGroupResponse(Errors.NONE, member_id, 1, "consumer", "range", "m-0", False, [])

    send_join(1)
    assert connection.is_busy and len(futures) == 1
    futures[0].set_result(answer("first"))  # its done callback is now scheduled, not run
    connection.cancel_in_flight()
    send_join(2)
    assert connection.is_busy and len(futures) == 2
    await asyncio.sleep(0)  # the first future's callback runs
    await asyncio.sleep(0)
    assert transport.written == [] and connection.is_busy  # nothing answered, the second still in flight
    futures[1].set_result(answer("second"))
    await wait_until(lambda: transport.written, 5, "the second answer written")
    assert [struct.unpack_from(">i", frame, 4)[0] for frame in transport.written] == [2]  # correlation ids
    assert not connection.is_busy
