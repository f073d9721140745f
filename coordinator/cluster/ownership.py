"""Ownership: which state-topic partitions this instance serves, kept in step with what Kafka decides.

Driven by the membership consumer (membership.py), everything here runs on the event loop:

    assigned  → runtime.load(partitions): the store fences each partition (its transactional producer's
                init_transactions aborts and fences the previous owner), reads it to its end, then it is served
    revoked   → runtime.unload(partitions): parked requests get NOT_COORDINATOR, groups dropped, the store stops
    lost        writing; the membership thread waits for this before Kafka may give the partitions to another
    fenced    → (the store found another owner writing) out of service at once, before the consumer even learns
                it; then DescribeGroups decides: still ours → fenced again by us, read again and served; else given up

Transitions run one at a time, in the order Kafka sent them; a lost or fenced partition stops being served at once,
without waiting its turn (its groups then go a slice per loop turn: `_stop_serving`). A load whose partitions are
all given up (revoked or lost) while it runs is stopped, as is the one running when the instance shuts down
(`close`), and a shutting-down instance starts no load: an unfinished load would go on initialising its partitions'
producers (bumping their epochs) and then serve them, though Kafka may already have handed them on (a lost
partition; or one of a shutting-down instance, whose membership consumer stops heartbeating once its close() begins,
so a long unload can outlast its session) — the new owner's producers fenced by a former owner. Kafka stops its
loads the same way (GroupMetadataManager's load loop ends when the coordinator shuts down; TransactionStateManager's
also when the partition emigrates).

The zombie guard. A process paused past its session (SIGSTOP, a VM freeze, a long collection) has lost its
partitions without knowing it: Kafka moved them, and the first requests it reads after waking up were maybe
meant for it but are no longer its to answer. So every request first checks a monotonic deadline, which a
watcher thread pushes forward four times per stall threshold (a third of the instance session timeout). A request
(or the loop's own check) that finds the deadline passed knows the process did not run for that long (a loop that
is only busy does not count: the thread keeps pulsing, as the membership consumer keeps heartbeating): the
instance drops the groups of every partition it serves (NOT_COORDINATOR, clients rediscover; no session or
rebalance timer of theirs runs on a state that may be another instance's by now) until DescribeGroups of the
instances group shows our member id still holding them; those it holds are then read again from the state topic
and served. The check costs one clock read and one comparison per request.
"""
from __future__ import annotations

import asyncio
import gc
import logging
import threading
from collections.abc import Awaitable, Callable, Collection
from typing import TYPE_CHECKING, Any

from coordinator.cluster.membership import Membership
from coordinator.group.status import ShardStatus
from coordinator.timer import Clock
from protocol.error_codes import Errors

if TYPE_CHECKING:
    from coordinator.cluster.owner_map import Described
    from coordinator.group import api
    from coordinator.group.runtime import GroupRuntime

log = logging.getLogger("coordinator.cluster")

_ACTIVE = ShardStatus.ACTIVE
_CONFIRM_RETRY_MS = 200
_LOAD_RETRY_MAX_S = 30.0


class ZombieGuard:
    """The stall detector. `pulse()` proves the process runs: in service it is called by a watcher thread of
    its own, not by the event loop, so a loop that is merely busy (forming 100k groups on a loaded machine) is
    not taken for a paused process; only a pause of the whole process (SIGSTOP, a VM freeze) or a machine that
    gives it no CPU at all stops the pulse, and those are what can cost us the instances group membership (the
    membership consumer's threads stop with it). A pulse keeps `deadline_ms` ahead; a pulse that finds its own
    gap too long, or a request or loop check (`check()`) that finds the deadline passed, reports a stall through
    `on_stall` (on the loop) and keeps reporting until `resume()`."""

    __slots__ = ("now_ms", "stall_ms", "deadline_ms", "suspended", "stalls", "_last_pulse_ms", "_pending_ms",
                 "_lock", "_on_stall")

    def __init__(self, clock: Clock, stall_ms: int, on_stall: Callable[[int], None]) -> None:
        self.now_ms = clock.now_ms
        self.stall_ms = stall_ms
        self._on_stall = on_stall
        self._lock = threading.Lock()  # pulse (watcher thread) against expired/resume (loop)
        self._last_pulse_ms = self.now_ms()
        self._pending_ms = 0  # a gap the pulse saw, not yet reported on the loop
        self.deadline_ms = self._last_pulse_ms + stall_ms
        self.suspended = False
        self.stalls = 0  # stalls seen so far (a confirmation must not span one)

    def pulse(self) -> None:
        """Any thread: the process ran just now."""
        now_ms = self.now_ms()
        with self._lock:
            gap_ms = now_ms - self._last_pulse_ms
            self._last_pulse_ms = now_ms
            if gap_ms >= self.stall_ms:
                self._pending_ms = max(self._pending_ms, gap_ms)
                self.deadline_ms = -1  # the next request or loop check reports it
            elif not self.suspended and not self._pending_ms:
                self.deadline_ms = now_ms + self.stall_ms

    def check(self) -> None:
        """The per-request check (kept inline in `GuardedService.handle_heartbeat` too)."""
        if self.now_ms() >= self.deadline_ms:
            self.expired()

    def tick(self) -> None:
        """A pulse and a check in one (tests on a manual clock, where one thread plays both)."""
        self.pulse()
        self.check()

    def expired(self) -> None:
        now_ms = self.now_ms()
        with self._lock:
            pending_ms, self._pending_ms = self._pending_ms, 0
            stalled_ms = pending_ms or now_ms - self._last_pulse_ms
            new = not self.suspended or pending_ms > 0 or stalled_ms >= self.stall_ms
            if new:  # a new stall (or one more while suspended: any confirmation under way is stale)
                self.suspended = True
                self.stalls += 1
                self.deadline_ms = -1  # every request comes here until resumed
                self._last_pulse_ms = now_ms
        self._on_stall(stalled_ms)

    def resume(self) -> None:
        with self._lock:
            self.suspended = False
            self._pending_ms = 0
            self._last_pulse_ms = self.now_ms()
            self.deadline_ms = self._last_pulse_ms + self.stall_ms


class GuardedService:
    """The runtime's request entry points (server/context.py GroupService), each behind the zombie guard."""

    def __init__(self, runtime: GroupRuntime, guard: ZombieGuard) -> None:
        self._runtime = runtime
        self._guard = guard
        self._now_ms = guard.now_ms
        self._heartbeat = runtime.handle_heartbeat

    def handle_heartbeat(self, group_id: str, generation_id: int, member_id: str,
                         group_instance_id: str | None = None) -> Errors:
        if self._now_ms() >= self._guard.deadline_ms:  # the hot path: one clock read, one comparison
            self._guard.expired()
        return self._heartbeat(group_id, generation_id, member_id, group_instance_id)

    def _checked(self) -> GroupRuntime:
        if self._now_ms() >= self._guard.deadline_ms:
            self._guard.expired()
        return self._runtime

    def state_partition(self, group_id: str) -> tuple[str, int] | None:
        return self._runtime.state_partition(group_id)

    def shard_for(self, group_id: str | None) -> Any:  # TxnOffsetCommit works on the shard itself
        return self._checked().shard_for(group_id)

    # each returns the runtime's coroutine (no extra frame per request)
    def join_group(self, request: api.JoinGroupRequest) -> Any:
        return self._checked().join_group(request)

    def sync_group(self, request: api.SyncGroupRequest) -> Any:
        return self._checked().sync_group(request)

    def start_join_group(self, request: api.JoinGroupRequest) -> Any:
        return self._checked().start_join_group(request)

    def start_sync_group(self, request: api.SyncGroupRequest) -> Any:
        return self._checked().start_sync_group(request)

    def leave_group(self, request: api.LeaveGroupRequest) -> Any:
        return self._checked().leave_group(request)

    def commit_offsets(self, request: api.OffsetCommitRequest) -> Any:
        return self._checked().commit_offsets(request)

    def fetch_offsets(self, request: api.OffsetFetchRequest) -> Any:
        return self._checked().fetch_offsets(request)

    def describe_groups(self, request: api.DescribeGroupsRequest) -> Any:
        return self._checked().describe_groups(request)

    def list_groups(self, request: api.ListGroupsRequest) -> Any:
        return self._checked().list_groups(request)

    def delete_groups(self, request: api.DeleteGroupsRequest) -> Any:
        return self._checked().delete_groups(request)

    def delete_offsets(self, request: api.OffsetDeleteRequest) -> Any:
        return self._checked().delete_offsets(request)

    def consumer_group_heartbeat(self, request: Any) -> Any:
        return self._checked().consumer_group_heartbeat(request)

    def start_consumer_group_heartbeat(self, request: Any) -> Any:
        return self._checked().start_consumer_group_heartbeat(request)

    def steady_consumer_group_heartbeat(self, request: Any) -> Any:
        return self._checked().steady_consumer_group_heartbeat(request)

    def steady_member(self, group_id: str, member_id: str) -> Any:
        return self._checked().steady_member(group_id, member_id)

    def steady_again(self, steady: Any) -> bool:
        return self._checked().steady_again(steady)

    def consumer_group_describe(self, group_ids: list[str]) -> Any:
        return self._checked().consumer_group_describe(group_ids)


class Ownership:
    """Made before the listener opens (its `service` is what the server calls); `await start(membership,
    read_assignment)` once the listener is open (our endpoint is in the membership's client.id); `await close()`
    gives every partition back (unloaded first) and leaves the instances group.

    The membership must call `on_assigned`, `on_revoked` and `on_lost`; `read_assignment(membership)` returns our
    partitions as the instances group's coordinator describes them now (None: not known yet, e.g. the group is
    rebalancing; GroupAssignmentReader); `on_owned(partitions)` hears every change of the set we own (the owner
    map)."""

    def __init__(self, runtime: GroupRuntime, *, instance_id: str, group_id: str, topic: str,
                 session_timeout_ms: int, clock: Clock, on_owned: Callable[[set[int]], None] | None = None,
                 gc_after_moves: bool = True, guard_ticks: bool = True) -> None:
        self.runtime = runtime
        self.instance_id = instance_id
        self.group_id = group_id
        self.topic = topic
        self.clock = clock
        self.owned: set[int] = set()  # assigned by Kafka and not given up since (loading, served or suspended)
        self.loads = 0
        self.on_owned = on_owned
        self._gc_after_moves = gc_after_moves
        self.guard = ZombieGuard(clock, max(1, session_timeout_ms // 3), self._on_stall)
        self.guard.deadline_ms = 1 << 62  # nothing owned before start(), nothing to guard
        self.service = GuardedService(runtime, self.guard)
        self.membership: Membership | None = None
        self._read_assignment: Callable[[Membership], Awaitable[set[int] | None]] | None = None
        self._queue: asyncio.Queue[tuple[str, set[int], asyncio.Future[None]]] = asyncio.Queue()
        self._suspended: set[int] = set()  # served partitions the guard took out of service
        self._tasks: list[asyncio.Task[None]] = []
        self._confirming: asyncio.Task[None] | None = None
        self._fenced: set[int] = set()  # owned partitions whose writes were fenced, waiting for Kafka's word
        self._confirming_fences: asyncio.Task[None] | None = None
        self._tick_handle: asyncio.TimerHandle | None = None
        self._pulse_stop = threading.Event()
        self._pulse_thread: threading.Thread | None = None
        self._tick_s = self.guard.stall_ms / 4000 if guard_ticks else None  # None: tests call guard.tick()
        self.settled = asyncio.Event()  # the first assignment (maybe empty) is loaded
        self.closing = False  # close() has begun: nothing more is loaded
        self._loading: tuple[set[int], asyncio.Task[None]] | None = None  # the load running now, and its partitions

    def serving(self, partition: int) -> bool:
        return partition in self.owned and self.runtime.shards[partition].status is _ACTIVE

    async def start(self, membership: Membership,
                    read_assignment: Callable[[Membership], Awaitable[set[int] | None]]) -> None:
        self.membership = membership
        self._read_assignment = read_assignment
        self.guard.resume()
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._transitions(), name="ownership-transitions")]
        if self._tick_s is not None:
            self._pulse_thread = threading.Thread(target=self._pulse, args=(self._tick_s,), daemon=True,
                                                  name=f"ownership-pulse-{self.instance_id}")
            self._pulse_thread.start()
            self._tick()
        membership.start()

    async def close(self) -> None:
        """Revoke and leave (every partition unloaded before Kafka hands it on), then stop. From the first line on
        nothing more is loaded: the load running now is stopped (its partitions are given back unloaded, as the
        others) and none starts, so a shutting-down instance neither initialises a partition's producer again nor
        serves it (its membership's heartbeats stop as the consumer's close() begins: a slow unload may outlast its
        session, and the partitions go to another instance before it has left)."""
        self.closing = True
        self._stop_load("shutting_down")
        if self.membership is not None:
            await self.membership.close()
        if self._tick_handle is not None:
            self._tick_handle.cancel()
        self._pulse_stop.set()
        if self._pulse_thread is not None:
            await asyncio.to_thread(self._pulse_thread.join)  # at most one tick: nothing of ours outlives close()
            self._pulse_thread = None
        confirming = [task for task in (self._confirming, self._confirming_fences) if task is not None]
        for task in [*self._tasks, *confirming]:
            task.cancel()
        await asyncio.gather(*self._tasks, *confirming, return_exceptions=True)
        await self.runtime.wait_unloaded()  # the groups of what `_stop_serving` gave up, gone too

    # -- from the membership thread (run on the loop) -----------------------------------------------------------
    async def on_assigned(self, partitions: set[int]) -> None:
        if self.closing:  # revoked again by the close under way: neither taken nor announced in the owner map
            log.info("event=assignment_ignored partitions=%s reason=shutting_down", sorted(partitions))
            return
        self.owned |= partitions
        self._owned_changed()
        self._queue.put_nowait(("load", partitions, asyncio.get_running_loop().create_future()))
        # not waited for: a load may take long, and the consumer thread must keep answering rebalances

    async def on_revoked(self, partitions: set[int]) -> None:
        await self._give_up(partitions, "revoked")

    async def on_lost(self, partitions: set[int]) -> None:
        self._stop_serving(partitions)  # another instance may already serve them: stop now, not in turn
        await self._give_up(partitions, "lost")

    def on_fenced(self, partition: int) -> None:
        """The store's callback: a write to `partition` was fenced. Out of service at once, then Kafka decides.
        Usually a newer owner took the partition over, and the confirmation says so; but the fence may also come
        from the other side: a partition's producer stops as fenced on any fatal error, and a previous owner's
        fresh producer (initialised again after an outage, before it heard its membership was lost) fences the
        new owner. Giving up on our own would leave a partition Kafka says is ours served by nobody until the
        next rebalance; so: still ours in a description taken after the fence → fenced again by us, read again
        and served; else given up."""
        if partition not in self.owned or partition in self._fenced:
            return
        log.warning("event=partition_fenced partition=%d action=unload_and_confirm detail=a newer producer took "
                    "this partition's transactional.id (a new owner, or a previous one back after an outage); not "
                    "served until Kafka says whose it is: still ours, fenced back and read again; else given up",
                    partition)
        self._stop_serving({partition})
        self._suspended.discard(partition)
        self._fenced.add(partition)
        self._queue.put_nowait(("fenced", {partition}, asyncio.get_running_loop().create_future()))
        if self._confirming_fences is None or self._confirming_fences.done():
            self._confirming_fences = asyncio.get_running_loop().create_task(self._confirm_fences(),
                                                                             name="ownership-confirm-fenced")

    async def _confirm_fences(self) -> None:
        failures = 0
        while self._fenced:
            asked = set(self._fenced)
            if self._read_assignment is None or self.membership is None:
                assigned: set[int] | None = set()  # nobody to ask (not started): give them up
            else:
                assigned, failures = await self._assignment_now("fence_confirm_failed", failures)
            if assigned is None:  # rebalancing, or no answer: its outcome decides, ask again
                await asyncio.sleep(_CONFIRM_RETRY_MS / 1000)
                continue
            settled = asked & self._fenced  # revoked or lost meanwhile: given up by those callbacks already
            self._fenced -= settled
            kept = {p for p in settled if p in assigned and p in self.owned}
            gone = (settled - kept) & self.owned
            if kept:
                self._queue.put_nowait(("load", kept, asyncio.get_running_loop().create_future()))
            if gone:
                self.owned -= gone
                self._owned_changed()
            log.info("event=fence_confirmed taken_back=%s given_up=%s", sorted(kept), sorted(gone))  # as announced

    async def _give_up(self, partitions: set[int], reason: str) -> None:
        self.owned -= partitions
        self._suspended -= partitions
        self._fenced -= partitions
        self._owned_changed()
        if self._loading is not None and not self._loading[0] & self.owned:
            self._stop_load(reason)  # nothing of it is ours any more: its unload need not wait for it
        done = asyncio.get_running_loop().create_future()
        self._queue.put_nowait((reason, partitions, done))
        await done  # the membership thread returns to librdkafka only now

    def _owned_changed(self) -> None:
        if self.on_owned is not None:
            self.on_owned(set(self.owned))

    def _stop_serving(self, partitions: Collection[int]) -> None:
        """Out of service now: NOT_COORDINATOR, and none of their groups' timers acts any more; the groups go a
        slice per loop turn in the runtime's task (GroupRuntime.give_up), every parked request answered as it
        goes. The transition queued behind (its `runtime.unload`) and a later load of the partition wait for it."""
        self.runtime.give_up(partitions)

    # -- transitions, one at a time -------------------------------------------------------------------------------
    async def _transitions(self) -> None:
        while True:
            kind, partitions, done = await self._queue.get()
            try:
                if kind == "load":
                    await self._load(partitions)
                    self.settled.set()
                else:  # revoked, lost, fenced, suspended (a stall: read again once confirmed)
                    await self._unload(partitions, kind)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("event=ownership_transition_failed kind=%s partitions=%s", kind, sorted(partitions))
            finally:
                if not done.done():
                    done.set_result(None)

    async def _load(self, partitions: set[int]) -> None:
        """The load as a task of its own, so that `_stop_load` can stop it (the transitions go on)."""
        if self.closing:
            return
        loading = asyncio.get_running_loop().create_task(self._load_until_done(partitions), name="ownership-load")
        self._loading = (partitions, loading)
        try:
            await asyncio.wait((loading,))
        except asyncio.CancelledError:  # the transitions themselves stop (close): the load with them
            loading.cancel()
            raise
        finally:
            self._loading = None
        if loading.cancelled():
            self._stop_serving(partitions)  # none of it is ours to serve (given up, or shutting down)
            return
        loading.result()  # its failure, if any, is the transition's

    def _stop_load(self, reason: str) -> None:
        """Stop the load running now: its producers' initialisation and its read end where they are (an
        init_transactions already on its way to Kafka's transaction coordinator still lands: if that fences the
        partition's new owner, its next write is refused and it takes the partition back, `on_fenced`)."""
        if self._loading is None or self._loading[1].done():
            return
        partitions, loading = self._loading
        loading.cancel()
        log.info("event=partition_load_stopped partitions=%s reason=%s", sorted(partitions), reason)

    async def _load_until_done(self, partitions: set[int]) -> None:
        retry_s = 0.5
        while True:
            wanted = partitions & self.owned  # some may have been given up while queued or retrying
            if not wanted:
                return
            started_ms = self.clock.now_ms()
            try:
                groups = await self.runtime.load(wanted)
                break
            except Exception as exc:  # broker unreachable: keep answering LOAD_IN_PROGRESS and try again
                log.error("event=partition_load_failed partitions=%s error=%r retry_in_s=%.1f", sorted(wanted),
                          exc, retry_s)
                await asyncio.sleep(retry_s)
                retry_s = min(retry_s * 2, _LOAD_RETRY_MAX_S)
        self.loads += 1
        if self.guard.suspended:  # loaded while suspended: out of service until confirmed, like the others
            self._suspended |= wanted & self.owned
            await self.runtime.unload(wanted)
            return
        self._freeze_loaded()
        log.info("event=partitions_loaded partitions=%s groups=%d duration_ms=%d owned=%d", sorted(wanted), groups,
                 self.clock.now_ms() - started_ms, len(self.owned))

    async def _unload(self, partitions: set[int], reason: str) -> None:
        started_ms = self.clock.now_ms()
        await self.runtime.unload(partitions)
        log.info("event=partitions_released partitions=%s reason=%s duration_ms=%d owned=%d", sorted(partitions),
                 reason, self.clock.now_ms() - started_ms, len(self.owned))

    # -- collector policy -----------------------------------------------------------------------------------------
    # A single instance freezes its state once loaded (app.py): a full collection would otherwise walk every group
    # and stall the loop. Here partitions come and go: freeze after each load (the collection walks only what is
    # not frozen yet, the new groups). An unload leaves no cyclic garbage (runtime.unload, parked requests
    # included: tests/unit/test_server_connection_cycles.py, tests/integration/test_service_cycles.py), so nothing
    # is thawed after it: a full collection would hold the interpreter lock, and so this instance's zombie-guard
    # pulse, for ~1 µs per live object (docs/operations.md, "The safety net").
    def _freeze_loaded(self) -> None:
        if self._gc_after_moves:
            gc.collect()
            gc.freeze()

    # -- the zombie guard -----------------------------------------------------------------------------------------
    def _tick(self) -> None:
        # A bare timer callback, not a task: after a pause it runs in the loop's first turn, before the timing
        # wheel's reaper (a task, woken by its own timer) can run any group's expired session or rebalance.
        # It only checks: the pulse comes from the watcher thread, so a late tick (a busy loop) is no stall.
        self.guard.check()
        assert self._tick_s is not None
        self._tick_handle = asyncio.get_running_loop().call_later(self._tick_s, self._tick)

    def _pulse(self, tick_s: float) -> None:
        """The watcher thread: pulses the guard until close()."""
        while not self._pulse_stop.wait(tick_s):
            self.guard.pulse()

    def _on_stall(self, stalled_ms: int) -> None:
        """Out of service: every served partition answers NOT_COORDINATOR until Kafka confirms it is ours. None
        of its groups' timers (sessions, rebalance timeouts) acts from now on, on a state that may belong to another
        instance by now, and the groups are dropped, a slice per loop turn (`_stop_serving`); the partitions Kafka
        confirms are read again from the state topic (the truth, whoever wrote it last) and served."""
        newly = {p for p in self.owned if self.runtime.shards[p].status is _ACTIVE}
        if newly:
            self._stop_serving(newly)
            self._suspended |= newly
            self._queue.put_nowait(("suspended", newly, asyncio.get_running_loop().create_future()))
        if self._confirming is None or self._confirming.done():
            log.warning("event=instance_stalled stalled_ms=%d stall_threshold_ms=%d suspended_partitions=%d "
                        "action=confirm_ownership", stalled_ms, self.guard.stall_ms, len(self._suspended))
            self._confirming = asyncio.get_running_loop().create_task(self._confirm(), name="ownership-confirm")

    async def _confirm(self) -> None:
        started_ms = self.clock.now_ms()
        failures = 0
        while self.guard.suspended:
            stalls = self.guard.stalls
            assigned, failures = await self._assignment_now("ownership_confirm_failed", failures)
            if assigned is not None and stalls == self.guard.stalls:
                self._resume(assigned, started_ms)
                return
            await asyncio.sleep(_CONFIRM_RETRY_MS / 1000)

    async def _assignment_now(self, failed_event: str, failures: int) -> tuple[set[int] | None, int]:
        """Our partitions in a description taken now (None while the group rebalances or Kafka does not answer:
        the caller asks again every 200 ms; the first failure in a row is a WARNING, the rest DEBUG), and the
        failures in a row so far."""
        try:
            assert self._read_assignment is not None and self.membership is not None
            return await self._read_assignment(self.membership), 0
        except Exception as exc:
            failures += 1
            log.log(logging.WARNING if failures == 1 else logging.DEBUG,
                    "event=%s failures=%d error=%r (asking again until Kafka answers)", failed_event, failures, exc)
            return None, failures

    def _resume(self, assigned: set[int], started_ms: int) -> None:
        self.guard.resume()
        kept = {p for p in self._suspended if p in assigned and p in self.owned}
        gone = self._suspended - kept
        self._suspended.clear()
        if kept:  # still ours: read again and served (fenced again first: we are their owner)
            self._queue.put_nowait(("load", kept, asyncio.get_running_loop().create_future()))
        if gone:  # Kafka gave them to another instance while we were away (already unloaded)
            self.owned -= gone
            self._owned_changed()
        log.info("event=ownership_confirmed resumed_partitions=%d given_up=%s confirm_ms=%d", len(kept),
                 sorted(gone), self.clock.now_ms() - started_ms)


class GroupAssignmentReader:
    """Our partitions as the instances group's coordinator describes them now (DescribeGroups): the zombie
    guard's confirmation. None while the group rebalances (members' assignments are not listed then) or before
    we joined; an empty set when our member id is not in the group any more.

    `describe` is the owner map's `describe_fresh`: the instance's one AdminClient, and a description sent after
    the call, so after the stall that started the confirmation (an answer to a request sent before the stall, or
    the map's cached one, could show partitions that Kafka has moved since)."""

    def __init__(self, describe: Callable[[], Awaitable[Described]]) -> None:
        self._describe = describe

    async def __call__(self, membership: Membership) -> set[int] | None:
        member_id = membership.member_id
        if not member_id:
            return None
        described = await self._describe()
        if not described.stable:
            return None
        for member in described.members:
            if member.member_id == member_id:
                return set(member.partitions or ())
        return set()
