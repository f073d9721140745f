"""One client connection: frames in, one request at a time, responses out in request order.

Like Kafka's broker (which mutes a channel while a request from it is in flight), a request whose handler parks
(a JoinGroup or SyncGroup waiting in a purgatory) holds the requests behind it on this connection only. While
parked we keep reading until `max_buffered_bytes` are waiting, then stop reading (TCP back-pressure); we also
stop while the transport's write buffer is full. Requests are handled within the loop's budget per turn
(server/turns.py): frames beyond it stay buffered for a later turn, so callbacks scheduled meanwhile (a state
write's acknowledgement, timers) do not wait behind a flood, and no callback's cost grows with the frames.

With the relay (coordinator/relay), each request is routed by its header: group APIs to their handlers here,
every other API to this connection's upstream link, byte for byte (server/relaying.py keeps the link and the
response order that relayed and local responses share).

Handlers are coroutines, but most finish without ever waiting (Heartbeat, offset fetches). Creating a Task per
request would cost more than the heartbeat logic itself, so the first step of each handler runs right here;
only a handler that actually parks is handed to a Task, once the future it waits on is done. (So code that runs
before a handler's first await sees no current Task: it must not use `asyncio.timeout()` or `current_task()`.)
JoinGroup and SyncGroup, parked by the thousand in a rebalance, go without a coroutine: the runtime's
synchronous start gives the answer or the future group logic answers, whose done callback writes it. Where
they must go the coroutine way (a service without the starts), each step still runs in the awaited future's
done callback, no Task: nothing on their path may ask for a current Task.

No exception leaves a protocol callback or a done-callback of ours: one funnel (`_contain`) logs it and closes
this connection. Otherwise asyncio would report "Fatal error on transport" (or "Exception in callback") and drop
the connection behind our back. Blame decides the level, as everywhere at the edge: a ProtocolError is the
peer's fault (WARNING, `reason=<error class>`); anything else is our bug (ERROR with the traceback).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
import struct
from collections.abc import Awaitable, Callable, Coroutine
from types import CoroutineType
from typing import TYPE_CHECKING, Any, Protocol, cast

from coordinator.group.member import ANSWERED_IN_PASS
from coordinator.relay.errors import UpstreamUnavailable
from coordinator.relay.upstream import pause_when_anything_unsent
from coordinator.relay.versions import Route
from protocol.transports import release_transport_cycle
from coordinator.security.authorizer import Operation, ResourceType
from coordinator.security.identity import ClientIdentity, context_with, security_protocol
from coordinator.security.principals import PrincipalMappingError, SslPrincipalMapper, tls_principal
from coordinator.security.sasl_passthrough import PASSABLE_MECHANISMS, Refusal, SaslPassthrough, State
from coordinator.server.config import ServerConfig
from coordinator.server.context import ConnectionContext, Directory, GroupService, Node, java_host_string
from coordinator.server.handlers import HANDLERS, SERVED_APIS, consumer_group_heartbeat, join_group, sync_group
from coordinator.server.handlers.api_versions import unsupported_version_reply
from coordinator.server.relaying import RelaySide
from coordinator.server.turns import (HEARTBEAT_UNITS, REQUEST_UNITS, STEADY_CONSUMER_GROUP_HEARTBEAT_UNITS,
                                      turn_budget)
from coordinator.timer.clock import Clock
from protocol.apis import ApiKey
from protocol.codec import Request, RequestHeader, decode_request, encode_response, peek_header, read_group_request
from protocol.error_codes import Errors
from protocol.errors import InvalidFrameSize, ProtocolError, UnknownApiKey, UnsupportedVersion
from protocol.fastpath import (
    CONSUMER_GROUP_HEARTBEAT_API_KEY,
    HEARTBEAT_V4_PREFIX,
    pack_heartbeat_v4_response,
    read_consumer_group_heartbeat,
    read_heartbeat_v4_request,
)
from protocol.framing import FrameReader

if TYPE_CHECKING:
    from coordinator.relay.relay import Relay
    from coordinator.security.authorizer import Authorizer

log = logging.getLogger("coordinator.server")
_API_KEY_AND_VERSION = struct.Struct(">hh")
_DISCARD_BYTES = 4_096
# Parked rebalance requests, resumed in the awaited future's callback instead of a Task: their handlers and the
# runtime's path after the wait (coordinator/group/runtime.py) ask for no current Task.
_RESUMED_HERE = frozenset({ApiKey.JOIN_GROUP, ApiKey.SYNC_GROUP})
# Parked answers written in the pass that completes them (ANSWERED_IN_PASS): a rebalance's, and a written
# ConsumerGroupHeartbeat's in its write's settling (no loop turn between the write's outcome and the answer).
_ANSWERED_IN_PASS_APIS = frozenset({ApiKey.JOIN_GROUP, ApiKey.SYNC_GROUP, ApiKey.CONSUMER_GROUP_HEARTBEAT})
# Enum members read per request, as module names: an Enum's class attribute (or a member's .value) costs ten times.
_JOIN_GROUP = int(ApiKey.JOIN_GROUP)
_RELAYED = Route.RELAYED
_GROUP_AUTHORIZATION_FAILED = int(Errors.GROUP_AUTHORIZATION_FAILED)
_NO_ANSWER = b""  # the request was handled and answers nothing (its connection was closed)
_HEARTBEAT = SERVED_APIS.get(int(ApiKey.HEARTBEAT))
_HEARTBEAT_V4_SERVED = _HEARTBEAT is not None and _HEARTBEAT.min_version <= 4 <= _HEARTBEAT.max_version
_HEARTBEAT_KEY = int(ApiKey.HEARTBEAT)


_Start = Callable[[Any, RequestHeader, Any], Any]
_ToFrame = Callable[[RequestHeader, Any], bytes]
# Started without a coroutine (handlers' `start`): a rebalance serves two of these per member, and a consumer
# group's members heartbeat every few seconds.
_STARTED_HERE: dict[int, tuple[_Start, _ToFrame]] = {
    ApiKey.JOIN_GROUP: (join_group.start, join_group.to_frame),
    ApiKey.SYNC_GROUP: (sync_group.start, sync_group.to_frame),
    ApiKey.CONSUMER_GROUP_HEARTBEAT: (consumer_group_heartbeat.start, consumer_group_heartbeat.to_frame),
}


async def _framed(header: RequestHeader, awaitable: Awaitable[Any], to_frame: _ToFrame) -> bytes:
    return to_frame(header, await awaitable)


def _read_consumer_group_heartbeat(frame: bytes) -> Request | None:
    read = read_consumer_group_heartbeat(frame)
    if read is None:
        return None
    api_version, correlation_id, client_id, fields = read
    return Request(RequestHeader(ApiKey.CONSUMER_GROUP_HEARTBEAT, api_version, correlation_id, client_id), fields)


class ConnectionHost(Protocol):
    """What a connection needs of the listener that accepted it (server/listener.py's CoordinatorServer)."""

    config: ServerConfig
    relay: Relay | None
    directory: Directory | None
    coordinator: GroupService
    clock: Clock
    node: Node
    closing: bool
    authorizer: Authorizer | None

    def admit(self, connection: Connection) -> bool: ...
    def forget(self, connection: Connection) -> None: ...
    def parked(self, connection: Connection) -> None: ...
    def unparked(self, connection: Connection) -> None: ...


class Connection(asyncio.BufferedProtocol):
    def __init__(self, server: ConnectionHost, upstream_node: int | None = None) -> None:
        self._server = server
        self.upstream_node = upstream_node  # the broker this listener stands for; None: the bootstrap listener
        self._relaying = None if server.relay is None else RelaySide(server.relay, upstream_node)
        # SASL_* listener: Kafka's SASL sequence, the exchange judged by the broker over our upstream link
        access = server.config.access
        self._sasl = SaslPassthrough(enabled=access.sasl_mechanisms if access else PASSABLE_MECHANISMS,
                                     claim=access.oauthbearer_claim if access else "sub",
                                     max_reauth_ms=access.max_reauth_ms if access else 0,
                                     now_ms=server.clock.now_ms,
                                     token_owner=server.relay.token_owner if server.relay else None,
                                     wake=self.relay_responses_ready) \
            if server.config.sasl_passthrough else None
        self._config = server.config
        # nothing between the wire and the handlers but, maybe, the relay (no SASL sequence), and Heartbeat v4
        # handled here: a read that is one Heartbeat v4 may take the direct path in buffer_updated (on a relay
        # connection only while no relayed answer is due: _plain_now)
        self._direct = self._sasl is None and (self._relaying is None or self._relaying.local(_HEARTBEAT_KEY, 4))
        self._reader = FrameReader(server.config.max_frame_bytes)
        self._turn = turn_budget()  # the loop's requests per turn, shared with every other connection on it
        self._deferred = False  # queued with the budget: frames left for a later turn
        # answered as a group's leader: its next request (the SyncGroup with the assignment every parked member
        # waits for) goes ahead of the queue when the turn's budget is spent
        self._leads = False
        self._last_turn = False  # the peer's EOF: what it sent is handled now, the budget aside
        self._transport: asyncio.Transport | None = None
        self._ctx: ConnectionContext | None = None
        self._request_context: contextvars.Context | None = None  # the sender's identity, for its handlers
        self._in_flight: RequestHeader | None = None
        # What a parked request waits on: the future; its handler's coroutine and the done callback that resumes
        # it (the coroutine way), or None and None when started here (`_start`: this connection is the future's
        # done callback itself). Three attributes, no tuple, no bound method: a rebalance parks two requests a
        # member, and each object alive while they wait counts towards a young collection.
        self._parked: asyncio.Future[Any] | None = None
        self._parked_handler: Coroutine[Any, Any, Any] | None = None
        self._parked_resume: Any = None
        self._to_frame: _ToFrame = join_group.to_frame  # packs the answer of the request parked by `_start`
        self._task: asyncio.Task[Any] | None = None
        self._open = False
        self._outgoing: list[bytes] = []  # responses of this read, sent in one write (one syscall)
        self._reading_paused = False
        self._writing_paused = False
        # Idle detection without reading a clock per request: the listener's sweeper notices when this
        # counter stops moving (see CoordinatorServer._sweep_idle_connections).
        self.activity = 0
        self.quiet_since_ms = server.clock.now_ms()
        self.activity_seen = 0
        # Rounds of the frame loop (_process_frames) run: which path a read took, for tests (the direct paths run
        # none). An int attribute, not a method to override: compiled, neither a subclass nor an instance's
        # replaced method would be seen.
        self.frame_loop_rounds = 0

    # ------------------------------------------------------------------------------------------ transport events

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        stream = self._transport = cast(asyncio.Transport, transport)  # a TCP (or TLS) connection's transport
        self._open = True
        try:
            peername = transport.get_extra_info("peername") or ("?", 0)
            peer = f"{peername[0]}:{peername[1]}"
            if self._sasl is not None:
                self._sasl.peer = peer
                local = transport.get_extra_info("sockname") or ("?", 0)
                self._sasl.listener = f"{local[0]}:{local[1]}"
            self._ctx = ConnectionContext(self._server.node, self._server.coordinator,
                                          java_host_string(peername[0]), peer, self._server.relay,
                                          self._server.directory, authorizer=self._server.authorizer,
                                          upstream_node=self.upstream_node)
            if self._sasl is None and not self._take_certificate_principal(transport):
                return
            self._identify()
            if self._relaying is not None:
                # pause as soon as anything is left unsent: relayed frames are then kept (and counted) in the
                # pool, never copied into an unbounded transport buffer
                pause_when_anything_unsent(stream)
            if not self._server.admit(self):
                self.abort("too_many_connections", f"max_connections={self._config.max_connections}")
        except Exception as exc:
            self._contain("connection_made", exc)

    def get_buffer(self, sizehint: int) -> memoryview:
        try:
            return self._reader.get_buffer()
        except Exception as exc:
            self._contain("get_buffer", exc)
            return memoryview(bytearray(_DISCARD_BYTES))  # closed already: what lands here is dropped

    def buffer_updated(self, nbytes: int) -> None:
        try:
            reader = self._reader
            reader.buffer_updated(nbytes)
            self.activity += 1
            if self._plain_now():
                if self._turn.left > 0:
                    frame = reader.only_frame()
                    if frame is not None:
                        self._sole_frame(frame)
                        return
                elif not self._last_turn:  # the turn's budget is spent: what came waits for a later turn
                    self._wait_for_turn()
                    return
            self._process_frames()
        except Exception as exc:
            self._contain("buffer_updated", exc)

    def _plain_now(self) -> bool:
        """Nothing between the wire and the handlers (no SASL), nothing parked, paused or closing, and on a relay
        connection no relayed answer due and the broker taking requests (RelaySide.settled): a request read now
        is handled as _process_frames would handle it, without its loop, and an answer written now leaves in
        request order (Kafka answers a connection's requests in the order sent)."""
        relaying = self._relaying
        return (self._direct and self._in_flight is None and not self._writing_paused and not self._reading_paused
                and self._open and not self._server.closing
                # (no link opened, nothing due: settled without its two calls, as in _process_frames)
                and (relaying is None or (relaying.link is None and relaying.reauth_link is None
                                          and not relaying.pending) or relaying.settled()))

    def _wait_for_turn(self) -> None:
        """What _process_frames does with frames when the turn's budget is spent (nothing to flush here)."""
        buffered = self._reader.buffered_bytes
        if buffered and not self._deferred:
            self._deferred = True
            self._turn.wait(self, first=self._leads)
        # (called when _plain_now: nothing paused, closing or blocked, so only the bytes waiting could pause
        # reading; most requests of a rebalance's flood wait here once)
        if buffered >= self._config.max_buffered_bytes:
            self._apply_read_limit()

    def _sole_frame(self, frame: bytes) -> None:
        """The one request this connection has (it read exactly one whole frame), nothing parked or paused and
        budget left this turn: a Heartbeat v4 in its usual shape is answered with one write, without the frame
        loop; anything else goes the general way (`_handle_frame`, then its answer flushed, or, with an upstream
        link, the loop for the flush and the read limit). Kafka's order holds: nothing of this connection is
        waiting before it."""
        self._leads = False
        if frame[:4] == HEARTBEAT_V4_PREFIX and _HEARTBEAT_V4_SERVED:
            answer = self._heartbeat_v4_answer(frame)
            if answer is not None:
                self._turn.spend(HEARTBEAT_UNITS)
                if answer and self._open:
                    self.activity += 1
                    self._transport.write(answer)  # type: ignore[union-attr]
                return
        self._turn.spend(self._handle_frame(frame))
        if self._unlinked():
            # Its frame was the buffer's only one, nothing was paused (_plain_now, no SASL) and no upstream link
            # can block this connection: the loop would find no frame and limit nothing; what is left is its
            # answer, if it has one yet (a parked JoinGroup or SyncGroup of a rebalance has none).
            if self._outgoing:
                self._flush()
            return
        self._process_frames()  # the flush and the read limit, as after any request

    def eof_received(self) -> bool:
        try:
            # Frames waiting for their turn are handled now, before the close: on TLS the transport closes
            # whatever this returns, and Kafka handles every request it read (answered while the socket takes it).
            self._last_turn = True
            if self._deferred:
                self._process_frames()
            if self._reader.buffered_bytes and self._in_flight is None:
                log.info("event=connection_closed reason=truncated_frame peer=%s buffered_bytes=%d",
                         self.peer, self._reader.buffered_bytes)
        except Exception as exc:
            self._contain("eof_received", exc)
        return False  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        if self._transport is not None:
            release_transport_cycle(self._transport)
        self._transport = None
        self._open = False
        if self._parked is not None:  # answered, if ever, through its done callback: nothing to write any more
            ANSWERED_IN_PASS.pop(self._parked, None)
        try:
            self._server.forget(self)
            if self._relaying is not None:
                self._relaying.close()
        except Exception as error:
            self._contain("connection_lost", error)
        log.debug("event=connection_lost peer=%s error=%r", self.peer, exc)

    def pause_writing(self) -> None:
        self._writing_paused = True
        try:
            if self._relaying is not None:
                self._relaying.pause_for_client(True)
            self._apply_read_limit()
        except Exception as exc:
            self._contain("pause_writing", exc)

    def resume_writing(self) -> None:
        self._writing_paused = False
        try:
            if self._relaying is not None:
                self._relaying.release_held()
                self._relaying.pause_for_client(False)
            self._process_frames()
        except Exception as exc:
            self._contain("resume_writing", exc)

    # ------------------------------------------------------------------------------------------ requests

    @property
    def peer(self) -> str:
        return self._ctx.peer if self._ctx else "?"

    @property
    def buffered_bytes(self) -> int:
        """Bytes received and not yet processed."""
        return self._reader.buffered_bytes

    @property
    def is_busy(self) -> bool:
        """A request is in flight (its handler parked)."""
        return self._in_flight is not None

    @property
    def is_open(self) -> bool:
        return self._open

    def _unlinked(self) -> bool:
        """Nothing upstream can hold this connection's requests back: no relay, or no upstream link opened (nor a
        re-authentication's) and no SASL exchange (RelaySide.blocked would be False). Attribute reads, not
        RelaySide's calls: it is asked for every request of a rebalance."""
        relaying = self._relaying
        return relaying is None or (relaying.link is None and relaying.reauth_link is None and self._sasl is None)

    def _process_frames(self) -> None:
        self.frame_loop_rounds += 1
        turn = self._turn
        # Not blocked: nothing upstream to block it (_unlinked: read for every request of a rebalance, and a group
        # member's connection rarely relays anything), or _relay_blocked says so.
        while (self._in_flight is None and (not self._writing_paused or self._last_turn) and self._open
               and (self._unlinked() or not self._relay_blocked())):
            # the loop's turn has handled its share: the rest waits for the next turn (after EOF there is none)
            if turn.left <= 0 and not self._last_turn:
                if self._reader.buffered_bytes and not self._deferred:
                    self._deferred = True
                    turn.wait(self, first=self._leads)
                break
            try:
                frame = self._reader.next_frame()
            except InvalidFrameSize as exc:
                self.abort("invalid_frame_size", str(exc))
                return
            if frame is None:
                break
            if self._leads:
                self._leads = False
            turn.spend(self._handle_frame(frame))
        self._flush()
        self._apply_read_limit()

    def continue_frames(self) -> None:
        """A later turn's share of the frames left in the buffer (called by the turn budget)."""
        self._deferred = False
        try:
            if self._plain_now() and self._turn.left > 0:  # a heartbeat that waited for this turn: answered directly
                frame = self._reader.only_frame()
                if frame is not None:
                    self._sole_frame(frame)
                    return
            self._process_frames()
        except Exception as exc:
            self._contain("continue_frames", exc)

    def _take_certificate_principal(self, transport: asyncio.BaseTransport) -> bool:
        """An SSL listener's principal, from the client's certificate (ANONYMOUS without one); a certificate no
        mapping rule applies to fails the connection, as Kafka fails its authentication."""
        tls = transport.get_extra_info("ssl_object")
        if tls is None:
            return True
        access = self._config.access
        mapper = access.principal_mapper if access is not None else SslPrincipalMapper()
        try:
            self._ctx.principal = tls_principal(tls.getpeercert(binary_form=True), mapper)  # type: ignore[union-attr]
        except (PrincipalMappingError, ValueError) as exc:
            self.abort("ssl_principal_mapping", str(exc))
            return False
        return True

    def _identify(self) -> None:
        """The context this connection's handlers run in names its principal (coordinator/security/identity)."""
        assert self._ctx is not None
        protocol = security_protocol(self._config.ssl_context is not None, self._sasl is not None)
        self._request_context = context_with(ClientIdentity(self._ctx.principal, protocol))

    def _handle_frame(self, frame: bytes) -> int:
        """Handles one request; returns what it cost of the turn's budget (server/turns.py): the heartbeats on
        their fast paths their measured units, anything else REQUEST_UNITS."""
        sasl = self._sasl
        if sasl is not None:
            if not self._sasl_admits(frame):
                return REQUEST_UNITS
            if sasl.state is State.COMPLETE and sasl.principal is not None:
                principal = "User:" + sasl.principal
                if principal != self._ctx.principal:  # type: ignore[union-attr]
                    self._ctx.principal = principal  # type: ignore[union-attr]
                    self._identify()
        if self._relaying is not None:
            if not self._route_locally(frame, self._relaying):
                return REQUEST_UNITS
        elif not self._served(frame):
            return REQUEST_UNITS
        if frame[:4] == HEARTBEAT_V4_PREFIX and self._heartbeat_v4(frame):
            return HEARTBEAT_UNITS
        if frame[:2] == CONSUMER_GROUP_HEARTBEAT_API_KEY:
            if self._steady_consumer_group_heartbeat(frame):
                return STEADY_CONSUMER_GROUP_HEARTBEAT_UNITS
            request = _read_consumer_group_heartbeat(frame)
        else:
            request = read_group_request(frame)  # JoinGroup/SyncGroup in their usual shape, read by hand
            if request is not None:  # both started here (_STARTED_HERE): _dispatch's steps without its lookups
                header = request.header
                start, to_frame = _STARTED_HERE[header.api_key]
                self._start(header, request.body, start, to_frame)
                return REQUEST_UNITS
        if request is None:
            try:
                request = decode_request(frame)
            except ProtocolError as exc:
                self._reject(frame, exc)
                return REQUEST_UNITS
        self._dispatch(request)
        return REQUEST_UNITS

    def _dispatch(self, request: Request) -> None:
        header = request.header
        started = _STARTED_HERE.get(header.api_key)
        if started is not None:
            self._start(header, request.body, *started)
            return
        try:
            outcome = HANDLERS[header.api_key](self._ctx, header, request.body)
        except Exception as exc:
            self._fail(header, exc)
            return
        if isinstance(outcome, CoroutineType):  # the concrete type: an ABC check costs more
            self._drive(header, outcome)
        else:
            self._respond(header, outcome)

    def _start(self, header: RequestHeader, body: Any, start: _Start, to_frame: _ToFrame) -> None:
        """JoinGroup/SyncGroup/ConsumerGroupHeartbeat without a coroutine: answered now, or parked on the future
        group logic answers (answered in its done callback); anything else it must wait for (a write, a topic
        refresh) goes the coroutine way."""
        base = self._request_context
        context = base.copy() if base is not None else contextvars.copy_context()
        try:
            outcome = context.run(start, self._ctx, header, body)
        except Exception as exc:
            self._fail(header, exc)
            return
        if type(outcome) is bytes:
            self._write(outcome)
        elif isinstance(outcome, asyncio.Future):
            if outcome.done():  # answered at once (an error): no loop turn
                self._answer(header, to_frame, outcome)
                return
            # What the answer needs is kept on the connection (one request in flight), the done callback this
            # connection itself (`__call__`): no partial or bound method per parked request (a rebalance parks two
            # per member).
            self._in_flight = header
            self._to_frame = to_frame
            self._server.parked(self)
            self._parked = outcome
            outcome.add_done_callback(self)
            if header.api_key in _ANSWERED_IN_PASS_APIS:  # written in the pass of group logic that answers it
                ANSWERED_IN_PASS[outcome] = self
        else:
            self._drive(header, _framed(header, outcome, to_frame), context)

    def __call__(self, future: asyncio.Future[Any]) -> None:
        """The done callback of a request parked by `_start`."""
        self._answer_parked(future)

    def _answer_parked(self, future: asyncio.Future[Any]) -> None:
        """The parked request's answer, in the future's done callback, then what waited behind it on this
        connection."""
        if ANSWERED_IN_PASS:
            ANSWERED_IN_PASS.pop(future, None)
        self._answered(future, False)

    def answer_in_pass(self, future: asyncio.Future[Any], response: Any) -> None:
        """The parked request's answer (JoinGroup, SyncGroup, a written ConsumerGroupHeartbeat), handed over by the
        group logic that completes it (ANSWERED_IN_PASS): the future's result set here, its done callback taken off
        first (no loop callback), and the answer written now. What waited behind it on this connection is handled
        once that pass is over, in a later callback as the done callback would have: never inside group logic's
        pass."""
        try:
            if self._parked is future:  # registered by `_start`: this connection is its done callback
                future.remove_done_callback(self)
        finally:
            future.set_result(response)  # (done here in any case: the member's future is answered)
        self._answered(future, True)

    def _answered(self, future: asyncio.Future[Any], in_pass: bool) -> None:
        header = self._in_flight
        if self._parked is not future or header is None:
            return  # given up on (cancel_in_flight) after its answer was scheduled: not this request's any more
        self._parked = None
        self._in_flight = None
        try:
            self._server.unparked(self)
            response = self._answer(header, self._to_frame, future)
            if response is not None and header.api_key == _JOIN_GROUP:
                self._leads = join_group.answered_as_leader(response)
            if self._reader.buffered_bytes or self._reading_paused or self._writing_paused or not self._unlinked():
                if in_pass:  # its answer flushed with them, after the pass
                    asyncio.get_running_loop().call_soon(self._frames_after_answer)
                else:
                    self._process_frames()
            else:  # nothing waited behind it, nothing paused, nothing upstream: its answer sent, as the loop would
                self._flush()
        except Exception as exc:
            self._contain("resume", exc)

    def _frames_after_answer(self) -> None:
        """What waited behind an answer given in group logic's pass (`answer_in_pass`)."""
        try:
            if self._open:
                self._process_frames()
        except Exception as exc:
            self._contain("resume", exc)

    def _answer(self, header: RequestHeader, to_frame: _ToFrame, future: asyncio.Future[Any]) -> Any:
        """A request started here, its future done: the frame `to_frame` packs, written (no encoding step;
        nothing once closed: the client went away, Kafka drops it too). The response if one was written."""
        if future.cancelled():
            return None  # as a cancelled handler: no response
        error = future.exception()
        if error is not None:
            self._fail(header, error)
            return None
        response = future.result()
        try:
            frame = to_frame(header, response)
        except Exception as exc:
            self._fail(header, exc)
            return None
        self._write(frame)
        return response

    def _sasl_admits(self, frame: bytes) -> bool:
        """Kafka's SASL sequence on a SASL listener: a request out of it closes the connection (after Kafka's
        answer, where Kafka gives one)."""
        try:
            reply = self._sasl.admit(frame)  # type: ignore[union-attr]
            if reply is None:
                return True
            self._write(reply)  # answered here, as Kafka's broker answers it
        except Refusal as refusal:
            if refusal.reply is None:
                self.abort(refusal.kind, str(refusal))
            else:
                log.warning("event=connection_closed reason=%s peer=%s detail=%s", refusal.kind, self.peer, refusal)
                self._write(refusal.reply)
                self._flush()
                self.close()
        except (ProtocolError, ValueError, LookupError) as exc:
            self.abort("sasl_sequence", f"unreadable SASL request: {exc!r}")
        return False

    def _heartbeat_v4(self, frame: bytes) -> bool:
        """The hottest request without the general decoder and dispatch (same handler call, same answer as
        handlers/heartbeat.py); False when the frame is not in the usual shape (the general path takes it)."""
        answer = self._heartbeat_v4_answer(frame)
        if answer is None:
            return False
        if answer:
            self._write(answer)
        return True

    def _heartbeat_v4_answer(self, frame: bytes) -> bytes | None:
        """The answer to a Heartbeat v4 frame in its usual shape (`_NO_ANSWER` when the handler failed and the
        connection is closed); None when the frame is not in the usual shape."""
        fields = read_heartbeat_v4_request(frame)
        if fields is None:
            return None
        correlation_id, client_id, group_id, generation_id, member_id, group_instance_id = fields
        authorizer = self._server.authorizer
        if authorizer is not None and authorizer.enforcing and not self._ctx.allows(  # type: ignore[union-attr]
                Operation.READ, ResourceType.GROUP, group_id):
            return pack_heartbeat_v4_response(correlation_id, _GROUP_AUTHORIZATION_FAILED)
        try:
            error_code = self._server.coordinator.handle_heartbeat(group_id, generation_id, member_id,
                                                                   group_instance_id)
        except Exception:
            self._fail(RequestHeader(ApiKey.HEARTBEAT, 4, correlation_id, client_id))
            return _NO_ANSWER
        return pack_heartbeat_v4_response(correlation_id, error_code)

    def _steady_consumer_group_heartbeat(self, frame: bytes) -> bool:
        """The steady ConsumerGroupHeartbeat answered from its frame (handlers/consumer_group_heartbeat.py's
        steady_frame: the same answer as its general path); False: the general path takes the frame."""
        try:
            answer = consumer_group_heartbeat.steady_frame(self._ctx, frame)  # type: ignore[arg-type]
        except Exception as exc:  # the frame was read (a header is there): our bug, as a handler's
            _api_key, version, correlation_id = peek_header(frame)
            self._fail(RequestHeader(ApiKey.CONSUMER_GROUP_HEARTBEAT, version, correlation_id, None), exc)
            return True
        if answer is None:
            return False
        self._write(answer)
        return True

    def _served(self, frame: bytes) -> bool:
        """Whether a handler here serves the request's (API, version); if not, it is rejected right away."""
        if len(frame) >= 4:
            api_key, api_version = _API_KEY_AND_VERSION.unpack_from(frame)
            api = SERVED_APIS.get(api_key)
            if api is not None and api.min_version <= api_version <= api.max_version:
                return True
            error: ProtocolError = (UnknownApiKey(f"unknown api_key={api_key}") if api is None else
                                    UnsupportedVersion(f"api_key={api_key} api_version={api_version} is not served"))
            self._reject(frame, error)
            return False
        return True  # too short for a header: the decoder says why

    def _reject(self, frame: bytes, exc: ProtocolError) -> None:
        """Kafka answers only an unsupported ApiVersions version (KIP-511); anything else closes the connection."""
        if isinstance(exc, UnsupportedVersion):
            api_key, version, correlation_id = peek_header(frame)
            if api_key == ApiKey.API_VERSIONS:
                log.info("event=unsupported_api_versions_version peer=%s api_version=%d", self.peer, version)
                self._write(unsupported_version_reply(correlation_id))
                return
        self.abort(type(exc).__name__, str(exc))

    def _drive(self, header: RequestHeader, handler: Coroutine[Any, Any, Any],
               context: contextvars.Context | None = None) -> None:
        # The handler runs in a context of its own, every step alike, as a Task's coroutine does: a context
        # variable it sets (OpenTelemetry's current span) is reset where it was set and never leaks into the
        # connection's later requests. A new request's context starts from the sender's identity.
        if context is None:
            base = self._request_context
            context = base.copy() if base is not None else contextvars.copy_context()
        try:
            awaited = context.run(handler.send, None)
        except StopIteration as done:
            self._respond(header, done.value)
            return
        except asyncio.CancelledError:
            return  # as a cancelled Task: no response
        except Exception as exc:
            self._fail(header, exc)
            return
        self._in_flight = header
        self._server.parked(self)
        if getattr(awaited, "_asyncio_future_blocking", None):
            awaited._asyncio_future_blocking = False
            resume = functools.partial(self._resume, header, handler, context)
            self._parked, self._parked_handler, self._parked_resume = awaited, handler, resume
            awaited.add_done_callback(resume)
        else:  # a bare yield (asyncio.sleep(0)): let a Task carry on
            self._resume(header, handler, context, None)

    def _resume(self, header: RequestHeader, handler: Coroutine[Any, Any, Any], context: contextvars.Context,
                _awaited: object) -> None:
        # The awaited future is done, so the next step returns its result into the handler.
        self._parked = self._parked_handler = self._parked_resume = None
        if header.api_key in _RESUMED_HERE:
            self._resume_here(header, handler, context)
            return
        try:
            self._task = asyncio.get_running_loop().create_task(handler, context=context)
            self._task.add_done_callback(functools.partial(self._on_handler_done, header))
        except Exception as exc:
            self._contain("resume", exc)

    def _resume_here(self, header: RequestHeader, handler: Coroutine[Any, Any, Any],
                     context: contextvars.Context) -> None:
        """The parked member's next step in this callback, no Task: its answer is written in this loop turn, not
        two turns later (a rebalance resumes every member at once)."""
        self._in_flight = None
        try:
            self._server.unparked(self)
            self._drive(header, handler, context)  # answers, or parks again
            if self._in_flight is None:
                self._process_frames()
        except Exception as exc:
            self._contain("resume", exc)

    def _on_handler_done(self, header: RequestHeader, task: asyncio.Task[Any]) -> None:
        self._task = None
        self._in_flight = None
        try:
            self._server.unparked(self)
            if task.cancelled():
                return
            if task.exception() is not None:
                self._fail(header, task.exception())
                return
            self._respond(header, task.result())
            self._process_frames()
        except Exception as exc:
            self._contain("handler_done", exc)

    def _respond(self, header: RequestHeader, body: Any) -> None:
        if not self._open:
            return  # the client went away; Kafka drops the response too
        try:
            frame = encode_response(header, body)
        except Exception:
            self._fail(header)
            return
        self._write(frame)

    def _write(self, frame: bytes) -> None:
        if self._open:
            self.activity += 1
            relaying = self._relaying
            if relaying is not None and relaying.pending:  # relayed responses are still due before this one
                relaying.queue_local(frame)
            else:
                self._outgoing.append(frame)

    def _flush(self) -> None:
        """Send what this round of processing produced; every path that writes ends in _process_frames."""
        outgoing = self._outgoing
        if outgoing:
            # emptied in place, not replaced: a fresh list per read would live until the connection's next
            # request (a heartbeat every few seconds), long enough for the collector to promote and freeze it
            data = outgoing[0] if len(outgoing) == 1 else b"".join(outgoing)
            outgoing.clear()
            if self._open and self._transport is not None:
                self._transport.write(data)
        if self._relaying is not None and self._relaying.pending:
            self._send_pending(self._relaying)

    # ------------------------------------------------------------------------------------------ relaying

    def _route_locally(self, frame: bytes, relaying: RelaySide) -> bool:
        """True for a request handled here; a relayed one is forwarded (or the connection closed) right away."""
        if len(frame) < 8:
            self.abort("CorruptRequest", f"frame of {len(frame)} bytes is shorter than a request header")
            return False
        route = relaying.relay.routes.get(frame[:4])  # (api key, version) advertised: its route in one lookup
        if route is None or route is _RELAYED:
            api_key, api_version = _API_KEY_AND_VERSION.unpack_from(frame)
            if route is None:  # not advertised: the relay's route says why
                try:
                    route = relaying.route(api_key, api_version)
                except ProtocolError as exc:
                    self._reject(frame, exc)  # an ApiVersions version we do not know gets KIP-511's answer
                    return False
        if route is not _RELAYED:
            return True
        sasl = self._sasl
        refused = relaying.forward(frame, api_key, self, fresh=sasl is not None and sasl.on_fresh_link(api_key))
        if refused is None:
            self.activity += 1
        else:
            self.abort(*refused)
        return False

    def _send_pending(self, relaying: RelaySide) -> None:
        """Write the responses at the head of the order that are here, until the client stops taking them."""
        if self._transport is not None:
            self.activity += relaying.send_ready(self._transport, self._can_send, self._sasl)
            if self._sasl is not None and self._sasl.close_reason is not None and self._open:
                log.warning("event=connection_closed reason=sasl_reauthentication_failed peer=%s detail=%s",
                            self.peer, self._sasl.close_reason)
                self.close()  # after the answer just written, as Kafka closes after its failure response

    def _can_send(self) -> bool:
        return not self._writing_paused and self._open

    def _relay_blocked(self) -> bool:
        """The broker is not taking requests, or a SaslAuthenticate awaits its verdict: Kafka's broker reads a
        client's next request only once the authenticate is answered (SaslServerAuthenticator, one receive per
        step), so what the client sent behind it is read after the verdict reached it."""
        relaying = self._relaying
        if relaying is None:
            return False
        sasl = self._sasl
        return relaying.blocked() or (sasl is not None and sasl.awaiting)

    def relay_responses_ready(self) -> None:
        """Called by the upstream link (from its own protocol callbacks) when responses have arrived."""
        try:
            if self._open and self._relaying is not None:
                self._send_pending(self._relaying)
                if not self._relaying.pending:
                    self._process_frames()  # a local response may have been waiting behind them
        except Exception as exc:
            self._contain("relay_responses_ready", exc)

    def relay_blocked_changed(self) -> None:
        try:
            if self._open:
                self._process_frames()
        except Exception as exc:
            self._contain("relay_blocked_changed", exc)

    def relay_failed(self, reason: str, detail: str) -> None:
        """The upstream connection failed: close the client's (clients retry, as after a broker failure). A broker
        that closed after answering everything (a failed SASL exchange: its error, then the close) is followed
        gracefully, so its last answer reaches the client."""
        if reason == "upstream_closed" and self._open and (self._relaying is None or not self._relaying.pending):
            log.info("event=connection_closed reason=%s peer=%s detail=%s", reason, self.peer, detail)
            self.close()
            return
        self.abort(reason, detail)

    def _fail(self, header: RequestHeader, exc: BaseException | None = None) -> None:
        """Our bug, not the peer's: log it with the request, close the connection."""
        if isinstance(exc, UpstreamUnavailable):  # the cluster's outage, not a bug
            self.abort("upstream_unavailable", f"api_key={header.api_key} {exc}")
            return
        log.error("event=handler_failed peer=%s api_key=%d api_version=%d correlation_id=%d",
                  self.peer, header.api_key, header.api_version, header.correlation_id,
                  exc_info=exc if exc is not None else True)
        self.abort("handler_failed", f"api_key={header.api_key}")

    def _contain(self, callback: str, exc: Exception) -> None:
        """The funnel for an exception that would otherwise escape a callback: one log line, connection closed."""
        if isinstance(exc, ProtocolError):  # the peer's fault
            self.abort(type(exc).__name__, f"{exc} (in {callback})")
            return
        log.error("event=connection_failed callback=%s peer=%s error=%r", callback, self.peer, exc, exc_info=exc)
        self.abort("internal_error", f"{type(exc).__name__} in {callback}")

    def _apply_read_limit(self) -> None:
        if not (self._reading_paused or self._writing_paused or self._server.closing):
            relaying = self._relaying
            if self._unlinked():
                # nothing upstream to block it: only the bytes waiting behind a parked or deferred request could
                # pause reading (what follows would decide the same, with more steps: it runs each time a
                # rebalance parks a request)
                if not ((self._in_flight is not None or self._deferred)
                        and self._reader.buffered_bytes >= self._config.max_buffered_bytes):
                    return
            elif relaying is not None and relaying.link is None and self._in_flight is None and not self._deferred:
                return  # the common case: reading, nothing to limit
        if self._transport is None:
            return
        waiting = ((self._in_flight is not None or self._deferred)
                   and self._reader.buffered_bytes >= self._config.max_buffered_bytes)
        should_pause = self._writing_paused or waiting or self._server.closing or self._relay_blocked()
        if should_pause and not self._reading_paused:
            self._transport.pause_reading()
            self._reading_paused = True
        elif not should_pause and self._reading_paused and self._open:
            self._transport.resume_reading()
            self._reading_paused = False

    # ------------------------------------------------------------------------------------------ closing

    def abort(self, reason: str, detail: str = "") -> None:
        """Close this connection at once, with one log line saying why."""
        if not self._open or self._transport is None:
            return
        self._open = False
        log.warning("event=connection_closed reason=%s peer=%s detail=%s", reason, self.peer, detail)
        self._transport.abort()

    def stop_reading(self) -> None:
        self._apply_read_limit()

    def close(self) -> None:
        if self._open and self._transport is not None:
            self._open = False
            self._transport.close()  # flushes what is already written

    def cancel_in_flight(self) -> None:
        """At shutdown: give up on a parked handler (its group has been told to stop)."""
        if self._parked is not None:
            awaited, handler, resume = self._parked, self._parked_handler, self._parked_resume
            self._parked = self._parked_handler = self._parked_resume = None
            awaited.remove_done_callback(self if resume is None else resume)
            ANSWERED_IN_PASS.pop(awaited, None)
            if handler is not None:
                handler.close()
            self._in_flight = None
            self._server.unparked(self)
        if self._task is not None:
            self._task.cancel()
