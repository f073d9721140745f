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

from coordinator.group.observer import GroupObserver
from coordinator.group.runtime import GroupRuntime
from coordinator.timer import SystemTimer
from protocol.error_codes import Errors
from simulator.kafka import SimProducer
from simulator.loop import EPOCH_MS, VirtualClock
from simulator.store import SimulatedStore

if TYPE_CHECKING:
    from simulator.run import Simulation

log = logging.getLogger("simulator")


class Disconnected(Exception):
    """The connection to the coordinator failed or dropped."""


@dataclass(eq=False)
class Pending:
    request_id: int
    api: str
    group_id: str
    member_id: str
    client: str
    arrived_ms: int
    reply: asyncio.Future[Any]
    generation: int | None = None
    task: asyncio.Task[Any] | None = None


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
    def __init__(self, sim: Simulation, number: int) -> None:
        self.sim = sim
        self.number = number
        self.name = f"coordinator-{number}"
        self.alive = True
        self.closing = False  # shutting down: new requests are refused, parked ones get answered
        self.loaded = False
        loop = sim.loop
        self.clock = VirtualClock(loop)
        self.timer = SystemTimer(self.name, self.clock, executor=self._execute)
        config = sim.config
        self.producer = SimProducer(sim.kafka, self.name, config.offsets_commit_timeout_ms, sim.ledger)
        self.store = SimulatedStore(sim.kafka, self.producer, config.offsets_topic_num_partitions,
                                    config.offsets_commit_timeout_ms, self.clock)
        self.runtime = GroupRuntime(config, self.timer, self.store, self.clock, SimObserver(self),
                                    wall_clock=VirtualClock(loop, EPOCH_MS))
        self.runtime.begin_loading()  # before any request can arrive, as app.py does
        self.timer.start()
        self.pending: dict[int, Pending] = {}
        self._abandoned: list[Any] = []  # a dead process's requests and tasks, kept until the run ends
        self._next_request = 0
        self._background = loop.create_task(self._load_then_expire(), name=f"{self.name}-load")
        sim.history.record("instance_start", inst=number)

    # --- lifecycle --------------------------------------------------------------------------------------------
    def _execute(self, run: Any) -> None:
        """The timer's executor: expired operations run on the loop, and never once the process is dead."""
        self.sim.loop.call_soon(self._run_if_alive, run)

    def _run_if_alive(self, run: Any) -> None:
        if self.alive:
            run()

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
        self.sim.checkers.after_load(self)
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
        self._background.cancel()
        self.sim.loop.create_task(self.timer.close())
        self.sim.history.record("crash", inst=self.number, pending=len(self.pending))
        for pending in list(self.pending.values()):
            if not pending.reply.done():
                pending.reply.set_exception(Disconnected(f"{self.name} crashed"))
        self._abandoned.extend(self.pending.values())
        self.pending.clear()

    async def shut_down(self) -> None:
        """A clean stop (SIGTERM): the runtime answers what is parked (NOT_COORDINATOR), its writes in flight end,
        the store flushes; then the process exits and its connections close."""
        self.closing = True
        self.sim.history.record("shutdown", inst=self.number, pending=len(self.pending))
        self._background.cancel()
        await self.runtime.shutdown()
        await asyncio.sleep(0.1)  # the answers leave
        if not self.alive:  # killed while it shut down
            return
        for pending in self.pending.values():
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
                          getattr(request, "generation_id", None))
        self.pending[request_id] = pending
        self.sim.history.record("srv_in", inst=self.number, rid=request_id, api=api, client=client,
                                member=member_id)
        task = loop.create_task(getattr(self.runtime, api)(request))
        pending.task = task
        task.add_done_callback(lambda done: self._answered(pending, done))
        return reply

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
        self.sim.history.record("srv_out", inst=self.number, rid=pending.request_id, api=pending.api,
                                client=pending.client, error=_error_summary(response))
        self.sim.checkers.answered(self, pending, response)
        if not pending.reply.done():
            pending.reply.set_result(response)


def _error_summary(response: Any) -> str:
    error = getattr(response, "error_code", None)
    if isinstance(error, Errors):
        return error.name
    topics = getattr(response, "topics", None)
    if topics:
        return ",".join(sorted({p.error_code.name for t in topics for p in t.partitions}))
    results = getattr(response, "results", None)  # DeleteGroups
    if results:
        return ",".join(sorted({r.error_code.name for r in results}))
    return "NONE"
