"""One coordinator process in the simulation, and the network between clients and it.

`CoordinatorInstance` assembles what coordinator/app.py assembles for one instance — a SystemTimer on the
(virtual) clock, the store, a GroupRuntime whose partitions are LOADING before any request is served, then a
background load retried with back-off and Kafka's offset-expiry task — and nothing else. A crash is abrupt: the
producer dies (what is on the wire lands or not), the timer stops firing, nothing of the process runs again,
and every client connected to it sees its connection drop. A restart is a new instance (`number` + 1) that
reloads its state from the simulated log.

The network carries a request to the live instance and its answer back, each way after a seeded latency; a
client that sends to a crashed or absent coordinator sees a refused connection after a while.
"""
from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from coordinator.cluster.directory import OwnerMapDirectory
from coordinator.cluster.identity import InstanceEndpoint, client_id_for, default_node_id
from coordinator.cluster.owner_map import OwnerMap
from coordinator.cluster.ownership import GroupAssignmentReader, Ownership
from coordinator.group.api import HeartbeatResponse
from coordinator.group.modern.observing import Fenced
from coordinator.group.observer import GroupObserver
from coordinator.group.runtime import GroupRuntime
from coordinator.group.status import ShardStatus
from coordinator.server.context import ConnectionContext, Node
from coordinator.server.handlers import txn_offset_commit
from coordinator.timer import SystemTimer
from protocol.codec import RequestHeader
from protocol.consumer_protocol import decode_assignment
from protocol.error_codes import Errors
from simulator.cluster import SimMembership, describe_fresh, guard_pulse, refresh_owner_map
from simulator.kafka import SimProducer
from simulator.loop import EPOCH_MS, VirtualClock
from simulator.store import SimTails, SimulatedStore

if TYPE_CHECKING:
    from simulator.run import Simulation

log = logging.getLogger("simulator")


class Disconnected(Exception):
    """The connection to the coordinator failed or dropped."""


@dataclass(eq=False)
class Route:
    """A client's cached coordinator (FindCoordinator's answer), forgotten when it stops being one."""

    instance: CoordinatorInstance | None = None


def not_coordinator(response: Any) -> bool:
    """Whether the answer sends the client to find its coordinator again."""
    summary = _error_summary(response)
    return "NOT_COORDINATOR" in summary or "COORDINATOR_NOT_AVAILABLE" in summary


@dataclass(eq=False)
class Pending:
    request_id: int
    api: str
    group_id: str
    member_id: str
    client: str
    arrived_ms: int
    reply: asyncio.Future[Any]
    generation: int | None = None  # a ConsumerGroupHeartbeat's: its member epoch
    task: asyncio.Task[Any] | None = None
    taken_in_alone: bool = False  # read while this instance alone served the group's partition (single_writer)


class SimObserver(GroupObserver):
    """The group events the checkers need, into the history, stamped with the instance."""

    def __init__(self, instance: CoordinatorInstance) -> None:
        self.instance = instance
        self.history = instance.sim.history

    def _record(self, kind: str, **fields: Any) -> None:
        if self.instance.alive:  # a crashed process tells nobody anything
            self.history.record(kind, inst=self.instance.number, **fields)

    def on_state_change(self, group_id: str, old_state: str, new_state: str, generation: int) -> None:
        self._record("state", group=group_id, old=old_state, new=new_state,
                            gen=generation)

    def on_group_converted(self, group_id: str, protocol: str, generation: int, state: str) -> None:
        self._record("converted", group=group_id, to=protocol, gen=generation, state=state)
        runtime = self.instance.runtime if self.instance.alive else None
        classic = None if runtime is None else runtime.shard_for(group_id).groups.get(group_id)
        if protocol == "classic" and classic is not None:
            self.instance.sim.checkers.made_classic(group_id, {
                member_id: decode_assignment(member.assignment)[1].partitions if member.assignment else ()
                for member_id, member in classic.members.items()})

    def on_group_replaced(self, group_id: str, protocol: str) -> None:
        self._record("replaced", group=group_id, to=protocol)

    def on_offsets_expired(self, group_id: str, partition_count: int) -> None:
        self._maybe_retired(group_id)

    def on_offsets_deleted(self, group_id: str, partition_count: int) -> None:
        self._maybe_retired(group_id)

    def _maybe_retired(self, group_id: str) -> None:
        """Offsets removed (expiry, OffsetDelete) took an Empty classic group's last ones and it was retired (Dead,
        its tombstone written: offsets.py `_cleanup_group`, Kafka's cleanupGroupMetadata): the group id is deleted,
        as by DeleteGroups, and a consumer group made of it later starts a new life for member_epoch (upgrade seed
        2743: a member of a downgraded group, told epoch 4, rejoined the consumer group made after the classic
        group's retirement and was told epoch 2)."""
        runtime = self.instance.runtime if self.instance.alive else None
        if runtime is None:
            return
        shard = runtime.shard_for(group_id)
        if group_id not in shard.groups and group_id not in shard.consumer_groups:
            self.instance.sim.checkers.group_deleted(group_id)

    def on_group_deleted(self, group_id: str, partition_count: int) -> None:
        self.instance.sim.checkers.group_deleted(group_id)  # (no event: the histories stay as they were)

    def on_member_session_expired(self, group_id: str, member_id: str, client_id: str, client_host: str,
                                  session_timeout_ms: int, since_last_heartbeat_ms: int) -> None:
        self._record("expired", group=group_id, member=member_id,
                            session_ms=session_timeout_ms)

    def on_member_failed(self, group_id: str, member_id: str, group_instance_id: str | None, reason: str) -> None:
        self._record("member_failed", group=group_id, member=member_id,
                            reason=reason)

    def on_join_completed(self, group_id: str, generation: int, protocol_name: str | None, leader_id: str | None,
                          member_count: int) -> None:
        self._record("join_done", group=group_id, gen=generation,
                            leader=leader_id, members=member_count)


class CoordinatorInstance:
    """One coordinator process. `slot` is its place among the instances of a multi-instance run (its instance id,
    node and endpoint survive restarts); None: the run's only instance, owning every partition."""

    def __init__(self, sim: Simulation, number: int, slot: int | None = None) -> None:
        self.sim = sim
        self.number = number
        self.slot = slot
        self.name = f"coordinator-{number}"
        self.process = f"{self.name}-state"  # the client.id of its state producers
        self.alive = True
        self.closing = False  # shutting down: new requests are refused, parked ones get answered
        self.loaded = False
        self.paused_until_ms = 0
        self._resumed: asyncio.Future[None] | None = None
        self._held: list[Any] = []  # timer expirations due while paused
        loop = sim.loop
        self.clock = VirtualClock(loop)
        self.timer = SystemTimer(self.name, self.clock, executor=self._execute)
        config = sim.config
        self.producer = SimProducer(sim.kafka, self.name, config.offsets_commit_timeout_ms, sim.ledger)
        # the partitions' transaction tails, when the run has clients' transactions to follow
        self.tails = (None if sim.relay is None
                      else SimTails(sim.kafka, "__group_state", sim.rng_txn, self.running))
        self.store = SimulatedStore(sim.kafka, self.producer, config.offsets_topic_num_partitions,
                                    config.offsets_commit_timeout_ms, self.clock, client_id=self.name,
                                    fencing=slot is not None, tails=self.tails)
        if self.tails is not None and self.store.topic is not None:
            self.tails.topic = self.store.topic
        self.runtime = GroupRuntime(config, self.timer, self.store, self.clock, SimObserver(self),
                                    wall_clock=VirtualClock(loop, EPOCH_MS))
        self._observe_consumer_groups()
        self.pending: dict[int, Pending] = {}
        self._abandoned: list[Any] = []  # a dead process's requests and tasks, kept until the run ends
        self._next_request = 0
        self.ownership: Ownership | None = None
        self.directory: OwnerMapDirectory | None = None
        self.membership: SimMembership | None = None
        self.service: Any = self.runtime
        self._tasks: list[asyncio.Task[Any]] = []
        # what the server's TxnOffsetCommit handler gets: the service it routes through, the relay to Kafka
        relay = None if sim.relay is None else PausedRelay(sim.relay, self)
        # (a Node of its own: a compiled ConnectionContext checks the type; the handler does not read it)
        self.context = ConnectionContext(Node(number, "simulated", 9092, "simulated"), self.service, "/10.0.0.1",
                                         "simulated", relay=relay)  # type: ignore[arg-type]
        sim.processes[self.process] = sim.processes[self.name] = self
        if slot is None:
            self.runtime.begin_loading()  # before any request can arrive, as app.py does
            self.timer.start()
            self._background = loop.create_task(self._load_then_expire(), name=f"{self.name}-load")
        else:
            for shard in self.runtime.shards:  # NOT_COORDINATOR until Kafka assigns a partition (app.py)
                shard.status = ShardStatus.UNOWNED
            self.timer.start()
            self._background = loop.create_task(self._own_then_expire(slot), name=f"{self.name}-own")
        sim.history.record("instance_start", inst=number, slot=slot)

    def _observe_consumer_groups(self) -> None:
        """The cluster's topics for the consumer groups, and what the session checker needs (`ServiceChecks`)."""
        service = self.runtime.consumer_groups
        service.topics = self.sim.topics
        service.checks = _SessionChecks(self)

    # --- lifecycle --------------------------------------------------------------------------------------------
    def _execute(self, run: Any) -> None:
        """The timer's executor: expired operations run on the loop, and never once the process is dead."""
        self.sim.loop.call_soon(self._run_if_alive, run)

    def _run_if_alive(self, run: Any) -> None:
        if not self.alive:
            return
        if self.paused:
            self._held.append(run)
            return
        run()

    # --- a paused process (SIGSTOP, a VM freeze) --------------------------------------------------------------
    @property
    def paused(self) -> bool:
        return self._resumed is not None

    def pause(self, duration_ms: int) -> None:
        if self.paused or not self.alive:
            return
        self._resumed = self.sim.loop.create_future()
        self.sim.history.record("paused", inst=self.number, ms=duration_ms)
        self.sim.loop.call_later(duration_ms / 1000, self._wake)

    def _wake(self) -> None:
        resumed, self._resumed = self._resumed, None
        if not self.alive or resumed is None:
            return
        self.sim.history.record("woke", inst=self.number)
        if self.ownership is not None:  # the watcher thread's pulse and the loop's tick come first
            self.ownership.guard.pulse()
            self.ownership.guard.check()
        held, self._held = self._held, []
        for run in held:
            run()
        resumed.set_result(None)

    async def running(self) -> None:
        """Returns once the process is not paused (at once if it runs)."""
        while self._resumed is not None:
            await asyncio.shield(self._resumed)

    # --- several instances: the partitions Kafka gives this one -----------------------------------------------
    async def _own_then_expire(self, slot: int) -> None:
        sim = self.sim
        instance_id = f"instance{slot}"
        me = InstanceEndpoint(instance_id, default_node_id(instance_id), f"10.1.0.{slot + 1}", 9092)
        self.endpoint = me
        owner_map = OwnerMap("simulated", sim.instances_group_id, "state", self.runtime.num_partitions, me)
        self.directory = OwnerMapDirectory(self.runtime.num_partitions, "simulated", owner_map)
        ownership = self.ownership = Ownership(
            _Loads(self), instance_id=instance_id, group_id=sim.instances_group_id,  # type: ignore[arg-type]
            topic="state",
            session_timeout_ms=sim.instances_group.session_ms, clock=self.clock, gc_after_moves=False,
            guard_ticks=False)
        self.service = self.context.coordinator = _Service(ownership.service)
        self.store.on_fenced = ownership.on_fenced

        def owned(partitions: set[int]) -> None:
            owner_map.set_own(partitions)

        ownership.on_owned = owned
        self.membership = SimMembership(self, ownership, client_id_for(me))
        loop = sim.loop
        self._tasks = [loop.create_task(guard_pulse(self, ownership)),
                       loop.create_task(refresh_owner_map(self, owner_map))]
        # SimMembership has Membership's surface, on the simulated instances group
        await ownership.start(self.membership,  # type: ignore[arg-type]
                              GroupAssignmentReader(lambda: describe_fresh(self)))
        await ownership.settled.wait()
        self.loaded = True
        interval_s = sim.config.offsets_retention_check_interval_ms / 1000
        while True:
            await self.running()
            expired = await self.runtime.expire_offsets()
            if expired:
                sim.history.record("offsets_expired", inst=self.number, count=expired)
            await asyncio.sleep(interval_s)

    async def _load_then_expire(self) -> None:
        retry_s = 1.0
        while True:
            try:
                groups = await self.runtime.load()
                break
            except Exception as exc:  # broker unreachable: LOAD_IN_PROGRESS meanwhile, try again (app.py)
                self.sim.history.record("load_failed", inst=self.number, error=type(exc).__name__)
                await asyncio.sleep(retry_s)
                retry_s = min(retry_s * 2, 30.0)
        self.loaded = True
        self.sim.history.record("loaded", inst=self.number, groups=groups)
        self.sim.checkers.after_load(self, None)
        interval_s = self.sim.config.offsets_retention_check_interval_ms / 1000
        while True:
            expired = await self.runtime.expire_offsets()
            if expired:
                self.sim.history.record("offsets_expired", inst=self.number, count=expired)
            await asyncio.sleep(interval_s)

    def crash(self) -> None:
        self.sim.checkers.before_crash(self)
        self.alive = False
        self.producer.kill()
        if self.tails is not None:
            self.tails.kill()
        self.sim.ledger.crashed(self.name)
        self._background.cancel()
        for task in self._tasks:
            task.cancel()
        if self.membership is not None:
            self.membership.kill()
        self.sim.loop.create_task(self.timer.close())
        self.sim.history.record("crash", inst=self.number, pending=len(self.pending))
        for pending in list(self.pending.values()):
            if not pending.reply.done():
                pending.reply.set_exception(Disconnected(f"{self.name} crashed"))
        self._abandoned.extend(self.pending.values())
        self.pending.clear()

    async def shut_down(self) -> None:
        """A clean stop (SIGTERM): the runtime answers what is parked (NOT_COORDINATOR), its writes in flight end,
        the store flushes; then the process exits and its connections close.

        A paused process (SIGSTOP, a frozen VM) runs no code: the signal stays pending until it runs again, and only
        then does it shut down — after reading what reached it while it was stopped (those requests were queued on
        its wake before the signal), so they are read, and parked ones answered, like any other."""
        self.closing = True
        self.sim.history.record("shutdown", inst=self.number, pending=len(self.pending))
        await self.running()
        if not self.alive:  # crashed while stopped
            return
        self._background.cancel()
        if self.ownership is not None:  # revoke (unload) every partition, then leave the instances group
            await self.ownership.close()
            for task in self._tasks:
                task.cancel()
        await self.runtime.shutdown()
        await asyncio.sleep(0.1)  # the answers leave
        if not self.alive:  # killed while it shut down
            return
        for pending in self.pending.values():
            if pending.api == "txn_offset_commit":  # not parked: its Produce is on its way (the server drains it)
                continue
            self.sim.checkers.violation("parked_answered", f"{pending.api} from {pending.client} was still "
                                                           f"unanswered after the runtime shut down")
        self.sim.checkers.before_crash(self)
        await self.store.close()
        await self.timer.close()
        self.alive = False
        for pending in list(self.pending.values()):
            if not pending.reply.done():
                pending.reply.set_exception(Disconnected(f"{self.name} exited"))
        self._abandoned.extend(self.pending.values())
        self.pending.clear()
        self.sim.history.record("exited", inst=self.number)

    # --- requests ---------------------------------------------------------------------------------------------
    def serve(self, api: str, request: Any, client: str, member_id: str) -> asyncio.Future[Any]:
        loop = self.sim.loop
        reply: asyncio.Future[Any] = loop.create_future()
        if self.closing:
            reply.set_exception(Disconnected(f"{self.name} is shutting down"))
            return reply
        request_id = self._next_request
        self._next_request += 1
        group_id = getattr(request, "group_id", "")
        pending = Pending(request_id, api, group_id, member_id, client, self.sim.now_ms(), reply,
                          getattr(request, "generation_id", getattr(request, "member_epoch", None)))
        self.pending[request_id] = pending
        self.sim.history.record("srv_in", inst=self.number, rid=request_id, api=api, client=client,
                                member=member_id)
        task = loop.create_task(self._handle(api, request, pending))
        pending.task = task
        task.add_done_callback(lambda done: self._answered(pending, done))
        return reply

    async def _handle(self, api: str, request: Any, pending: Pending) -> Any:
        await self.running()  # a paused process reads nothing; what it held is read when it wakes
        self.sim.checkers.taken_in(self, pending)
        if api == "txn_offset_commit":  # the server's handler itself: it appends through the relay
            header = RequestHeader(txn_offset_commit.API_KEY, request.__version__, 0, None)
            return await txn_offset_commit.handle(self.context, header, request)
        return await getattr(self.service, api)(request)

    def _answered(self, pending: Pending, task: asyncio.Task[Any]) -> None:
        if not self.alive:
            return
        self.pending.pop(pending.request_id, None)
        if task.cancelled() or task.exception() is not None:
            detail = "cancelled" if task.cancelled() else repr(task.exception())
            self.sim.checkers.violation("request_raised", f"{pending.api} from {pending.client} ended with "
                                                          f"{detail} instead of an answer")
            if not pending.reply.done():
                pending.reply.set_exception(Disconnected("the coordinator closed the connection"))
            return
        response = task.result()
        summary = _error_summary(response)
        self.sim.history.record("srv_out", inst=self.number, rid=pending.request_id, api=pending.api,
                                client=pending.client, error=summary)
        self.sim.checkers.answered(self, pending, response, summary)
        if not pending.reply.done():
            pending.reply.set_result(response)


class _SessionChecks:
    """What the checkers need from the consumer groups' service (coordinator/group/modern/service.py
    `ServiceChecks`): when a member's session restarts (a heartbeat handled, a load) and when one runs out."""

    def __init__(self, instance: CoordinatorInstance) -> None:
        self.instance = instance
        self.checkers = instance.sim.checkers
        self.session_timeout_ms = instance.sim.config.group_consumer_session_timeout_ms

    def heartbeat_answered(self, request: Any, answer: Any) -> None:
        instance = self.instance
        if isinstance(answer, asyncio.Future):  # answered with its batch's target; its session restarted now
            if request.member_id and instance.alive:
                self.checkers.consumer_session_restarted(instance.name, request.group_id, [request.member_id])
        elif answer.error == Errors.NONE and request.member_epoch >= 0 and instance.alive:
            self.checkers.consumer_session_restarted(instance.name, request.group_id, [answer.member_id])

    def loaded(self, shard: Any) -> None:
        for group_id, group in shard.consumer_groups.items():
            self.checkers.consumer_session_restarted(self.instance.name, group_id, list(group.members))

    def fencing(self, group_id: str, member_id: str, at_epoch: int | None, reason: Fenced,
                kind: str | None) -> None:
        service = self.instance.runtime.consumer_groups
        shard = service.shard_for(group_id)
        group = shard.consumer_groups.get(group_id)
        member = None if group is None else group.members.get(member_id)
        if (kind is None and at_epoch is None and member is not None and member.classic is None
                and shard.status is ShardStatus.ACTIVE):
            self.checkers.consumer_session_expired(self.instance.name, group_id, member_id, self.session_timeout_ms)

    def classic_synced(self, group: Any, response: Any) -> None:
        self.checkers.synced_in_consumer_group(response, group)  # judged as its answer, whenever that goes out


class _Loads:
    """The runtime as the instance's Ownership sees it (coordinator/cluster/ownership.py): each load it makes is
    followed by the checkers' look at what was loaded, as soon as the load returns."""

    def __init__(self, instance: CoordinatorInstance) -> None:
        self._instance = instance
        self._runtime = instance.runtime

    def __getattr__(self, name: str) -> Any:
        return getattr(self._runtime, name)

    async def load(self, partitions: Any = None) -> int:
        count = await self._runtime.load(partitions)
        if self._instance.alive:
            self._instance.sim.checkers.after_load(self._instance, set(partitions))
        return count


class _Service:
    """The guarded service (coordinator/cluster/ownership.py GuardedService, the server's entry points) with the
    runtime's typed heartbeat."""

    def __init__(self, service: Any) -> None:
        self._service = service

    def __getattr__(self, api: str) -> Any:
        return getattr(self._service, api)

    async def heartbeat(self, request: Any) -> HeartbeatResponse:
        return HeartbeatResponse(self._service.handle_heartbeat(request.group_id, request.generation_id,
                                                                request.member_id, request.group_instance_id))


def _error_summary(response: Any) -> str:
    error = getattr(response, "error_code", getattr(response, "error", None))
    if isinstance(error, Errors):
        return error.name
    topics = getattr(response, "topics", None)
    if topics:
        return ",".join(sorted({p.error_code.name.upper() for t in topics for p in t.partitions}))  # kio: lower
    results = getattr(response, "results", None)  # DeleteGroups
    if results:
        return ",".join(sorted({r.error_code.name for r in results}))
    return "NONE"


class PausedRelay:
    """The relay as one coordinator process sees it: an answer that comes while the process is paused (SIGSTOP)
    is read once it runs again."""

    def __init__(self, relay: Any, process: CoordinatorInstance) -> None:
        self.relay, self.process = relay, process
        self.cluster = self

    async def missing(self, partitions: Any) -> set[tuple[str, int]]:
        return await self.relay.missing(partitions)

    async def request(self, body: Any) -> Any:
        try:
            return await self.relay.request(body)
        finally:
            await self.process.running()

    async def request_to(self, node_id: int, body: Any, *, undecoded: bool = False) -> Any:
        try:
            return await self.relay.request_to(node_id, body, undecoded=undecoded)
        finally:
            await self.process.running()
