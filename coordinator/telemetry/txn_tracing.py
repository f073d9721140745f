"""A span per client transaction's offsets: opened when the first TxnOffsetCommit of the transaction is pending
in our state partition, an event per TxnOffsetCommit ("pending"), ended by the transaction coordinator's marker
with an event and an outcome ("committed" or "aborted"). It carries the transactional id, the producer id and
epoch, and the group, so a trace search by transactional id finds the offsets of each of its transactions.

Only this instance's view: a transaction whose partition moves to another instance before its marker is not
settled here, and after a restart the offsets loaded pending have no span (their transactional id is not in
the log). Spans still open beyond `capacity` are ended, oldest first, with the outcome "unknown".
"""

from __future__ import annotations

from collections import OrderedDict

from opentelemetry.trace import Span, SpanKind, Tracer

from coordinator.group.observer import GroupObserver
from coordinator.telemetry.tracing import GROUP, SYSTEM

SPAN_NAME = "TxnOffsetCommit transaction"
TRANSACTIONAL_ID = "messaging.kafka.transactional_id"
PRODUCER_ID = "messaging.kafka.producer_id"
PRODUCER_EPOCH = "messaging.kafka.producer_epoch"
OUTCOME = "coordinator.transaction.outcome"
_CAPACITY = 10_000


class TxnOffsetsTracer(GroupObserver):
    def __init__(self, tracer: Tracer, capacity: int = _CAPACITY) -> None:
        self._tracer = tracer
        self._capacity = capacity
        self._open: OrderedDict[int, Span] = OrderedDict()  # producer id -> its transaction's span

    def on_txn_offsets_pending(self, group_id: str, transactional_id: str, producer_id: int, producer_epoch: int,
                               partition_count: int) -> None:
        span = self._open.get(producer_id)
        if span is None:
            while len(self._open) >= self._capacity:
                _, oldest = self._open.popitem(last=False)
                _end(oldest, "unknown")
            span = self._open[producer_id] = self._tracer.start_span(
                SPAN_NAME, kind=SpanKind.INTERNAL,
                attributes={SYSTEM: "kafka", GROUP: group_id, TRANSACTIONAL_ID: transactional_id,
                            PRODUCER_ID: producer_id, PRODUCER_EPOCH: producer_epoch})
        span.add_event("pending", {GROUP: group_id, "coordinator.partitions": partition_count,
                                   PRODUCER_EPOCH: producer_epoch})

    def on_txn_offsets_settled(self, producer_id: int, producer_epoch: int, committed: bool,
                               offset_count: int) -> None:
        span = self._open.pop(producer_id, None)
        if span is None:
            return
        outcome = "committed" if committed else "aborted"
        span.add_event(outcome, {"coordinator.offsets": offset_count, PRODUCER_EPOCH: producer_epoch})
        _end(span, outcome)


def _end(span: Span, outcome: str) -> None:
    span.set_attribute(OUTCOME, outcome)
    span.end()
