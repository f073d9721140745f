"""Synthetic event histories written straight to the event topic (benchmark, `--follow` tests, trying the report).

    python -m analytics.synthetic --bootstrap-server HOST:PORT [--topic T] [--events 5000] [--groups 6]

The events follow the coordinator's own order for a rebalance (member_joined / member_failed / member_left →
state_change to PreparingRebalance → rebalance_started → CompletingRebalance → Stable → rebalance_completed), so
every table has something to count. Each group's clock advances on its own; `expected()` gives the counts.
"""

from __future__ import annotations

import heapq
import json
import random
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from coordinator.telemetry.event_schema import new_event

if TYPE_CHECKING:
    from confluent_kafka import Producer

REBALANCE_EVENTS = 6  # a cause + 5 (state changes and rebalance events) per rebalance


@dataclass
class Expected:
    events: int = 0
    rebalances: Counter[str] = field(default_factory=Counter)  # per group
    failed: Counter[str] = field(default_factory=Counter)
    duration_total_ms: Counter[str] = field(default_factory=Counter)


def history(events: int, groups: int = 20, start_ms: int | None = None, seed: int = 7,
            expected: Expected | None = None) -> Iterator[tuple[str, dict]]:
    """(group_id, event) pairs, about `events` of them, in time order across the groups, starting `start_ms`
    (default: two days ago, so the topic's retention keeps them)."""
    rng = random.Random(seed)
    if start_ms is None:
        start_ms = int(time.time() * 1000) - 2 * 86_400_000
    clocks = {f"group-{g:03d}": start_ms + g * 1000 for g in range(groups)}
    generations = dict.fromkeys(clocks, 0)
    members: dict[str, list[str]] = {g: [] for g in clocks}
    produced = 0
    # the group whose next rebalance starts first goes next, so the stream is in time order like a real topic's
    # (--since/--until rely on it; only a rebalance's own few seconds overlap the next one's start)
    due = [(clock + rng.randint(5_000, 120_000), group) for group, clock in clocks.items()]
    heapq.heapify(due)
    while produced < events:
        start, group = heapq.heappop(due)
        batch = list(_rebalance(rng, group, start, clocks, generations, members, expected))
        for event in batch:
            yield group, event
        produced += len(batch)
        heapq.heappush(due, (clocks[group] + rng.randint(5_000, 120_000), group))
    if expected is not None:
        expected.events = produced


def _rebalance(rng: random.Random, group: str, now: int, clocks: dict[str, int], generations: dict[str, int],
               members: dict[str, list[str]], expected: Expected | None) -> Iterator[dict]:
    roll = rng.random()
    current = members[group]
    had_members = bool(current)
    if not current or roll < 0.5:
        slot = min(40, int(rng.paretovariate(1.0)))  # a few consumers come and go (and fail) far more often
        member = f"consumer-{slot}-{rng.getrandbits(32):08x}"
        current.append(member)
        yield new_event("member_joined", group, now, member_id=member, group_instance_id=None,
                        client_id=f"consumer-{slot}", client_host=f"/10.0.{slot // 8}.{slot}")
        reason = f"Adding new member {member} with group instance id None; client reason: not provided"
    elif roll < 0.8:
        member = current.pop(rng.randrange(len(current)))
        yield new_event("member_failed", group, now, member_id=member, group_instance_id=None,
                        reason="session timeout")
        reason = f"removing member {member} on heartbeat expiration"
        if expected is not None:
            expected.failed[group] += 1
    else:
        member = current.pop(rng.randrange(len(current)))
        yield new_event("member_left", group, now, member_id=member, group_instance_id=None,
                        reason="the consumer is being closed")
        reason = f"Removing member {member} on LeaveGroup; client reason: the consumer is being closed"
    old = generations[group]
    new = old + 1
    generations[group] = new
    duration = int(rng.lognormvariate(6.5, 1.0)) + 3
    yield new_event("state_change", group, now, old_state="Stable" if had_members else "Empty",
                    new_state="PreparingRebalance", generation=old)
    yield new_event("rebalance_started", group, now, generation=old, reason=reason)
    if current:
        yield new_event("state_change", group, now + duration // 2, old_state="PreparingRebalance",
                        new_state="CompletingRebalance", generation=new)
        yield new_event("state_change", group, now + duration, old_state="CompletingRebalance",
                        new_state="Stable", generation=new)
    else:
        yield new_event("state_change", group, now + duration, old_state="PreparingRebalance",
                        new_state="Empty", generation=new)
    yield new_event("rebalance_completed", group, now + duration, generation=new, member_count=len(current),
                    duration_ms=duration)
    clocks[group] = now + duration
    if expected is not None:
        expected.rebalances[group] += 1
        expected.duration_total_ms[group] += duration


def write(bootstrap: str, topic: str, pairs: Iterator[tuple[str, dict]], extra_values: Sequence[bytes] = ()) -> int:
    """Produce every event (keyed by group, like the coordinator's writer) and any raw extra values; returns the
    number of records written."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 50, "batch.num.messages": 10_000,
                         "queue.buffering.max.messages": 1_000_000, "compression.type": "lz4",
                         "partitioner": "murmur2_random"})
    count = 0
    try:
        for group, event in pairs:
            _produce(producer, topic, group.encode(), json.dumps(event).encode(), event["ts_ms"])
            count += 1
        for value in extra_values:
            _produce(producer, topic, b"bad", value)
            count += 1
        if producer.flush(60) != 0:
            raise RuntimeError("synthetic events not delivered within 60 s")
    finally:
        producer.flush(0)
    return count


def _produce(producer: Producer, topic: str, key: bytes, value: bytes, timestamp_ms: int = 0) -> None:
    """The record's timestamp is the event's time, as the coordinator's writer gets (it produces at once)."""
    while True:
        try:
            producer.produce(topic, key=key, value=value, timestamp=timestamp_ms)
            return
        except BufferError:
            producer.poll(0.1)


def main() -> int:
    import argparse

    parser = argparse.ArgumentParser(description="Write a synthetic rebalance history to an event topic.")
    parser.add_argument("--bootstrap-server", required=True)
    parser.add_argument("--topic", default="__coordinator_events")
    parser.add_argument("--events", type=int, default=5_000)
    parser.add_argument("--groups", type=int, default=6)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    written = write(args.bootstrap_server, args.topic, history(args.events, args.groups, seed=args.seed))
    print(f"wrote {written} synthetic events to {args.topic}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
