"""One seed, one run: the scenario it draws, the world it builds, the faults it injects, the verdict.

`run_seed(seed)` is pure in its seed: a fresh `VirtualLoop`, seeded random streams (one per concern, so adding
a draw to one does not shift the others), member ids from the seed, and the history hash at the end. The run:
  1. the scenario: state-topic partitions, coordinator settings (initial rebalance delay, retention, join
     timeout), 1-3 groups of 1-5 consumers (some static) over 1-2 topics, Kafka's failure rates, and a list
     of faults at seeded times — consumer crash (and a replacement or static restart later), graceful leave,
     hang, slowness; coordinator crash and restart; Kafka outage; log compaction;
  2. the run itself, for the scenario's duration on the virtual clock;
  3. a quiet period: consumers gone, Kafka up, ten virtual minutes for every parked request to be answered;
  4. a last crash and reload, checked against everything Kafka acknowledged.
"""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import random
import time
from dataclasses import dataclass, field
from typing import Any, Coroutine, Iterator

from coordinator.config import INT32_MAX, CoordinatorConfig
from coordinator.group import join
from coordinator.storage.config import DEFAULT_STATE_TOPIC
from simulator.client_txns import (ClientTransactions, ProbedApp, SimRelay, TransactionalApp, TxnProbe,
                                   VerificationFaults)
from simulator.clients import MemberSpec, SimAdmin, SimConsumer
from simulator.consumer_protocol import ConsumerProtocolConsumer, cluster_topics
from simulator.history import History
from simulator.cluster import InstancesGroup
from simulator.instance import CoordinatorInstance, Disconnected, Route, not_coordinator as _not_coordinator
from simulator.invariants import Checkers, Violation
from simulator.kafka import KafkaFaults, SimKafka
from simulator.ledger import Ledger
from simulator.loop import SimulationStuck, VirtualLoop
from simulator.plants import planted
from simulator.shrink import Reduction, reduce_scenario
from simulator.transactions import simulated_transactions

QUIET_MS = 600_000
REQUEST_TIMEOUT_MS = 30_000  # request.timeout.ms of the Java consumer
FINAL_LOAD_WAIT_MS = 120_000
FAULT_KINDS = ("member_crash", "member_leave", "member_hang", "member_slow", "member_zombie", "member_resubscribe",
               "instance_crash", "instance_shutdown", "kafka_outage", "compaction")


@dataclass(frozen=True)
class GroupSpec:
    group_id: str
    topics: dict[str, int]
    members: list[MemberSpec]
    protocol: str = "classic"  # or "consumer": KIP-848's ConsumerGroupHeartbeat


@dataclass(frozen=True)
class WireFaults:
    """Per request, between a client and the coordinator: the probability of each fault."""

    reset: float = 0.0  # the connection resets mid-request: before the coordinator read it, or after
    drop: float = 0.0  # the answer is lost: the client waits out its request timeout, then reconnects
    delay: float = 0.0  # the answer comes 0.2-5 s late
    duplicate: float = 0.0  # the answer comes twice: the client drops the connection (correlation id mismatch)


@dataclass(frozen=True)
class Fault:
    at_ms: int
    kind: str
    target: int  # a member slot (member faults), unused otherwise
    duration_ms: int


@dataclass(frozen=True)
class TxnAppSpec:
    """An exactly-once application: its group's input partitions, the transaction protocol (TV2: TxnOffsetCommit v5
    adds the partition; TV1: AddOffsetsToTxn first, an older TxnOffsetCommit), transaction.timeout.ms."""

    topics: dict[str, int]
    tv2: bool
    version: int
    timeout_ms: int


TXN_FAULT_KINDS = ("txn_crash", "txn_zombie", "txn_hang")


@dataclass(frozen=True)
class TxnProbeSpec:
    """A zombie of the applications whose TxnOffsetCommits the group refuses (simulator.client_txns.TxnProbe):
    how often it sends one, and the faults of the transaction's verification."""

    every_ms: tuple[int, int]
    faults: VerificationFaults


@dataclass
class Scenario:
    seed: int
    duration_ms: int
    config: CoordinatorConfig
    kafka: KafkaFaults
    groups: list[GroupSpec]
    faults: list[Fault]
    admin_every_ms: tuple[int, int] | None  # None: no operator
    instances: int = 0  # 0: one instance owning every partition; else instances sharing the state topic
    wire: WireFaults | None = None  # None: a faultless network between clients and coordinators
    txn_apps: list[TxnAppSpec] = field(default_factory=list)  # exactly-once applications (their faults: txn_*)
    txn_probe: TxnProbeSpec | None = None  # refused TxnOffsetCommits: the transaction's verification, its faults
    txn_deletes: bool = True  # the operator deletes in the applications' groups too (SIMULATOR_TXN_DELETES=0: not)

    def describe(self) -> str:
        members = sum(len(g.members) for g in self.groups)
        consumer = sum(1 for g in self.groups if g.protocol == "consumer")
        kinds: dict[str, int] = {}
        for fault in self.faults:
            kinds[fault.kind] = kinds.get(fault.kind, 0) + 1
        admin = "no admin" if self.admin_every_ms is None else f"admin every {self.admin_every_ms} ms"
        instances = f"{self.instances} instances, " if self.instances else ""
        if self.wire is not None:
            instances += f"wire faults {self.wire.reset}/{self.wire.drop}/{self.wire.delay}/{self.wire.duplicate}, "
        protocols = f" ({consumer} on the consumer protocol)" if consumer else ""
        if self.txn_apps:
            instances += f"{len(self.txn_apps)} transactional apps, "
        if self.txn_probe is not None:
            instances += f"txn zombie every {self.txn_probe.every_ms} ms, "
        return (f"{instances}{len(self.groups)} groups{protocols}, {members} consumers, {self.config.offsets_topic_num_partitions} "
                f"state partitions, {self.duration_ms // 1000}s, {admin}, faults {kinds}")


PROTOCOLS = ("classic", "consumer", "mixed", "upgrade")
# A member's place handed to a client of the other protocol (an online upgrade, then perhaps a downgrade): the old
# client leaves (LeaveGroup; a consumer-protocol one commits, revokes, heartbeats -1 or -2) or is closed (a static
# classic member's close: no LeaveGroup), and its replacement of the other protocol starts `duration_ms` later.
CONVERSION_KINDS = ("upgrade_leave", "upgrade_close", "downgrade_leave", "downgrade_close")


def make_scenario(seed: int, protocol: str = "classic") -> Scenario:
    """`protocol`: what the groups speak — classic, consumer (KIP-848), mixed (each group draws one) or upgrade
    (groups start classic, their members are replaced one by one by consumer-protocol ones, and in some groups
    back again)."""
    rng = random.Random(f"scenario:{seed}")
    stormy = rng.random() < 0.25  # many faults, Kafka failing often, small groups allowed
    config = CoordinatorConfig(
        group_max_size=rng.choice([2, 3]) if stormy and rng.random() < 0.5 else INT32_MAX,
        offsets_topic_num_partitions=rng.choice([1, 2, 3, 5]),
        group_initial_rebalance_delay_ms=rng.choice([0, 0, 500, 3_000]),
        offsets_retention_minutes=rng.choice([1, 10_080]),
        offsets_retention_check_interval_ms=rng.choice([5_000, 30_000]),
        new_member_join_timeout_ms=rng.choice([30_000, 300_000]),
    )
    rates = [0.05, 0.1, 0.2] if stormy else [0.0, 0.01, 0.03]
    kafka = KafkaFaults(refuse=rng.choice(rates), after_append=rng.choice(rates), ack_lost=rng.choice(rates),
                        land_ms=(1, rng.choice([5, 20, 200])))
    groups = []
    slot = 0
    for g in range(rng.randint(1, 3)):
        topics = {f"t{g}-{t}": rng.randint(1, 6) for t in range(rng.randint(1, 2))}
        members = []
        for _ in range(rng.randint(1, 5)):
            session_ms = rng.randint(6_000, 15_000)
            static = rng.random() < 0.3
            members.append(MemberSpec(
                name=f"consumer-{slot}", instance_id=f"instance-{slot}" if static else None, session_ms=session_ms,
                rebalance_ms=rng.randint(10_000, 30_000), heartbeat_ms=session_ms // 3,
                commit_ms=rng.randint(1_000, 5_000),
                join_version=rng.choice([5, 9]) if static else rng.choice([4, 5, 9])))  # static: v5+
            slot += 1
        groups.append(GroupSpec(f"group-{g}", topics, members))
    duration_ms = rng.randint(60_000, 180_000)
    faults = sorted((Fault(rng.randint(5_000, duration_ms - 5_000), rng.choice(FAULT_KINDS), rng.randrange(slot),
                           rng.choice([200, 2_000, 8_000, 20_000, 40_000]))
                     for _ in range(rng.randint(0, 40 if stormy else 12))),
                    key=lambda f: (f.at_ms, f.kind, f.target))
    admin = rng.choice([None, (5_000, 30_000), (1_000, 5_000)])
    instances = 0
    if rng.random() < 0.4:  # several instances: partitions move on crashes, shutdowns and pauses
        instances = rng.randint(2, 3)
        pauses = [Fault(rng.randint(5_000, duration_ms - 5_000), "instance_pause", rng.randrange(instances),
                        rng.choice([1_000, 4_000, 8_000, 15_000])) for _ in range(rng.randint(0, 4))]
        faults = sorted(faults + pauses, key=lambda f: (f.at_ms, f.kind, f.target))
    wire = None
    if rng.random() < 0.3:
        rates = [0.0, 0.01, 0.03, 0.08]
        wire = WireFaults(rng.choice(rates), rng.choice(rates), rng.choice(rates), rng.choice(rates))
    if protocol == "upgrade":  # drawn apart too, on a stream of its own
        upgrades = random.Random(f"upgrade:{seed}")
        _, config = _consumer_protocol(upgrades, "consumer", groups, config)
        faults = sorted(faults + _conversions(upgrades, groups, duration_ms), key=lambda f: (f.at_ms, f.kind, f.target))
    elif protocol != "classic":  # drawn apart: the classic scenarios stay what they were
        groups, config = _consumer_protocol(random.Random(f"protocol:{seed}"), protocol, groups, config)
    txn_apps, txn_faults = _transactional_apps(random.Random(f"txn:{seed}"), duration_ms)
    if txn_faults:
        faults = sorted(faults + txn_faults, key=lambda f: (f.at_ms, f.kind, f.target))
    probe = _txn_probe(random.Random(f"txn-probe:{seed}")) if txn_apps else None
    txn_deletes = os.environ.get("SIMULATOR_TXN_DELETES", "1") != "0"
    return Scenario(seed, duration_ms, config, kafka, groups, faults, admin, instances, wire, txn_apps, probe,
                    txn_deletes)


def _txn_probe(rng: random.Random) -> TxnProbeSpec | None:
    """Most seeds with applications also run their zombie, with the verification's faults (drawn apart)."""
    if rng.random() < 0.3:
        return None
    faults = VerificationFaults(find_error=rng.choice([0.0, 0.05, 0.2]), describe_error=rng.choice([0.0, 0.05, 0.2]),
                                timeout=rng.choice([0.0, 0.0, 0.02, 0.1]),
                                prepare_hold_ms=rng.choice([(0, 0), (100, 2_000), (1_000, 8_000)]))
    return TxnProbeSpec(rng.choice([(200, 1_000), (1_000, 5_000)]), faults)


def _transactional_apps(rng: random.Random, duration_ms: int) -> tuple[list[TxnAppSpec], list[Fault]]:
    """Half the seeds run 1-2 exactly-once applications, with their own faults (drawn apart, so the rest of
    the scenario is what it was)."""
    if rng.random() < 0.5:
        return [], []
    apps = []
    for number in range(rng.randint(1, 2)):
        tv2 = rng.random() < 0.5
        apps.append(TxnAppSpec({f"txn-in-{number}": rng.randint(1, 3)}, tv2, 5 if tv2 else rng.randint(0, 4),
                               rng.choice([10_000, 20_000, 60_000])))
    faults = [Fault(rng.randint(5_000, duration_ms - 5_000), rng.choice(TXN_FAULT_KINDS), rng.randrange(len(apps)),
                    rng.choice([2_000, 8_000, 20_000, 40_000])) for _ in range(rng.randint(0, 6))]
    return apps, faults


def _consumer_protocol(rng: random.Random, protocol: str, groups: list[GroupSpec], config: CoordinatorConfig
                       ) -> tuple[list[GroupSpec], CoordinatorConfig]:
    """The groups that speak the consumer protocol, and the coordinator's session and heartbeat settings for it
    (server side in KIP-848)."""
    chosen = [GroupSpec(g.group_id, g.topics, g.members,
                        "consumer" if protocol == "consumer" or rng.random() < 0.5 else "classic") for g in groups]
    session_ms = rng.choice([10_000, 20_000, 45_000])
    heartbeat_ms = rng.choice([1_000, 3_000]) if session_ms < 45_000 else rng.choice([3_000, 5_000])
    config = dataclasses.replace(config, group_consumer_session_timeout_ms=session_ms,
                                 group_consumer_min_session_timeout_ms=min(session_ms, 45_000),
                                 group_consumer_heartbeat_interval_ms=heartbeat_ms,
                                 group_consumer_min_heartbeat_interval_ms=min(heartbeat_ms, 5_000))
    return chosen, config


def _conversions(rng: random.Random, groups: list[GroupSpec], duration_ms: int) -> list[Fault]:
    """The rolling upgrades (every group starts classic): from a drawn time on, its members' places, in a drawn
    order, one every 1-15 s, go to consumer-protocol clients; in 40% of the groups the same rolling replacement
    back to classic clients follows 5-30 s after the last upgrade (a downgrade: the group turns classic when its
    last consumer-protocol member goes). Whatever does not fit in the run is left out: some groups end mixed."""
    faults = []
    first = 0
    for group in groups:
        places = list(range(first, first + len(group.members)))
        first += len(group.members)
        at_ms = rng.randint(8_000, max(duration_ms // 2, 8_001))  # mostly after the first rebalance
        for kind in ("upgrade", "downgrade"):
            if kind == "downgrade":
                if rng.random() >= 0.4:
                    break
                at_ms += rng.randint(5_000, 30_000)
            rng.shuffle(places)
            for place in places:
                if at_ms < duration_ms - 2_000:
                    how = "close" if rng.random() < 0.3 else "leave"
                    faults.append(Fault(at_ms, f"{kind}_{how}", place, rng.choice([0, 200, 1_000, 3_000])))
                at_ms += rng.randint(1_000, 15_000)
    return faults


class MemberSlot:
    """One consumer position of a group: the consumer in it now, replaced after a crash or leave."""

    def __init__(self, sim: Simulation, group: GroupSpec, spec: MemberSpec) -> None:
        self.sim, self.group, self.spec = sim, group, spec
        self.incarnation = 0
        self.protocol = group.protocol  # the next client's: changed by the upgrade and downgrade (_convert)
        self.consumer: SimConsumer | ConsumerProtocolConsumer | None = None
        self.zombies: list[SimConsumer | ConsumerProtocolConsumer] = []  # replaced while hung, still running

    def start(self) -> None:
        self.incarnation += 1
        kind = ConsumerProtocolConsumer if self.protocol == "consumer" else SimConsumer
        self.consumer = kind(self.sim, self.group.group_id, self.group.topics, self.spec, self.incarnation)
        self.sim.history.record("consumer_start", client=self.consumer.name, static=self.spec.instance_id)
        self.consumer.start()

    def stop(self) -> None:
        for zombie in self.zombies:
            zombie.crash()
        self.zombies.clear()
        if self.consumer is not None:
            self.consumer.crash()
            self.consumer = None


class Simulation:
    def __init__(self, scenario: Scenario, keep_history: bool = True) -> None:
        seed = scenario.seed
        self.scenario = scenario
        self.config = scenario.config
        self.loop = VirtualLoop(random.Random(f"loop:{seed}"))
        self.rng_net = random.Random(f"network:{seed}")
        self.rng_client = random.Random(f"clients:{seed}")
        self.rng_faults = random.Random(f"faults:{seed}")
        self.history = History(self.loop.now_ms, keep_history)
        self.topics = cluster_topics({t: n for g in scenario.groups for t, n in g.topics.items()})
        self.ledger = Ledger(self.history)
        self.checkers = Checkers(self.history, self.ledger, self.loop.now_ms)
        self.kafka = SimKafka(self.loop, self.loop.now_ms, random.Random(f"kafka:{seed}"),
                              self.config.offsets_topic_num_partitions, scenario.kafka, self.history)
        if scenario.txn_apps:
            self.kafka.tombstone_landed = self.checkers.tombstone_landed
        self.multi = scenario.instances > 0
        # the instance in each place (one place without several instances); None while it is down
        self.coordinators: list[CoordinatorInstance | None] = [None] * max(scenario.instances, 1)
        self.instances: list[CoordinatorInstance] = []  # every one ever started: a dead one is never collected
        self.processes: dict[str, CoordinatorInstance] = {}  # by the client.id of its state producers
        self.instances_group_id = "state.coordinators"
        self.instances_group = InstancesGroup(self, self.config.offsets_topic_num_partitions, 6_000)
        self.checkers.cluster = self
        self.slots = [MemberSlot(self, g, spec) for g in scenario.groups for spec in g.members]
        # clients' transactions: the cluster's side, the relay the TxnOffsetCommit handler appends through
        self.rng_txn = random.Random(f"txn-run:{seed}")
        self.client_transactions: ClientTransactions | None = None
        self.relay: SimRelay | None = None
        self.apps: list[TransactionalApp | None] = [None] * len(scenario.txn_apps)
        self._app_incarnations = [0] * len(scenario.txn_apps)
        self._zombie_apps: list[TransactionalApp] = []
        if scenario.txn_apps:
            self.client_transactions = ClientTransactions(self, random.Random(f"txn-kafka:{seed}"))
            probe = scenario.txn_probe
            self.relay = SimRelay(self, self.client_transactions, DEFAULT_STATE_TOPIC,
                                  self.config.offsets_topic_num_partitions, None if probe is None else probe.faults,
                                  random.Random(f"txn-verify:{seed}"))
            if probe is not None:
                self.client_transactions.prepare_hold_ms = probe.faults.prepare_hold_ms
        self._offsets: dict[tuple[str, str, int], int] = {}
        self._outages = 0
        self._running = True

    def now_ms(self) -> int:
        return self.loop.now_ms()

    def latency_ms(self) -> int:
        return self.rng_net.choice((0, 1, 1, 2, 3, 5, 10, 50))

    @property
    def coordinator(self) -> CoordinatorInstance | None:
        """The instance in the first place (the only one without several instances)."""
        return self.coordinators[0]

    def process_alive(self, process: str) -> bool:
        instance = self.processes.get(process)
        return instance is not None and instance.alive

    async def call(self, client: str, member_id: str, api: str, request: Any, slow_factor: int = 1,
                   route: Route | None = None) -> Any:
        """A request over the network to the group's coordinator, the answer back; Disconnected if there is none.
        With several instances the client finds the coordinator first (FindCoordinator to any instance, cached
        in `route`) and forgets it on NOT_COORDINATOR, COORDINATOR_NOT_AVAILABLE or a dropped connection."""
        await asyncio.sleep(self.latency_ms() * slow_factor / 1000)
        route = route or Route()
        if self.multi:
            instance = route.instance
            if instance is None or not instance.alive:
                instance = route.instance = await self._find_coordinator(_group_of(request))
        else:
            instance = self.coordinator
        if instance is None or not instance.alive:
            await asyncio.sleep(self.rng_net.randint(50, 500) / 1000)
            raise Disconnected("connection refused")
        try:
            response, connection_kept = await self._exchange(instance, client, member_id, api, request, slow_factor)
        except Disconnected:
            route.instance = None
            raise
        if _not_coordinator(response) or not connection_kept:
            route.instance = None
        return response

    async def _exchange(self, instance: CoordinatorInstance, client: str, member_id: str, api: str, request: Any,
                        slow_factor: int) -> tuple[Any, bool]:
        """One request on the connection to `instance` and its answer, through the scenario's wire faults. The
        client gives up after its request timeout (a JoinGroup's: the rebalance timeout and 5 s more, as the
        Java client), closes the connection and retries. Second: False when the answer came twice (the copy
        matches no request in flight, and the Java client closes that connection: the next request finds the
        coordinator again)."""
        wire = self.scenario.wire
        timeout_ms = (getattr(request, "rebalance_timeout_ms", 0) + 5_000 if api == "join_group"
                      else REQUEST_TIMEOUT_MS)
        sent_ms = self.now_ms()
        if wire is not None and self.rng_net.random() < wire.reset:
            read = self.rng_net.random() < 0.5
            self.history.record("wire_reset", client=client, api=api, read=read)
            if read:  # the coordinator read it and handles it; its answer goes to a closed connection
                instance.serve(api, request, client, member_id).add_done_callback(_unheard)
            raise Disconnected("connection reset by peer")
        reply = instance.serve(api, request, client, member_id)
        reply.add_done_callback(_unheard)  # an answer the client gave up waiting for
        try:
            response = await asyncio.wait_for(asyncio.shield(reply), timeout_ms / 1000)
        except asyncio.TimeoutError:
            self.history.record("wire_timeout", client=client, api=api)
            raise Disconnected("request timed out") from None
        await asyncio.sleep(self.latency_ms() * slow_factor / 1000)
        if wire is not None:
            roll = self.rng_net.random()
            if roll < wire.drop:
                self.history.record("wire_drop", client=client, api=api)
                await asyncio.sleep(max(sent_ms + timeout_ms - self.now_ms(), 0) / 1000)
                raise Disconnected("request timed out (its answer was lost)")
            if roll < wire.drop + wire.delay:
                await asyncio.sleep(self.rng_net.randint(200, 5_000) / 1000)
            elif roll < wire.drop + wire.delay + wire.duplicate:
                self.history.record("wire_duplicate", client=client, api=api)
                return response, False
        return response, True

    async def _find_coordinator(self, group_id: str) -> CoordinatorInstance | None:
        """FindCoordinator to a live instance: the owner of the group's partition as its owner map knows it."""
        live = [i for i in self.coordinators if i is not None and i.alive and not i.closing]
        if not live:
            return None
        asked = self.rng_net.choice(live)
        await asked.running()
        await asyncio.sleep(self.latency_ms() / 1000)
        node = None if asked.directory is None or not asked.alive else asked.directory.coordinator_node(group_id)
        if node is None:  # COORDINATOR_NOT_AVAILABLE: the client backs off and asks again
            await asyncio.sleep(self.rng_net.randint(50, 500) / 1000)
            raise Disconnected("coordinator not available")
        return next((i for i in self.coordinators
                     if i is not None and i.alive and i.directory is not None and i.endpoint.node_id == node.node_id),
                    None)

    def next_offset(self, group_id: str, tp: tuple[str, int]) -> int:
        key = (group_id, tp[0], tp[1])
        self._offsets[key] = offset = self._offsets.get(key, 0) + 1
        return offset

    # --- the run ----------------------------------------------------------------------------------------------
    async def main(self) -> None:
        for place in range(len(self.coordinators)):
            self._start_instance(place)
        for slot in self.slots:
            self.loop.call_later(self.rng_client.randint(0, 3_000) / 1000, slot.start)
        for number in range(len(self.apps)):
            self.loop.call_later(self.rng_txn.randint(0, 3_000) / 1000, self._start_app, number)
        for fault in self.scenario.faults:
            self.loop.call_at(fault.at_ms / 1000, self._inject, fault)
        self.loop.call_later(30, self._compact_periodically)
        admin = txn_admin = None
        if self.scenario.admin_every_ms is not None:
            operator = SimAdmin(self, {g.group_id: g.topics for g in self.scenario.groups},
                                self.scenario.admin_every_ms)
            admin = self.loop.create_task(operator.run())
            if self.scenario.txn_apps and self.scenario.txn_deletes:
                txn_groups = {ProbedApp.of(n, spec.topics, spec.tv2).group_id: spec.topics
                              for n, spec in enumerate(self.scenario.txn_apps)}
                txn_admin = self.loop.create_task(operator.run_on_transactional_groups(
                    txn_groups, random.Random(f"txn-admin:{self.scenario.seed}")))
        probe = None
        if self.scenario.txn_probe is not None and self.relay is not None:
            apps = [ProbedApp.of(n, spec.topics, spec.tv2) for n, spec in enumerate(self.scenario.txn_apps)]
            probe = self.loop.create_task(TxnProbe(self, self.relay, apps, self.scenario.txn_probe.every_ms,
                                                   random.Random(f"txn-zombie:{self.scenario.seed}")).run())
        await asyncio.sleep(self.scenario.duration_ms / 1000)
        self._running = False
        for slot in self.slots:
            slot.stop()
        for app in [*self.apps, *self._zombie_apps]:
            if app is not None:
                app.crash()  # an open transaction is left to its timeout
        for task in (admin, txn_admin, probe):
            if task is not None:
                task.cancel()
        self._outages = 0
        self.kafka.come_up()
        for place, instance in enumerate(self.coordinators):
            if instance is None:
                self._start_instance(place)
        self.history.record("quiet")
        await asyncio.sleep(QUIET_MS / 1000)
        for place, instance in enumerate(self.coordinators):
            if instance is None or not instance.alive:  # it was shutting down when the run ended
                self._start_instance(place)
        for instance in list(self.coordinators):
            assert instance is not None
            self.checkers.finish(instance)
            instance.crash()
            self.coordinators[self.coordinators.index(instance)] = None
        final = self._start_instance(0)
        waited_ms = 0
        while not self._serves_everything(final) and waited_ms < FINAL_LOAD_WAIT_MS:
            await asyncio.sleep(0.1)
            waited_ms += 100
        if not self._serves_everything(final):
            self.checkers.violation("no_errors", "the final reload did not finish")
            return
        self.checkers.final_offsets(final)
        self.checkers.txn_final(final)

    def _start_instance(self, place: int = 0) -> CoordinatorInstance:
        instance = CoordinatorInstance(self, len(self.instances), place if self.multi else None)
        self.coordinators[place] = instance
        self.instances.append(instance)
        return instance

    def _serves_everything(self, instance: CoordinatorInstance) -> bool:
        if instance.ownership is None:
            return instance.loaded
        return all(instance.ownership.serving(p) for p in range(self.config.offsets_topic_num_partitions))

    def _inject(self, fault: Fault) -> None:
        if not self._running:
            return
        self.history.record("fault", kind=fault.kind, target=fault.target, duration_ms=fault.duration_ms)
        if fault.kind.startswith("txn_"):
            self._app_fault(fault)
        elif fault.kind.startswith("member_"):
            if self.slots:
                self._member_fault(fault, self.slots[fault.target % len(self.slots)])
        elif fault.kind in CONVERSION_KINDS:
            if self.slots:
                self._convert(fault, self.slots[fault.target % len(self.slots)])
        else:
            self._cluster_fault(fault)

    def _member_fault(self, fault: Fault, slot: MemberSlot) -> None:
        later = self.loop.call_later
        if fault.kind == "member_crash":
            slot.stop()
            later(fault.duration_ms / 1000, self._restart_slot, slot)
        elif fault.kind == "member_leave":
            if slot.consumer is not None:
                consumer, slot.consumer = slot.consumer, None
                self.loop.create_task(consumer.leave())
                later(fault.duration_ms / 1000, self._restart_slot, slot)
        elif fault.kind == "member_hang":
            if slot.consumer is not None:
                slot.consumer.hang_until_ms = self.now_ms() + fault.duration_ms
        elif fault.kind == "member_zombie":  # it hangs, is replaced meanwhile, and comes back
            if slot.consumer is not None:
                slot.consumer.hang_until_ms = self.now_ms() + fault.duration_ms
                slot.zombies.append(slot.consumer)
                slot.consumer = None
                later(self.rng_faults.randint(0, fault.duration_ms) / 1000, self._restart_slot, slot)
        elif fault.kind == "member_resubscribe":  # one topic fewer, or all of them again
            if slot.consumer is not None:
                topics = sorted(slot.group.topics)
                narrower = len(slot.consumer.subscribed) == len(topics) and len(topics) > 1
                slot.consumer.resubscribe(tuple(topics[:-1]) if narrower else tuple(topics))
        elif fault.kind == "member_slow":
            if slot.consumer is not None:
                consumer = slot.consumer
                consumer.slow_factor = 50
                later(fault.duration_ms / 1000, setattr, consumer, "slow_factor", 1)

    def _convert(self, fault: Fault, slot: MemberSlot) -> None:
        """The place's client replaced by one of the other protocol (same client.id, same group.instance.id): the
        old one leaves or is closed, the new one starts `duration_ms` later. A place with no client now (crashed,
        left) gets the new protocol at its restart."""
        kind, _, how = fault.kind.partition("_")
        slot.protocol = "consumer" if kind == "upgrade" else "classic"
        consumer, slot.consumer = slot.consumer, None
        if consumer is None:
            return
        if how == "leave":
            self.loop.create_task(consumer.leave())
        else:
            consumer.crash()
        self.loop.call_later(fault.duration_ms / 1000, self._restart_slot, slot)

    def _start_app(self, number: int) -> None:
        if not self._running or self.apps[number] is not None:
            return
        spec = self.scenario.txn_apps[number]
        self._app_incarnations[number] += 1
        app = TransactionalApp(self, number, self._app_incarnations[number], spec.topics, spec.tv2, spec.version,
                               spec.timeout_ms, self.rng_txn)
        self.apps[number] = app
        self.history.record("txn_app_start", client=app.name)
        app.start()

    def _app_fault(self, fault: Fault) -> None:
        number = fault.target % max(len(self.apps), 1)
        app = self.apps[number] if self.apps else None
        if app is None:
            return
        later = self.loop.call_later
        if fault.kind == "txn_crash":  # mid-transaction perhaps: the restart's init aborts what it left
            app.crash()
            self.apps[number] = None
            later(fault.duration_ms / 1000, self._start_app, number)
        elif fault.kind == "txn_hang":  # past its transaction timeout perhaps
            app.hang_until_ms = self.now_ms() + fault.duration_ms
        elif fault.kind == "txn_zombie":  # hangs, a new instance of its transactional id fences it meanwhile
            app.hang_until_ms = self.now_ms() + fault.duration_ms
            app.replaced = True
            self._zombie_apps.append(app)
            self.apps[number] = None
            later(self.rng_faults.randint(0, fault.duration_ms) / 1000, self._start_app, number)

    def _cluster_fault(self, fault: Fault) -> None:
        later = self.loop.call_later
        if fault.kind == "instance_crash":
            place = fault.target % len(self.coordinators)
            instance = self.coordinators[place]
            if instance is not None:
                instance.crash()
                self.coordinators[place] = None
                later(fault.duration_ms / 1000, self._restart_instance, place)
        elif fault.kind == "instance_shutdown":
            place = fault.target % len(self.coordinators)
            instance = self.coordinators[place]
            if instance is not None and not instance.closing:
                self.loop.create_task(self._shut_down_and_restart(place, instance, fault.duration_ms))
        elif fault.kind == "instance_pause":
            instance = self.coordinators[fault.target % len(self.coordinators)]
            if instance is not None:
                instance.pause(fault.duration_ms)
        elif fault.kind == "kafka_outage":
            self._outages += 1
            self.kafka.go_down()
            later(fault.duration_ms / 1000, self._outage_over)
        elif fault.kind == "compaction":
            self._compact()

    async def _shut_down_and_restart(self, place: int, instance: CoordinatorInstance, down_ms: int) -> None:
        await instance.shut_down()
        if self.coordinators[place] is instance:
            self.coordinators[place] = None
            self.loop.call_later(down_ms / 1000, self._restart_instance, place)

    def _restart_slot(self, slot: MemberSlot) -> None:
        if self._running and slot.consumer is None:
            slot.start()

    def _restart_instance(self, place: int = 0) -> None:
        if self._running and self.coordinators[place] is None:
            self._start_instance(place)

    def _outage_over(self) -> None:
        self._outages = max(self._outages - 1, 0)
        if self._outages == 0:
            self.kafka.come_up()

    def _compact(self) -> None:
        for partition in range(self.config.offsets_topic_num_partitions):
            self.kafka.compact(partition, self.rng_faults.randint(0, 20))

    def _compact_periodically(self) -> None:
        if self._running:
            self._compact()
            self.loop.call_later(30, self._compact_periodically)


def _unheard(reply: asyncio.Future[Any]) -> None:
    """An answer (or a dropped connection) nobody waits for any more."""
    if not reply.cancelled():
        reply.exception()


def _group_of(request: Any) -> str:
    """The group a request is about (the first one for DeleteGroups and DescribeGroups)."""
    for names in ("groups_names", "groups"):
        groups = getattr(request, names, None)
        if groups:
            return str(groups[0])
    return str(getattr(request, "group_id", ""))


@dataclass
class Outcome:
    seed: int
    violations: list[Violation]
    digest: str
    events: int
    steps: int
    virtual_ms: int
    wall_s: float
    scenario: str
    history: History | None = field(default=None, repr=False)
    cpu_s: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.violations


def run_seed(seed: int, keep_history: bool = False, plant: str | None = None,
             reduction: Reduction | None = None, *, protocol: str = "classic") -> Outcome:
    """One run; `plant` names a planted bug (simulator/plants.py) to run with; `reduction` keeps only part of the
    seed's scenario (simulator/shrink.py); `protocol`: the groups' (make_scenario)."""
    scenario = make_scenario(seed, protocol)
    if reduction is not None:
        scenario = reduce_scenario(scenario, reduction)
    sim = Simulation(scenario, keep_history)
    started, cpu_started = time.perf_counter(), time.process_time()
    run_story(sim, sim.main(), plant)
    return Outcome(seed, sim.checkers.violations, sim.history.digest, sim.history.count, sim.loop.steps,
                   sim.now_ms(), time.perf_counter() - started, sim.scenario.describe(),
                   sim.history if keep_history else None, time.process_time() - cpu_started)


def run_story(sim: Simulation, story: Coroutine[Any, Any, None], plant: str | None = None) -> None:
    """Runs `story` (the scenario's `main`, or a test's own) on the simulation's loop, with member ids from the
    seed and errors as violations, then ends what is left; the verdict is in `sim.checkers.violations`."""
    with _seeded_member_ids(sim.scenario.seed), _errors_are_violations(sim), simulated_transactions(sim), \
            planted(plant):
        try:
            sim.loop.run_until_complete(story)
        except SimulationStuck as exc:
            sim.checkers.violation("no_errors", f"the loop got stuck: {exc}")
        finally:
            sim.history.close()  # what the dropped tasks still do as they end is not part of the run
            verdict = list(sim.checkers.violations)
            for instance in sim.instances:
                instance.alive = False
            _drop(sim.loop)
            sim.checkers.violations = verdict


@contextlib.contextmanager
def _seeded_member_ids(seed: int) -> Iterator[None]:
    rng = random.Random(f"member-ids:{seed}")

    def suffix() -> str:
        bits = f"{rng.getrandbits(128):032x}"
        return f"{bits[:8]}-{bits[8:12]}-{bits[12:16]}-{bits[16:20]}-{bits[20:]}"

    original, join.member_id_suffix = join.member_id_suffix, suffix
    try:
        yield
    finally:
        join.member_id_suffix = original


class _ExceptionLog(logging.Handler):
    def __init__(self, sim: Simulation) -> None:
        super().__init__(logging.ERROR)
        self.sim = sim

    def emit(self, record: logging.LogRecord) -> None:
        if record.exc_info:
            self.sim.checkers.violation("no_errors", f"logged: {record.getMessage()} ({record.exc_info[1]!r})")


@contextlib.contextmanager
def _errors_are_violations(sim: Simulation) -> Iterator[None]:
    """Exceptions logged by the coordinator or reaching the loop are violations; the rest of the logging is
    off during a run (it would cost more than the run)."""
    logger = logging.getLogger("coordinator")
    handler = _ExceptionLog(sim)
    level = logger.level
    logger.setLevel(logging.ERROR)
    logger.addHandler(handler)

    def on_exception(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        message = context.get("message", "")
        if "was destroyed but it is pending" in message:  # a crashed process's tasks, dropped with it
            return
        sim.checkers.violation("no_errors", f"loop: {message} {context.get('exception')!r}")

    sim.loop.set_exception_handler(on_exception)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def _drop(loop: VirtualLoop) -> None:
    """End what is left (a crashed process's tasks, parked requests, clients' timers) before the next seed: each
    task is cancelled and given a bounded virtual minute to unwind (production code cleans up on cancellation,
    with nothing recording); a coroutine still not done is closed here rather than whenever the collector gets
    to it (its `finally` would then run in the middle of another seed's run)."""
    tasks = asyncio.all_tasks(loop)
    for task in tasks:
        task.cancel()
    if tasks:
        try:
            loop.run_until_complete(asyncio.wait(tasks, timeout=60))
        except (SimulationStuck, RuntimeError):
            pass
    for task in asyncio.all_tasks(loop):
        task._log_destroy_pending = False  # type: ignore[attr-defined]
        try:
            task.get_coro().close()
        except BaseException:  # noqa: BLE001 - a coroutine that would not end: dropped with the loop
            pass
    loop._ready.clear()
    loop._scheduled.clear()
    loop.close()
