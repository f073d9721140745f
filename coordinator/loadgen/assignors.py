"""The leader's partition assignors, as Kafka's consumer runs them (the coordinator never looks inside).

- `range` (RangeAssignor): per topic, partitions in order, members sorted by member id; each member gets
  `n // m` and the first `n % m` members one more.
- `cooperative-sticky` (CooperativeStickyAssignor, incremental rebalancing over the classic protocol, KIP-429):
  balanced counts (each member gets floor or ceil of n/m), members keep what they own up to their quota, the
  rest goes to those below it; a partition that moves from one live member to another is *withheld* this round
  (the owner's assignment simply lacks it). The owner revokes it and rejoins at once; the next round gives it to
  its new owner. So no partition is ever owned by two members, and unaffected members keep consuming.

Both take `{member_id: Subscription}` and return `{member_id: Assignment}`.
"""

from __future__ import annotations

from protocol.consumer_protocol import Assignment, Subscription, TopicPartitions

RANGE = "range"
COOPERATIVE_STICKY = "cooperative-sticky"
ASSIGNORS = (RANGE, COOPERATIVE_STICKY)


def assign(name: str, subscriptions: dict[str, Subscription], partitions: dict[str, int]) -> dict[str, Assignment]:
    """`partitions`: topic → partition count (the leader learned it from Metadata or the admin client)."""
    if name == RANGE:
        return range_assign(subscriptions, partitions)
    if name == COOPERATIVE_STICKY:
        return cooperative_sticky_assign(subscriptions, partitions)
    raise ValueError(f"unknown assignor {name!r}; known: {', '.join(ASSIGNORS)}")


def range_assign(subscriptions: dict[str, Subscription], partitions: dict[str, int]) -> dict[str, Assignment]:
    owned: dict[str, dict[str, list[int]]] = {member: {} for member in subscriptions}
    for topic in sorted({t for s in subscriptions.values() for t in s.topics}):
        members = sorted(m for m, s in subscriptions.items() if topic in s.topics)
        count = partitions.get(topic, 0)
        per_member, extra = divmod(count, len(members))
        start = 0
        for index, member in enumerate(members):
            length = per_member + (1 if index < extra else 0)
            if length:
                owned[member][topic] = list(range(start, start + length))
            start += length
    return {member: Assignment(_as_partitions(topics)) for member, topics in owned.items()}


def cooperative_sticky_assign(subscriptions: dict[str, Subscription],
                              partitions: dict[str, int]) -> dict[str, Assignment]:
    """One topic set shared by all members (what the simulator runs); per topic, sticky and balanced."""
    result: dict[str, dict[str, list[int]]] = {member: {} for member in subscriptions}
    for topic in sorted({t for s in subscriptions.values() for t in s.topics}):
        members = sorted(m for m, s in subscriptions.items() if topic in s.topics)
        for member, assigned in _sticky_topic(topic, members, subscriptions, partitions.get(topic, 0)).items():
            if assigned:
                result[member][topic] = assigned
    return {member: Assignment(_as_partitions(topics)) for member, topics in result.items()}


def _sticky_topic(topic: str, members: list[str], subscriptions: dict[str, Subscription],
                  count: int) -> dict[str, list[int]]:
    base, extra = divmod(count, len(members))
    owners: dict[int, str] = {}
    for member in members:  # a partition claimed twice (stale generations) goes to neither claim: reassign it
        for owned_topic, ids in subscriptions[member].owned_partitions:
            if owned_topic != topic:
                continue
            for partition in ids:
                if partition < count:
                    owners[partition] = "" if partition in owners else member
    kept: dict[str, list[int]] = {member: [] for member in members}
    for partition in range(count):
        owner = owners.get(partition, "")
        if owner:
            kept[owner].append(partition)
    # quotas: the members owning most keep the ceil slots, so as little as possible moves
    by_owned = sorted(members, key=lambda m: (-len(kept[m]), m))
    quota = {member: base + (1 if index < extra else 0) for index, member in enumerate(by_owned)}
    free = [p for p in range(count) if not owners.get(p)]
    for member in members:
        surplus = kept[member][quota[member]:]
        kept[member] = kept[member][: quota[member]]
        free.extend(surplus)
    moved_from: dict[int, str] = {p: owners[p] for p in free if owners.get(p)}
    free.sort()
    final: dict[str, list[int]] = {member: list(kept[member]) for member in members}
    for member in members:
        while len(final[member]) < quota[member] and free:
            partition = free.pop(0)
            if moved_from.get(partition, member) == member:
                final[member].append(partition)
            else:  # owned by another live member: withhold for one round, it rejoins after revoking it
                final[member].append(-partition - 1)
    return {member: sorted(p for p in assigned if p >= 0) for member, assigned in final.items()}


def _as_partitions(topics: dict[str, list[int]]) -> TopicPartitions:
    return tuple((topic, tuple(ids)) for topic, ids in sorted(topics.items()))


def revoked(owned: TopicPartitions, assigned: TopicPartitions) -> TopicPartitions:
    """What a member owned and was not given again (cooperative: it must rejoin after giving these up)."""
    now = {(topic, p) for topic, ids in assigned for p in ids}
    gone: dict[str, list[int]] = {}
    for topic, ids in owned:
        for partition in ids:
            if (topic, partition) not in now:
                gone.setdefault(topic, []).append(partition)
    return _as_partitions(gone)
