"""The invariants, checked while a run goes on and at its end. Each check names its invariant in the violation.

  durable_commit     an offset commit answered NONE is never lost or regressed, across crashes: every later
                     stable fetch of that partition returns it or a later commit (unless a tombstone of it was
                     issued after it: DeleteGroups, offset expiry)
  single_owner       no two members own a partition in the same generation (and no member is told two
                     different assignments for one generation)
  generation_once    a generation of a group becomes Stable at most once, over every instance of the run
  session_expiry     a member expires only once its session has passed on the virtual clock since the last
                     request that reset it (heartbeat, SyncGroup, OffsetCommit answered without error)
  transitions        each state change follows Kafka's table (GroupMetadata.scala, restated here, not imported)
                     and starts from the state the group was last seen in
  parked_answered    every request a live coordinator received is answered, within a bound (two rebalance
                     timeouts, a sync phase, a write); none is left at the end, after a quiet period
  answer_after_ack   a commit answered NONE was acknowledged by Kafka before the answer; so was the group
                     record of a generation whose SyncGroup was answered NONE
  durable_delete     a DeleteGroups or OffsetDelete answered NONE stays done across crashes: a reload shows
                     neither the deleted group's record nor its deleted offsets (unless written again since)
  reload_equals_acked after a (re)load, each group's offsets and record are what Kafka acknowledged (or a later
                     write that may have landed: timed out, failed after append, in flight at the crash);
                     before a crash, memory holds nothing Kafka did not acknowledge or is not writing;
                     for a consumer group, record by record (types 3, 5-8, 16: its epochs, each member's
                     subscription, target and current assignment, its resolved regular expressions)
  consumer_owner     (consumer protocol) a partition goes to a member only once its previous owner revoked it:
                     no consumer still owning it is a member of the group the coordinator answers for, and
                     no two members hold it (assigned or pending revocation) in the coordinator's group
  member_epoch       (consumer protocol) the epochs a member is told never go back, and within one epoch it
                     never gains a partition after it lost one (a new assignment after a revocation comes with
                     a new epoch: the epoch fences the member's older commits)
  txn_offsets        (clients' transactions) an offset a transaction committed with TxnOffsetCommit is visible
                     (OffsetFetch) only once its COMMIT marker is in the log, never if it aborted (EndTxn abort,
                     a timeout, a fenced producer); once committed it is never lost or regressed across crashes
                     and failovers (unless a tombstone was issued after); a require_stable fetch is answered
                     UNSTABLE_OFFSET_COMMIT while a TxnOffsetCommit answered NONE awaits its marker (unless a
                     tombstone of its partition was issued once its batch landed: that drops it); after the
                     last reload no transaction is still pending
  txn_verification   (clients' transactions) a TxnOffsetCommit the group refuses is answered with the error of
                     the transaction's verification when the transaction coordinator refused it (restated from
                     Kafka's TransactionCoordinator, not imported), with the group's error when it verified, and
                     with COORDINATOR_NOT_AVAILABLE when it could not be asked; never without asking
  no_errors          no request raises, no exception is logged or reaches the loop, no client hears an error
                     a classic consumer cannot expect (UNKNOWN_SERVER_ERROR, ...), the loop never gets stuck
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from coordinator.group.metadata import GroupMetadata
from coordinator.group.modern.group import ConsumerGroup
from coordinator.group.modern.records import (CurrentAssignmentRecord, GroupEpochRecord, MemberMetadataRecord,
                                              PER_MEMBER_TYPES, Partitions, RecordType, RegexRecord,
                                              TargetAssignmentEpochRecord, TargetAssignmentRecord, Tombstone)
from coordinator.storage import consumer_records
from coordinator.group.state import GroupState
from coordinator.group.status import ShardStatus
from coordinator.storage.records import (OffsetCommitKey, decode_group_metadata_value, decode_key,
                                        decode_offset_commit_value)
from protocol.consumer_protocol import decode_assignment
from protocol.error_codes import Errors
from simulator.history import Event, History
from simulator.ledger import CONSUMER, Key, Ledger

if TYPE_CHECKING:
    from simulator.client_txns import Verification
    from simulator.instance import CoordinatorInstance, Pending

# Kafka 3.9 GroupMetadata.scala, validPreviousStates: target <- allowed sources.
KAFKA_TRANSITIONS: dict[str, frozenset[str]] = {
    "Dead": frozenset({"Stable", "PreparingRebalance", "CompletingRebalance", "Empty", "Dead"}),
    "CompletingRebalance": frozenset({"PreparingRebalance"}),
    "Stable": frozenset({"CompletingRebalance"}),
    "PreparingRebalance": frozenset({"Stable", "CompletingRebalance", "Empty"}),
    "Empty": frozenset({"PreparingRebalance"}),
}

INVARIANTS = ("durable_commit", "durable_delete", "single_owner", "generation_once", "session_expiry",
              "transitions", "parked_answered", "answer_after_ack", "reload_equals_acked", "no_errors",
              "single_writer", "consumer_owner", "member_epoch", "txn_offsets", "txn_verification")
TXN_GROUP_PREFIX = "txn-group-"  # the groups of the transactional applications (checked by txn_offsets alone)
TxnKey = tuple[str, int]  # (transactional id, the transaction's number)
# Answers that say the instance does not serve the group's partition (anything else is served)
NOT_SERVED = frozenset({"NOT_COORDINATOR", "COORDINATOR_LOAD_IN_PROGRESS", "COORDINATOR_NOT_AVAILABLE"})
MAX_VIOLATIONS = 20
# a refused TxnOffsetCommit answered before the verification (the partition not served, loading) or when the
# transaction coordinator could not be asked (its errors, no answer: the client retries)
_UNVERIFIED = frozenset({Errors.NOT_COORDINATOR, Errors.COORDINATOR_NOT_AVAILABLE, Errors.COORDINATOR_LOAD_IN_PROGRESS})
# the group's refusals of a generation that is gone (a member it does not have; no group at all)
_GROUP_REFUSALS = frozenset({Errors.UNKNOWN_MEMBER_ID, Errors.ILLEGAL_GENERATION})
# The longest a request may stay parked: two rebalance timeouts (a join phase nobody completes is given another),
# the initial rebalance delay, a sync phase and a write's timeout. The scenarios keep rebalance.timeout.ms <= 30 s.
PARKED_AT_MOST_MS = 2 * 30_000 + 3_000 + 30_000 + 5_000 + 10_000
# A TxnOffsetCommit may also wait for the transaction coordinator: FindCoordinator, DescribeTransactions,
# AddPartitionsToTxn (and their FindCoordinator), each tried twice with the relay's 30 s upstream timeout
TXN_OFFSET_COMMIT_AT_MOST_MS = PARKED_AT_MOST_MS + 4 * 2 * 30_000


@dataclass(frozen=True)
class Violation:
    invariant: str
    message: str
    t_ms: int
    seq: int

    def line(self) -> str:
        return f"[{self.invariant}] t={self.t_ms / 1000:.3f}s event#{self.seq}: {self.message}"


class Checkers:
    def __init__(self, history: History, ledger: Ledger, now_ms: Any) -> None:
        self.history = history
        self.ledger = ledger
        self.now_ms = now_ms
        self.violations: list[Violation] = []
        # (group, topic, partition) -> (offset, write id) of the last commit answered NONE
        self._must_keep: dict[tuple[str, str, int], tuple[int, int]] = {}
        # every such commit as (when its answer reached the client, offset, write id), in that order
        self._kept_since: dict[tuple[str, str, int], list[tuple[int, int, int]]] = {}
        self._owners: dict[tuple[str, int, int], dict[tuple[str, int], str]] = {}
        self._assignments: dict[tuple[str, int, int, str], tuple[tuple[str, int], ...]] = {}
        self._stable: set[tuple[str, int, int]] = set()
        self._states: dict[tuple[int, str], str] = {}
        # A deleted (Dead) group id starts a new life when used again, with generations from 0: keyed apart.
        self._lives: dict[str, int] = {}
        self._session_reset_ms: dict[str, int] = {}
        self._deleted: dict[Key, int] = {}  # key -> the last write issued when its deletion was answered NONE
        self.cluster: Any = None  # the Simulation, for the instances running now (single_writer)
        # (instance, partition) -> the writes issued before its last load of the partition
        self._loaded_before: dict[tuple[str, int], int] = {}
        # consumer protocol: group -> client -> (member id, the partitions it owns now)
        self._claims: dict[str, dict[str, tuple[str, frozenset[tuple[str, int]]]]] = {}
        # (group, its life, member) -> (the last epoch told, the assignment told in it, whether it lost one in it)
        self._member_epochs: dict[tuple[str, int, str], tuple[int, frozenset[tuple[str, int]], bool]] = {}
        self._consumer_group_lives: dict[str, int] = {}
        # the member ids of consumer-protocol clients (they make them up)
        self.consumer_protocol_members: set[str] = set()
        # SyncGroup answers a consumer group gave to a classic member, until the client hears them (by id)
        self._in_consumer_group: dict[int, Any] = {}
        # SyncGroup answers a consumer group made for a classic member, until they go out (by id): (answer, group,
        # when it was made)
        self._made_in_consumer_group: dict[int, tuple[Any, Any, int]] = {}
        # (instance, group, member) -> when a heartbeat or a load last restarted its session
        self._consumer_session_ms: dict[tuple[str, str, str], int] = {}
        # clients' transactions: (group, topic, partition, offset) -> the transaction whose batch carried it
        self._txn_values: dict[tuple[str, str, int, int], TxnKey] = {}
        self._txn_offsets: dict[TxnKey, list[tuple[str, str, int, int]]] = {}
        self._txn_fate: dict[TxnKey, bool] = {}  # committed or aborted, once its markers are in the log
        # (group, topic, partition) -> (marker time, offset, writes issued when its batch landed) of each committed
        # transaction
        self._txn_committed: dict[Key, list[tuple[int, int, int]]] = {}
        # (group, topic, partition) -> (answer time, transaction, writes issued when its batch landed, offset) of
        # TxnOffsetCommits answered NONE
        self._txn_answered: dict[Key, list[tuple[int, TxnKey, int, int]]] = {}
        # (group, topic, partition, offset) -> (state partition, log offset) of each batch that carried it
        self._txn_landings: dict[tuple[str, str, int, int], list[tuple[int, int]]] = {}
        # (group, topic, partition) -> (state partition, log offset) of each of our tombstones of it in the log
        self._txn_tombstones: dict[Key, list[tuple[int, int]]] = {}
        # committed offsets that a tombstone between their batch and the COMMIT marker dropped (never current)
        self._txn_dropped: set[tuple[str, str, int, int]] = set()
        # (group, topic, partition, offset) -> the writes issued when its latest batch landed
        self._txn_landed_mark: dict[tuple[str, str, int, int], int] = {}
        # (instance, group) whose classic group goes Dead next because the group turns consumer (not a new life)
        self._converting: set[tuple[int, str]] = set()
        history.listen(("state", "expired", "converted", "replaced"), self._see)

    # --- reporting --------------------------------------------------------------------------------------------
    def violation(self, invariant: str, message: str) -> None:
        assert invariant in INVARIANTS, invariant
        if len(self.violations) < MAX_VIOLATIONS:
            self.violations.append(Violation(invariant, message, self.now_ms(), self.history.count))
            self.history.record("VIOLATION", invariant=invariant, message=message)

    # --- events from the history ------------------------------------------------------------------------------
    def _see(self, event: Event) -> None:
        kind = event.kind
        if kind == "state":
            self._state_change(event.fields)
        elif kind == "expired":
            self._expired(event.fields)
        elif kind == "converted":
            self._converted(event.fields)
        elif kind == "replaced":
            self._replaced(event.fields)

    def _replaced(self, f: dict[str, Any]) -> None:
        """An Empty group gave way to a new one of the other type: its generations (epochs) start again, a new
        life of the group id (as after a deletion), in both directions: a consumer group replaced by a classic
        group is deleted (Kafka's maybeDeleteEmptyConsumerGroup), and a consumer group made later of that classic
        group starts its epochs from the classic group's generation (ConsumerGroup.fromClassicGroup), so a member
        id of the old one may be told a lower epoch (seeds 967, 1086 of --protocol upgrade). A new classic group
        starts Empty."""
        group = f["group"]
        self._lives[group] = self._lives.get(group, 0) + 1
        self._consumer_group_lives[group] = self._consumer_group_lives.get(group, 0) + 1
        if f["to"] == "classic":
            self._states[(f["inst"], group)] = "Empty"

    def group_deleted(self, group_id: str) -> None:
        """The group id was deleted (DeleteGroups, or an Empty group retired with its offsets). A consumer group
        made of it later starts a new life for member_epoch: its epochs start again from 1, and a member id of
        the old group (fenced meanwhile, rejoining with epoch 0) may be told a lower epoch, as in Kafka (seed 760
        of --protocol upgrade). A classic group's deletion is its Dead (`_state_change`)."""
        self._consumer_group_lives[group_id] = self._consumer_group_lives.get(group_id, 0) + 1

    def _converted(self, f: dict[str, Any]) -> None:
        """The group id changed type on an instance. To consumer: its classic group goes Dead next (unloaded, not
        deleted: the consumer group's epochs go on from its generation, so it starts no new life). To classic: the
        classic group is made in the state (Stable) the event names, at the consumer group's epoch."""
        key = (f["inst"], f["group"])
        if f["to"] == "consumer":
            self._converting.add(key)
        else:
            self._converting.discard(key)
            self._states[key] = f["state"]

    def _state_change(self, f: dict[str, Any]) -> None:
        group, old, new, gen = f["group"], f["old"], f["new"], f["gen"]
        if old not in KAFKA_TRANSITIONS.get(new, ()):
            self.violation("transitions", f"group {group}: {old} -> {new} is not in Kafka's table")
        key = (f["inst"], group)
        last = self._states.get(key)
        if last is not None and last != old:
            self.violation("transitions", f"group {group}: moved from {old} but was last seen {last}")
        self._states[key] = new
        life = self._lives.get(group, 0)
        if new == "Stable":
            if (group, life, gen) in self._stable:
                self.violation("generation_once", f"group {group} generation {gen} became Stable twice")
            self._stable.add((group, life, gen))
        elif new == "Dead":
            del self._states[key]
            if key in self._converting:
                self._converting.discard(key)
            else:
                self._lives[group] = life + 1

    def _expired(self, f: dict[str, Any]) -> None:
        member, session_ms = f["member"], f["session_ms"]
        reset_ms = self._session_reset_ms.get(member)
        if reset_ms is not None and self.now_ms() - reset_ms < session_ms:
            self.violation("session_expiry", f"member {member} of {f['group']} expired "
                                             f"{self.now_ms() - reset_ms} ms after its session was reset "
                                             f"(session.timeout.ms={session_ms})")

    # --- from the instances -----------------------------------------------------------------------------------
    def answered(self, instance: CoordinatorInstance, pending: Pending, response: Any, error_summary: str = "NONE"
                 ) -> None:
        api = pending.api
        if (getattr(instance, "ownership", None) is not None and pending.group_id
                and not set(error_summary.split(",")) & NOT_SERVED
                and not (error_summary == "REQUEST_TIMED_OUT" and pending.taken_in_alone)):
            self._one_server(instance, instance.runtime.partition_for(pending.group_id), pending.api)
        waited_ms = self.now_ms() - pending.arrived_ms
        if waited_ms > (TXN_OFFSET_COMMIT_AT_MOST_MS if api == "txn_offset_commit" else PARKED_AT_MOST_MS):
            self.violation("parked_answered", f"{api} from {pending.client} was answered after {waited_ms} ms")
        error = getattr(response, "error_code", None)
        resets = (api == "heartbeat" and error in (Errors.NONE, Errors.REBALANCE_IN_PROGRESS)
                  or api == "sync_group" and error == Errors.NONE
                  or api == "commit_offsets" and any(p.error_code == Errors.NONE
                                                     for t in response.topics for p in t.partitions))
        made = self._made_in_consumer_group.pop(id(response), None) if api == "sync_group" else None
        if api == "sync_group" and error == Errors.NONE and pending.generation is not None:
            runtime = getattr(instance, "runtime", None)
            partition = 0 if runtime is None else runtime.partition_for(pending.group_id)
            if made is not None and made[0] is response:  # a classic member of a consumer group (an online upgrade)
                self._classic_member_synced(instance, made[1], pending, response)
            else:
                self._sync_answered(instance.name, pending.group_id, pending.generation,
                                    self._loaded_before.get((instance.name, partition), 0))
        if (api == "commit_offsets" and pending.member_id in self.consumer_protocol_members
                and "ILLEGAL_GENERATION" in error_summary.split(",")):
            # a classic group's answer (the group went classic while the member was away); a consumer group
            # answers a consumer-protocol member's commit with STALE_MEMBER_EPOCH, UNKNOWN_MEMBER_ID, ...
            runtime = getattr(instance, "runtime", None)
            if runtime is not None and runtime.shard_for(pending.group_id).consumer_groups.get(pending.group_id):
                self.violation("no_errors", f"{instance.name} answered ILLEGAL_GENERATION to {pending.client}'s "
                                            f"commit while {pending.group_id} is a consumer group")
        if api == "consumer_group_heartbeat":
            self.consumer_heartbeat_answered(instance, pending, response)
            if error == Errors.GROUP_ID_NOT_FOUND:
                self._not_a_consumer_group(instance, pending)
        if resets and pending.member_id:
            # a commit resets the session when it is handled, before its write; a parked SyncGroup when answered;
            # one a consumer group answers when it is made
            self._session_reset_ms[pending.member_id] = (
                made[2] if made is not None and made[0] is response
                else self.now_ms() if api == "sync_group" else pending.arrived_ms)

    # --- the consumer protocol --------------------------------------------------------------------------------
    def claim(self, group_id: str, client: str, member_id: str, owned: frozenset[tuple[str, int]]) -> None:
        """What a consumer owns from now on (it acts on these partitions: fetches, commits)."""
        claims = self._claims.setdefault(group_id, {})
        if owned:
            claims[client] = (member_id, owned)
        else:
            claims.pop(client, None)

    def synced_in_consumer_group(self, response: Any, group: Any) -> None:
        """A consumer group made this SyncGroup answer for a classic member (classicGroupSyncToConsumerGroup). It
        goes out once the group's earlier writes are acknowledged, and the group may have turned classic by then
        (seed 1394 of --protocol upgrade: a downgrade while it waited): it is judged as the consumer group's answer
        all the same, as Kafka's runtime sends it, and the member's session was reset when it was made (the
        consumer group's classic session timer; a downgrade meanwhile arms the classic group's from then)."""
        self._made_in_consumer_group[id(response)] = (response, group, self.now_ms())

    def _classic_member_synced(self, instance: CoordinatorInstance, group: Any, pending: Pending,
                               response: Any) -> None:
        """A SyncGroup of a classic member inside a consumer group, answered NONE. Its generation is its member
        epoch (Kafka's classicGroupSyncToConsumerGroup), which it shares with nobody: judged as a consumer-protocol
        member's assignment (member_epoch: within an epoch it only shrinks while partitions are revoked;
        consumer_owner: nobody still owning them), not by single_owner, which `assigned` then skips. Its record
        is the consumer group's, written by its JoinGroup (not a classic group record: answer_after_ack's)."""
        assert pending.generation is not None
        given: frozenset[tuple[str, int]] = frozenset()
        if response.assignment:
            _, assignment = decode_assignment(response.assignment)
            given = frozenset((topic, p) for topic, partitions in assignment.partitions for p in partitions)
        self._in_consumer_group[id(response)] = response
        self._member_epoch(pending.group_id, pending.member_id, pending.generation, given)
        self._given(instance, group, pending.group_id, pending.member_id, given)

    def _not_a_consumer_group(self, instance: CoordinatorInstance, pending: Pending) -> None:
        """GROUP_ID_NOT_FOUND to a ConsumerGroupHeartbeat (the client gives up, as Java's does) only when the group
        is not a consumer group: with an epoch, a classic group (downgraded while the member was away) or none
        (deleted); joining (epoch 0), a classic group that cannot be converted — in these scenarios only one in
        its first rebalance, no protocol chosen yet (Kafka's ConsumerGroup.fromClassicGroup reads the members'
        metadata of the group's protocol: it has none)."""
        runtime = getattr(instance, "runtime", None)
        if runtime is None:
            return
        shard = runtime.shard_for(pending.group_id)
        classic = shard.groups.get(pending.group_id)
        if shard.consumer_groups.get(pending.group_id) is not None:
            why = "it is a consumer group"
        elif pending.generation == 0 and (classic is None or not classic.members or classic.protocol_name is not None):
            why = "its classic group can be converted" if classic is not None and classic.members else "it has no group"
        else:
            return
        self.violation("no_errors", f"{instance.name} answered GROUP_ID_NOT_FOUND to {pending.client} (epoch "
                                    f"{pending.generation}) of {pending.group_id}, but {why}")

    def made_classic(self, group_id: str, assignments: dict[str, Any]) -> None:
        """A consumer group became a classic group (a downgrade, or a failed upgrade's classic group restored): each
        classic member is assigned what the classic group says — Kafka's ClassicGroup.fromConsumerGroup writes
        each member's target, not the partitions it has still to revoke. From then on classic-protocol rules hold
        for them (eager: everything is revoked at the rejoin the rebalance asks for; a later upgrade takes these
        assignments as what each member owns): so what a member's client still owns beyond it is not protected by
        consumer_owner any more, until the client is assigned again."""
        claims = self._claims.get(group_id, {})
        for client, (member_id, owned) in list(claims.items()):
            if member_id in assignments:
                kept = owned & frozenset((topic, p) for topic, ps in assignments[member_id] for p in ps)
                if kept:
                    claims[client] = (member_id, kept)
                else:
                    del claims[client]

    def consumer_heartbeat_answered(self, instance: CoordinatorInstance, pending: Pending, response: Any) -> None:
        if response.error != Errors.NONE or response.member_epoch < 0:
            return
        runtime = instance.runtime
        group_id, member_id = pending.group_id, response.member_id or pending.member_id
        group = runtime.shard_for(group_id).consumer_groups.get(group_id)
        topics = runtime.consumer_groups.topics
        given: frozenset[tuple[str, int]] | None = None
        if response.assignment is not None:
            given = frozenset((image.name, p) for tid, ps in response.assignment.items()
                              if (image := topics.by_id(tid)) is not None for p in ps)
        self._member_epoch(group_id, member_id, response.member_epoch, given)
        if group is None:
            return
        self._given(instance, group, group_id, member_id, given)

    def _given(self, instance: CoordinatorInstance, group: Any, group_id: str, member_id: str,
               given: frozenset[tuple[str, int]] | None) -> None:
        """consumer_owner: what the coordinator's consumer group just gave a member (of either protocol), against
        what the other members' clients still own, and the group's holders."""
        if given:
            for client, (other, owned) in self._claims.get(group_id, {}).items():
                taken = owned & given
                if other != member_id and other in group.members and taken:
                    self.violation("consumer_owner", f"{instance.name} gave {sorted(taken)} of {group_id} to "
                                                     f"{member_id} while {client} (member {other}) still owns "
                                                     "them and has not revoked them")
        holders: dict[tuple[Any, int], str] = {}
        for member in group.members.values():
            for partitions in (member.assigned, member.pending_revocation):
                for tid, ps in partitions.items():
                    for p in ps:
                        holder = holders.setdefault((tid, p), member.member_id)
                        if holder != member.member_id:
                            self.violation("consumer_owner", f"{instance.name}: partition {p} of topic {tid} of "
                                                             f"{group_id} is held by {holder} and "
                                                             f"{member.member_id}")

    def _member_epoch(self, group_id: str, member_id: str, epoch: int,
                      given: frozenset[tuple[str, int]] | None) -> None:
        key = (group_id, self._consumer_group_lives.get(group_id, 0), member_id)
        last = self._member_epochs.get(key)
        if last is None or epoch > last[0]:
            kept = given if given is not None else (last[1] if last is not None else frozenset())
            self._member_epochs[key] = (epoch, kept, False)
            return
        last_epoch, last_given, lost = last
        if epoch < last_epoch:
            self.violation("member_epoch", f"member {member_id} of {group_id} was told epoch {epoch} after "
                                           f"{last_epoch}")
            return
        if given is None or given == last_given:
            return
        if lost and given - last_given:
            self.violation("member_epoch", f"member {member_id} of {group_id} gained {sorted(given - last_given)} "
                                           f"in epoch {epoch} after it lost partitions in that epoch")
        self._member_epochs[key] = (epoch, given, lost or bool(last_given - given))

    def consumer_session_restarted(self, instance: str, group_id: str, member_ids: Any) -> None:
        now = self.now_ms()
        for member_id in member_ids:
            self._consumer_session_ms[(instance, group_id, member_id)] = now

    def consumer_session_expired(self, instance: str, group_id: str, member_id: str, session_ms: int) -> None:
        restarted = self._consumer_session_ms.get((instance, group_id, member_id))
        if restarted is not None and self.now_ms() - restarted < session_ms:
            self.violation("session_expiry", f"{instance} fenced member {member_id} of {group_id} "
                                             f"{self.now_ms() - restarted} ms after its last heartbeat "
                                             f"(group.consumer.session.timeout.ms={session_ms})")

    def _one_server(self, instance: CoordinatorInstance, partition: int, what: str) -> None:
        """single_writer: no other running instance serves the partition of a group this one just served."""
        other = self._other_server(instance, partition)
        if other is not None:
            self.violation("single_writer", f"{instance.name} served {what} of state partition {partition} "
                                            f"while {other.name} serves it too")

    def _other_server(self, instance: CoordinatorInstance, partition: int) -> CoordinatorInstance | None:
        for other in self.cluster.coordinators if self.cluster is not None else ():
            if (other is not None and other is not instance and other.alive and not other.paused
                    and other.ownership is not None and other.ownership.serving(partition)):
                return other
        return None

    def taken_in(self, instance: CoordinatorInstance, pending: Pending) -> None:
        """A request the instance reads now (a paused one reads it when it wakes): whether it serves the group's
        partition alone at this moment. A write it takes in then was checked by the group as its owner's; the
        write's timeout, answered later (REQUEST_TIMED_OUT), tells only that its outcome is unknown — whoever
        serves the partition by then (the transactional fence decides whether the write sticks)."""
        ownership = getattr(instance, "ownership", None)
        if ownership is None or not pending.group_id:
            return
        partition = instance.runtime.partition_for(pending.group_id)
        pending.taken_in_alone = (ownership.serving(partition) and not ownership.guard.suspended
                                  and self._other_server(instance, partition) is None)

    def _sync_answered(self, instance: str, group_id: str, generation: int, loaded_before: int) -> None:
        """The generation's group record was acknowledged — or, written by an earlier instance or before this
        one last loaded the partition, may have landed and was loaded from the log."""
        if not self.ledger.group_generation_stored(group_id, generation, instance, loaded_before):
            self.violation("answer_after_ack", f"SyncGroup of {group_id} generation {generation} answered NONE "
                                               "before its group record was acknowledged")

    def after_load(self, instance: CoordinatorInstance, partitions: set[int] | None = None) -> None:
        """Every key the ledger knows (of the partitions loaded), against what the instance materialised."""
        groups = instance.runtime.groups
        runtime = instance.runtime

        def loaded(group_id: str) -> bool:
            return partitions is None or runtime.partition_for(group_id) in partitions

        self._deletions_hold(groups, loaded)
        for partition in (range(runtime.num_partitions) if partitions is None else partitions):
            self._loaded_before[(instance.name, partition)] = len(self.ledger.writes)
        for group_id in list(groups):
            if loaded(group_id):
                self._states[(instance.number, group_id)] = groups[group_id].state.value
        ownership = getattr(instance, "ownership", None)
        if partitions is not None and ownership is not None:
            # A load serves only what the instance still holds once it is done: a partition given up meanwhile
            # (lost, revoked, fenced) stays out of service, and one loaded while the zombie guard is suspended is
            # unloaded before anything can be answered from it (Ownership._load; requests meanwhile meet the guard)
            for partition in partitions:
                if ownership.serving(partition) and not ownership.guard.suspended:
                    self._one_server(instance, partition, "a load")
        self._consumer_groups_hold(instance, loaded, "loaded")
        for key in [k for k in self.ledger.by_key if loaded(k[0]) and not k[0].startswith(TXN_GROUP_PREFIX)
                    and len(k) != 4]:
            group = groups.get(key[0])
            allowed, _ = self.ledger.candidates(key)
            if len(key) == 3:
                value = None if group is None else group.offsets.get((key[1], key[2]))
                shown = None if value is None else value.offset
                offsets = [None if v is None else decode_offset_commit_value(v).offset for v in allowed]
                if shown not in offsets:
                    self.violation("reload_equals_acked",
                                   f"{key} loaded as {shown}, Kafka acknowledged {offsets[-1] if offsets else None}"
                                   f" (possible: {offsets})")
            else:
                shown_group = _group_view(group)
                views = [None if v is None else _record_view(v) for v in allowed]
                if shown_group not in views:
                    self.violation("reload_equals_acked",
                                   f"group {key[0]} loaded as {shown_group}, possible: {views}")

    def _consumer_groups_hold(self, instance: CoordinatorInstance, in_scope: Any, when: str,
                              reader: Any = None) -> None:
        """Each record key of the consumer groups in scope, as memory has it, against what the log may hold: the
        keys the ledger knows and those of what memory holds (a key never written may only be absent).
        `reader(group_id)`: (producer, first write id it cannot know) for memory before a crash, as `candidates`."""
        runtime = instance.runtime
        keys: set[Key] = {k for k in self.ledger.by_key if len(k) == 4 and in_scope(k[0])}
        for shard in runtime.shards:
            for group_id, group in shard.consumer_groups.items():
                if in_scope(group_id):
                    keys.update(_consumer_keys(group))
        for key in sorted(keys, key=repr):
            group_id, _, record_type, part = key  # type: ignore[misc]
            shown = _consumer_view(runtime.shard_for(group_id).consumer_groups.get(group_id), record_type, part)
            allowed, _ = self.ledger.candidates(key, *reader(group_id)) if reader is not None else \
                self.ledger.candidates(key)
            views = [None if v is None else _consumer_record_view(key, v) for v in allowed]
            if shown not in views:
                what = RecordType(record_type).name.lower()
                self.violation("reload_equals_acked",
                               f"{when}: consumer group {group_id}'s {what} record{' of ' + part if part else ''} "
                               f"is {shown} in memory; the log may hold only {views}")

    def _deletions_hold(self, groups: Any, loaded: Any) -> None:
        for key, written_before in self._deleted.items():
            if not loaded(key[0]) or key[0].startswith(TXN_GROUP_PREFIX) or self.ledger.written_after(key, written_before):
                continue  # written again since the deletion: its value may be back
            group = groups.get(key[0])
            if len(key) == 3:
                record = None if group is None else group.offsets.get((key[1], key[2]))
                if record is not None:
                    self.violation("durable_delete", f"{key} was deleted (answered NONE) and came back with the "
                                                     f"reload: {record.offset}")
            elif _group_view(group) is not None:
                self.violation("durable_delete", f"group {key[0]} was deleted (answered NONE) and came back with "
                                                 f"the reload: {_group_view(group)}")

    def before_crash(self, instance: CoordinatorInstance) -> None:
        """Memory claims nothing Kafka did not acknowledge and is not still writing."""
        if not instance.loaded:
            return
        ownership = getattr(instance, "ownership", None)
        for group_id, group in list(instance.runtime.groups.items()):
            state_partition = instance.runtime.partition_for(group_id)
            if ownership is not None and not ownership.serving(state_partition):
                continue
            if group_id.startswith(TXN_GROUP_PREFIX):
                continue
            # Memory is what this process loaded and wrote itself: another instance's writes after its load (the
            # partition moved while this one was paused, a zombie that has not noticed yet) are not in it.
            reader = instance.name, self._loaded_before.get((instance.name, state_partition), 0)
            for (topic, partition), record in group.offsets.items():
                key = (group_id, topic, partition)
                allowed, _ = self.ledger.candidates(key, *reader)
                offsets = [None if v is None else decode_offset_commit_value(v).offset for v in allowed]
                if record.offset not in offsets:
                    self.violation("reload_equals_acked", f"before the crash, memory held {key}={record.offset}, "
                                                          f"which Kafka never acknowledged (possible: {offsets})")
            if group.is_in(GroupState.STABLE):
                allowed, _ = self.ledger.candidates((group_id,), *reader)
                views = [None if v is None else _record_view(v) for v in allowed]
                if _group_view(group) not in views:
                    self.violation("reload_equals_acked", f"before the crash, Stable group {group_id} was "
                                                          f"{_group_view(group)}, not acknowledged: {views}")

        consumer_groups = getattr(instance.runtime, "consumer_groups", None)

        def serving(group_id: str) -> bool:  # memory of a shard shut down or given up is gone, not wrong
            partition = instance.runtime.partition_for(group_id)
            if consumer_groups is not None and consumer_groups.repair_owed(group_id):
                return False  # memory ahead of the log while a refused repair waits to be sent again; what is
                # answered from it waits for the repair (answer_after_ack, member_epoch judge the answers)
            return instance.runtime.shard_for(group_id).status is ShardStatus.ACTIVE and (
                ownership is None or ownership.serving(partition))

        def known_to(group_id: str) -> tuple[str, int]:
            partition = instance.runtime.partition_for(group_id)
            return instance.name, self._loaded_before.get((instance.name, partition), 0)

        self._consumer_groups_hold(instance, serving, "before the crash", known_to)


    # --- from the clients -------------------------------------------------------------------------------------
    def committed(self, group_id: str, tp: tuple[str, int], offset: int, client: str) -> None:
        key = (group_id, tp[0], tp[1])
        write = self.ledger.acked_write_of_offset(key, offset)
        if write is None:
            self.violation("answer_after_ack", f"{client}: commit of {key}={offset} answered NONE but Kafka "
                                               "has not acknowledged it")
            return
        previous = self._must_keep.get(key)
        if previous is None or previous[1] < write.write_id:
            self._must_keep[key] = (offset, write.write_id)
            self._kept_since.setdefault(key, []).append((self.now_ms(), offset, write.write_id))

    def fetched(self, group_id: str, tp: tuple[str, int], offset: int, client: str,
                sent_ms: int | None = None) -> None:
        """A stable fetch sent at `sent_ms` must show every commit whose answer NONE reached a client before
        (one answered while the fetch was on its way may or may not be in it: its answer can be late)."""
        key = (group_id, tp[0], tp[1])
        kept = self._must_keep.get(key)
        if kept is not None and sent_ms is not None:
            before = [(o, w) for at_ms, o, w in self._kept_since.get(key, []) if at_ms <= sent_ms]
            kept = before[-1] if before else None
        if kept is None or self.ledger.tombstoned_after(key, kept[1]):
            return
        if offset < kept[0]:
            what = "lost" if offset < 0 else f"regressed to {offset}"
            self.violation("durable_commit", f"{client}: {key} committed {kept[0]} (acknowledged), fetched: {what}")

    def assigned(self, group_id: str, generation: int, member_id: str, owned: list[tuple[str, int]],
                 response: Any = None) -> None:
        """`member_id`: the owner — a static member's group.instance.id, which keeps its assignment when the
        member restarts under a new member id (KIP-345). `response`: the SyncGroup's answer — one a consumer group
        gave (a classic member of a converted group) was judged when it was answered (_classic_member_synced)."""
        if response is not None and self._in_consumer_group.pop(id(response), None) is response:
            return
        life = self._lives.get(group_id, 0)
        previous = self._assignments.setdefault((group_id, life, generation, member_id), tuple(owned))
        if previous != tuple(owned):
            self.violation("single_owner", f"{member_id} of {group_id} generation {generation} was assigned "
                                           f"{previous} and then {tuple(owned)}")
        owners = self._owners.setdefault((group_id, life, generation), {})
        for tp in owned:
            owner = owners.setdefault(tp, member_id)
            if owner != member_id:
                self.violation("single_owner", f"{tp} of {group_id} generation {generation} is owned by "
                                               f"{owner} and {member_id}")

    def deleted(self, group_id: str, partitions: list[tuple[str, int]], group_record: bool,
                sent_at: int | None = None) -> None:
        """A DeleteGroups (group_record) or OffsetDelete was answered NONE for these partitions; `sent_at`: the
        writes issued when it was sent (the ledger's length then)."""
        last = len(self.ledger.writes) - 1
        if group_record:  # a consumer group made again under this id starts from epoch 0
            self._consumer_group_lives[group_id] = self._consumer_group_lives.get(group_id, 0) + 1
        keys: list[Key] = [(group_id, topic, partition) for topic, partition in partitions]
        if group_record:
            keys.append((group_id,))
        for key in keys:
            # A deletion takes effect when it is handled (its tombstone issued), not when its answer arrives: the
            # group may start a new life meanwhile (a JoinGroup while the tombstone awaits its acknowledgement),
            # written after the tombstone, so after it in the log. Judged from the deletion's tombstone, the
            # latest one issued while the request was on its way; from the answer if it wrote none of the key
            # (nothing was stored for it).
            self._deleted[key] = last if sent_at is None else self.ledger.last_tombstone(key, sent_at, last)

    def was_deleted(self, group_id: str) -> bool:
        """Whether a DeleteGroups of the group was answered NONE during the run."""
        return self._consumer_group_lives.get(group_id, 0) > 0

    def unexpected_error(self, client: str, api: str, error: Errors) -> None:
        self.violation("no_errors", f"{client} got {error.name} from {api}")

    # --- clients' transactions ---------------------------------------------------------------------------------
    def txn_offset_landed(self, group_id: str, tp: tuple[str, int], offset: int, txn: TxnKey,
                          at: tuple[int, int] = (0, 0)) -> None:
        """A client's transactional batch carrying this offset is in the log, at `at` (state partition, log
        offset)."""
        key = (group_id, tp[0], tp[1], offset)
        if key not in self._txn_values:
            self._txn_values[key] = txn
            self._txn_offsets.setdefault(txn, []).append(key)
        self._txn_landings.setdefault(key, []).append(at)
        self._txn_landed_mark[key] = len(self.ledger.writes) - 1

    def tombstone_landed(self, partition: int, key: bytes, log_offset: int) -> None:
        """One of our tombstones is in the log (kept for the applications' groups)."""
        decoded = decode_key(key)
        if isinstance(decoded, OffsetCommitKey) and decoded.group.startswith(TXN_GROUP_PREFIX):
            self._txn_tombstones.setdefault((decoded.group, decoded.topic, decoded.partition), []).append(
                (partition, log_offset))

    def _tombstoned_in_log(self, key: tuple[str, str, int, int], until: dict[int, int] | None = None) -> bool:
        """Whether a tombstone of the offset's partition follows every batch that carried it in the log (before
        the marker at `until`, per state partition): Kafka's replay drops a pending offset at a tombstone of its
        partition, so the transaction's COMMIT does not make it current."""
        tombstones = self._txn_tombstones.get(key[:3], [])
        landings = self._txn_landings.get(key, [])
        return bool(landings) and all(
            any(p == partition and offset < t < (until or {}).get(p, 1 << 62) for p, t in tombstones)
            for partition, offset in landings)

    def _deleted_since(self, key: Key, committed: tuple[int, int, int]) -> bool:
        """Whether a tombstone of ours may have deleted a committed offset: issued after its batch landed, or in
        the log after it (before the marker it dropped the pending offset, after it deleted the current one)."""
        group_id, topic, partition = key  # type: ignore[misc]  # an offset's key
        return (self.ledger.tombstoned_after(key, committed[2])
                or self._tombstoned_in_log((group_id, topic, partition, committed[1])))

    def txn_ended(self, transactional_id: str, number: int, commit: bool, markers: dict[int, int] | None = None
                  ) -> None:
        """The transaction's markers are in the log (`markers`: their offsets by state partition)."""
        txn = (transactional_id, number)
        self._txn_fate[txn] = commit
        if commit:
            mark = len(self.ledger.writes) - 1
            for group_id, topic, partition, offset in self._txn_offsets.get(txn, []):
                if markers is not None and self._tombstoned_in_log((group_id, topic, partition, offset), markers):
                    self._txn_dropped.add((group_id, topic, partition, offset))
                    continue
                # a tombstone issued once its batch landed deletes it (dropped pending, or deleted once current)
                landed = self._txn_landed_mark.get((group_id, topic, partition, offset), mark)
                self._txn_committed.setdefault((group_id, topic, partition), []).append((self.now_ms(), offset, landed))

    def txn_offsets_pending(self, group_id: str, offsets: dict[tuple[str, int], int], client: str) -> None:
        """A TxnOffsetCommit of these offsets was answered NONE: its batch must be in the log."""
        for (topic, partition), offset in offsets.items():
            txn = self._txn_values.get((group_id, topic, partition, offset))
            if txn is None:
                self.violation("txn_offsets", f"{client}: TxnOffsetCommit of {(group_id, topic, partition)}="
                                              f"{offset} answered NONE but its batch is not in the log")
                continue
            # A tombstone of ours issued once the batch landed drops the pending offset (Kafka's replay of an offset
            # tombstone removes the partition's pending transactional offsets), even one issued before the answer
            # reached the client: a DeleteGroups handled between the coordinator's answer and the client hearing
            # it (seed 11837). So the mark is where the batch landed, as for a committed offset (`txn_ended`).
            landed = self._txn_landed_mark.get((group_id, topic, partition, offset), len(self.ledger.writes) - 1)
            self._txn_answered.setdefault((group_id, topic, partition), []).append(
                (self.now_ms(), txn, landed, offset))

    def txn_fetched(self, group_id: str, tp: tuple[str, int], offset: int, error: Errors, stable: bool,
                    sent_ms: int, client: str) -> None:
        key: Key = (group_id, tp[0], tp[1])
        if error == Errors.NONE and offset >= 0:
            self._txn_visible(key, offset, f"{client} fetched")
        if not stable or error != Errors.NONE:
            return
        committed = [(at_ms, o, mark) for at_ms, o, mark in self._txn_committed.get(key, []) if at_ms <= sent_ms]
        if committed and offset < committed[-1][1] and not self._deleted_since(key, committed[-1]):
            what = "lost" if offset < 0 else f"regressed to {offset}"
            self.violation("txn_offsets", f"{client}: {key} committed {committed[-1][1]} in a transaction "
                                          f"(COMMIT marker in the log), fetched: {what}")
        for answered_ms, txn, mark, pending in self._txn_answered.get(key, []):
            if (answered_ms <= sent_ms and txn not in self._txn_fate and not self.ledger.tombstoned_after(key, mark)
                    and not self._tombstoned_in_log((group_id, tp[0], tp[1], pending))):
                self.violation("txn_offsets", f"{client}: a require_stable fetch of {key} was answered {offset} "
                                              f"while transaction {txn} has an offset of it pending "
                                              "(UNSTABLE_OFFSET_COMMIT expected)")
                return

    def txn_refused(self, client: str, transactional_id: str, producer_id: int, epoch: int, version: int,
                    partition: int, answers: set[Errors], outcomes: list[Verification]) -> None:
        """A TxnOffsetCommit the group refuses was answered `answers`; `outcomes`: what the transaction
        coordinator said of its transactional id meanwhile (simulator.client_txns.Verification)."""
        allowed = set(_UNVERIFIED)
        for outcome in outcomes:
            if isinstance(outcome, Errors):
                continue  # not verified: COORDINATOR_NOT_AVAILABLE
            expected = verification_answer(outcome, producer_id, epoch, version, partition)
            allowed |= _GROUP_REFUSALS if expected is None else {expected}
        wrong = answers - allowed
        if wrong:
            said = "; ".join(verification_text(o) for o in outcomes) or "nothing (it was not asked)"
            self.violation("txn_verification", f"{client}: TxnOffsetCommit v{version} of {transactional_id} "
                                               f"(producer {producer_id}, epoch {epoch}) answered "
                                               f"{sorted(e.name for e in wrong)}; the transaction coordinator said "
                                               f"{said}: expected one of {sorted(e.name for e in allowed)}")

    def _txn_visible(self, key: Key, offset: int, what: str) -> None:
        group_id, topic, partition = key  # type: ignore[misc]  # an offset's key
        txn = self._txn_values.get((group_id, topic, partition, offset))
        if txn is None:
            self.violation("txn_offsets", f"{what} {key}={offset}, which no transactional batch in the log carries")
        elif txn not in self._txn_fate:
            self.violation("txn_offsets", f"{what} {key}={offset} of transaction {txn} before its COMMIT marker")
        elif not self._txn_fate[txn]:
            self.violation("txn_offsets", f"{what} {key}={offset} of transaction {txn}, which was aborted")
        elif (group_id, topic, partition, offset) in self._txn_dropped:
            self.violation("txn_offsets", f"{what} {key}={offset} of transaction {txn}, which a tombstone of ours "
                                          "dropped: it follows the batch in the log, before the COMMIT marker")

    def txn_final(self, instance: CoordinatorInstance) -> None:
        """After the last reload: every committed transactional offset is there (or a later one, or a tombstone
        came after), nothing aborted shows, and no transaction is still pending (all ended long ago)."""
        runtime = instance.runtime
        for key, committed in self._txn_committed.items():
            group_id, topic, partition = key  # type: ignore[misc]  # an offset's key
            group = runtime.groups.get(group_id)
            record = None if group is None else group.offsets.get((topic, partition))
            if record is None or record.offset < committed[-1][1]:
                if not self._deleted_since(key, committed[-1]):
                    self.violation("txn_offsets", f"{key} committed {committed[-1][1]} in a transaction, after "
                                                  f"the last reload: {None if record is None else record.offset}")
        for group_id, group in list(runtime.groups.items()):
            if group_id.startswith(TXN_GROUP_PREFIX):
                for (topic, partition), record in group.offsets.items():
                    self._txn_visible((group_id, topic, partition), record.offset, "after the last reload:")
        for shard in runtime.shards:
            for group_id in sorted(shard.transactional_offsets.open_by_group):
                self.violation("txn_offsets", f"after the last reload {group_id} still has pending transactional "
                                              "offsets (every transaction ended long before)")

    # --- the end ----------------------------------------------------------------------------------------------
    def finish(self, instance: CoordinatorInstance | None) -> None:
        if instance is not None and instance.alive:
            for pending in instance.pending.values():
                self.violation("parked_answered", f"{pending.api} from {pending.client} (member "
                                                  f"{pending.member_id or '-'}) received at "
                                                  f"{pending.arrived_ms / 1000:.3f}s was never answered")

    def final_offsets(self, instance: CoordinatorInstance) -> None:
        """After the last reload: every commit answered NONE is still there (or was deleted after)."""
        for key, (offset, write_id) in self._must_keep.items():
            if self.ledger.tombstoned_after(key, write_id):
                continue
            group = instance.runtime.groups.get(key[0])
            record = None if group is None else group.offsets.get((key[1], key[2]))
            if record is None or record.offset < offset:
                self.violation("durable_commit", f"{key} committed {offset} (acknowledged), after the last "
                                                 f"reload: {None if record is None else record.offset}")


def verification_answer(described: Any, producer_id: int, epoch: int, version: int, partition: int
                        ) -> Errors | None:
    """What TxnOffsetCommit `version` is answered when the transaction coordinator refuses its verification, or
    None when it verifies. Kafka 4: TransactionCoordinator.handleVerifyPartitionsInTransaction (v0-4: the
    group's state partition must be in the transaction) or handleAddPartitionsToTransaction (v5: adds it) checks
    the producer id (INVALID_PRODUCER_ID_MAPPING, also for an unknown transactional id), the epoch
    (PRODUCER_FENCED, which AddPartitionsToTxnManager hands on as INVALID_PRODUCER_EPOCH) and a transaction being
    completed (CONCURRENT_TRANSACTIONS); a partition not in it is TRANSACTION_ABORTABLE, INVALID_TXN_STATE for
    clients older than v4. `described`: simulator.client_txns.Described, None for an unknown id."""
    if described is None or described.producer_id != producer_id:
        return Errors.INVALID_PRODUCER_ID_MAPPING
    if described.epoch != epoch:
        return Errors.INVALID_PRODUCER_EPOCH
    if described.state in ("PrepareCommit", "PrepareAbort"):
        return Errors.CONCURRENT_TRANSACTIONS
    if version < 5 and partition not in described.partitions:
        return Errors.TRANSACTION_ABORTABLE if version >= 4 else Errors.INVALID_TXN_STATE
    return None


def verification_text(outcome: Verification) -> str:
    """A verification's outcome as the history and the violations say it."""
    if isinstance(outcome, Errors):
        return f"unverified: {outcome.name}"
    if outcome is None:
        return "no such transactional id"
    return (f"{outcome.state} producer {outcome.producer_id} epoch {outcome.epoch} "
            f"partitions {sorted(outcome.partitions)}")


def _group_view(group: GroupMetadata | None) -> tuple[Any, ...] | None:
    """What a group record says, as a comparable tuple (None: no record, or an offsets-only group)."""
    if group is None or (group.generation_id == 0 and not group.members and group.protocol_type is None):
        return None
    members = tuple(sorted((m.member_id, m.assignment) for m in group.members.values()))
    return (group.generation_id, group.leader_id if members else None, members)


def _record_view(value: bytes) -> tuple[Any, ...]:
    record = decode_group_metadata_value(value)
    members = tuple(sorted((m.member_id, m.assignment) for m in record.members))
    return (record.generation, record.leader if members else None, members)


# --- consumer groups, record by record ---------------------------------------------------------------------------
def _partitions(partitions: Partitions) -> tuple[Any, ...]:
    return tuple(sorted((str(topic), tuple(sorted(ps))) for topic, ps in partitions.items() if ps))


def _consumer_keys(group: ConsumerGroup) -> list[Key]:
    group_id = group.group_id
    keys: list[Key] = [(group_id, CONSUMER, int(RecordType.GROUP_METADATA), ""),
                       (group_id, CONSUMER, int(RecordType.TARGET_ASSIGNMENT_METADATA), "")]
    for member_id in {*group.members, *group.targets}:
        keys += [(group_id, CONSUMER, int(kind), member_id) for kind in (
            RecordType.MEMBER_METADATA, RecordType.TARGET_ASSIGNMENT_MEMBER, RecordType.CURRENT_MEMBER_ASSIGNMENT)]
    keys += [(group_id, CONSUMER, int(RecordType.REGULAR_EXPRESSION), regex) for regex in group.resolved_regexes]
    return keys


def _consumer_view(group: ConsumerGroup | None, record_type: int, part: str) -> tuple[Any, ...] | None:
    """What memory says of one record key (None: the key absent, i.e. never written or tombstoned)."""
    if group is None or group.deleted:
        return None
    kind = RecordType(record_type)
    if kind is RecordType.GROUP_METADATA:
        return (group.group_epoch,)
    if kind is RecordType.TARGET_ASSIGNMENT_METADATA:
        return None if group.assignment_epoch == 0 else (group.assignment_epoch,)
    if kind is RecordType.REGULAR_EXPRESSION:
        resolved = group.resolved_regexes.get(part)
        return None if resolved is None else (tuple(resolved.topics), resolved.version)
    if kind is RecordType.TARGET_ASSIGNMENT_MEMBER:
        target = group.targets.get(part)
        return None if target is None else _partitions(target)
    member = group.members.get(part)
    if member is None:
        return None
    if kind is RecordType.MEMBER_METADATA:
        if member.rebalance_timeout_ms < 0:  # every metadata record has one (a join must give it)
            # made by a current-assignment record alone: its metadata record is not in the log (a write of it
            # lost while a later one landed: the open gap of docs/simulation.md), so memory has none either
            return None
        return (member.instance_id, tuple(member.subscribed_topic_names), member.subscribed_topic_regex or None,
                member.server_assignor, member.classic is not None)
    if member.member_epoch <= 0 and not member.assigned and not member.pending_revocation:
        return None  # no current assignment written yet (or tombstoned: the member is leaving)
    return (member.member_epoch, member.previous_member_epoch, int(member.state), _partitions(member.assigned),
            _partitions(member.pending_revocation))


def _consumer_record_view(key: Key, value: bytes) -> tuple[Any, ...] | None:
    """The same view of a record the log may hold."""
    group_id, _, record_type, part = key  # type: ignore[misc]
    kind = RecordType(record_type)
    key_bytes = consumer_records.encode_key(Tombstone(
        kind, group_id, member_id=part if kind in PER_MEMBER_TYPES else None,
        regex=part if kind is RecordType.REGULAR_EXPRESSION else None))
    record = consumer_records.decode(key_bytes, value)
    if isinstance(record, GroupEpochRecord):
        return (record.epoch,)
    if isinstance(record, TargetAssignmentEpochRecord):
        return None if record.assignment_epoch == 0 else (record.assignment_epoch,)
    if isinstance(record, RegexRecord):
        return (tuple(record.topics), record.version)
    if isinstance(record, TargetAssignmentRecord):
        return _partitions(record.partitions)
    if isinstance(record, MemberMetadataRecord):
        return (record.instance_id, tuple(record.subscribed_topic_names), record.subscribed_topic_regex or None,
                record.server_assignor, record.classic is not None)
    if isinstance(record, CurrentAssignmentRecord):
        if record.member_epoch <= 0 and not record.assigned and not record.pending_revocation:
            return None
        return (record.member_epoch, record.previous_member_epoch, record.state, _partitions(record.assigned),
                _partitions(record.pending_revocation))
    return None
