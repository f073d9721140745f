"""AddOffsetsToTxn (25), v0–4: the transaction's group offsets will be ours, so our state partition joins it.

Kafka's transaction coordinator serves AddOffsetsToTxn as an AddPartitionsToTxn of one partition, the group's
`__consumer_offsets` partition (KafkaApis `handleAddOffsetsToTxnRequest`: `handleAddPartitionsToTransaction` with
that partition, PRODUCER_FENCED answered INVALID_PRODUCER_EPOCH below v2). With the relay the group's offsets live in
our state partition instead, so that is the partition we add: one AddPartitionsToTxn v3 (the client form: same
transactional id, producer id and epoch) to the transaction coordinator this connection's listener stands for (the
broker the client found with FindCoordinator), on our own connection to it, and its partition's error is the
client's answer. The coordinator's COMMIT/ABORT markers then settle the offsets TxnOffsetCommit appends there.
Kafka's `__consumer_offsets` partition is not in the transaction: nothing of the transaction is written there.
(Until 2026-11-28 the request was forwarded first and our partition added after it: two transaction-coordinator
round trips in series and one more marker per transaction; docs/performance.md, "Exactly-once: where a
transaction's time goes".)

CONCURRENT_TRANSACTIONS (the transaction coordinator still completing the client's previous transaction: its
markers take a millisecond or two, and a tight consume-transform-produce loop asks again the moment EndTxn is
answered) is retried here (txn_verification.py `busy_retry_pauses`: from 1 ms, for at most 1 s) and answered only
if it outlasts that. Kafka's coordinator answers it at once and the client backs off `retry.backoff.ms`
(librdkafka: 100 ms by default, exponential), far longer than the markers take; Kafka's brokers retry their own
server-side adds the same way (`add.partitions.to.txn.retry.backoff.ms`, 20 ms, for at most 100 ms).

The client's authorization is checked here, as KafkaApis does it (WRITE on the transactional id, then READ on the
group): our connection to the cluster is authorized as us, not as the client. Without the relay there is no
transaction coordinator: COORDINATOR_NOT_AVAILABLE, as FindCoordinator answers for transactions.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from coordinator.relay.errors import UpstreamUnavailable
from coordinator.security.authorizer import Operation, ResourceType
from coordinator.server.context import ConnectionContext
from coordinator.server.handlers.txn_verification import busy_retry_pauses
from protocol.apis import ApiKey, request_class, response_class
from protocol.codec import RequestHeader
from protocol.error_codes import Errors
from protocol.messages import ZERO_DURATION, build, error, item_class

API_KEY = ApiKey.ADD_OFFSETS_TO_TXN
VERSIONS = (0, 4)  # Kafka 4.1's
_ADD_PARTITIONS_CLIENT_VERSION = 3  # the last version a client sends (v4+ are broker-to-broker, batched)
_PRODUCER_FENCED_MIN_VERSION = 2  # older clients know INVALID_PRODUCER_EPOCH only

log = logging.getLogger("coordinator.server")


def handle(ctx: ConnectionContext, header: RequestHeader, body: Any) -> Any:
    version = header.api_version
    if not ctx.allows(Operation.WRITE, ResourceType.TRANSACTIONAL_ID, body.transactional_id):
        return _answer(version, Errors.TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
    if not ctx.allows(Operation.READ, ResourceType.GROUP, body.group_id):
        return _answer(version, Errors.GROUP_AUTHORIZATION_FAILED)
    if ctx.relay is None:
        return _answer(version, Errors.COORDINATOR_NOT_AVAILABLE)
    if ctx.upstream_node is None:  # the bootstrap listener stands for no broker: not the coordinator
        return _answer(version, Errors.NOT_COORDINATOR)
    return _relayed(ctx, ctx.upstream_node, version, body)


async def _relayed(ctx: ConnectionContext, node_id: int, version: int, body: Any) -> Any:
    assert ctx.relay is not None
    state = ctx.coordinator.state_partition(body.group_id)
    if state is None:  # a store without a state topic (tests): nothing of ours to add, Kafka's partition is
        try:
            return await ctx.relay.request_to(node_id, body)
        except UpstreamUnavailable as exc:
            log.warning("event=add_offsets_to_txn_unanswered transactional_id=%s node=%d error=%s",
                        body.transactional_id, node_id, exc)
            return _answer(version, Errors.COORDINATOR_NOT_AVAILABLE)
    added, retries = await add_state_partition(ctx, node_id, body.transactional_id, body.producer_id,
                                               body.producer_epoch, state)
    if added != Errors.NONE:
        log.info("event=state_partition_not_added transactional_id=%s producer_id=%d group=%s partition=%s "
                 "error=%s concurrent_retries=%d", body.transactional_id, body.producer_id, body.group_id, state,
                 added.name, retries)
        return _answer(version, added)
    log.info("event=state_partition_added transactional_id=%s producer_id=%d group=%s partition=%s version=%d "
             "concurrent_retries=%d", body.transactional_id, body.producer_id, body.group_id, state, version,
             retries)
    return _answer(version, Errors.NONE)


async def add_state_partition(ctx: ConnectionContext, node_id: int, transactional_id: str, producer_id: int,
                              producer_epoch: int, state: tuple[str, int]) -> tuple[Errors, int]:
    """AddPartitionsToTxn v3 of the group's state partition to the client's transaction: the partition's error,
    and how many times CONCURRENT_TRANSACTIONS was retried (the module's docstring; answered only once the budget
    is spent)."""
    assert ctx.relay is not None
    cls = request_class(ApiKey.ADD_PARTITIONS_TO_TXN, _ADD_PARTITIONS_CLIENT_VERSION)
    topic = item_class(cls, "v3_and_below_topics")(name=state[0], partitions=(state[1],))
    request = build(cls, v3_and_below_transactional_id=transactional_id, v3_and_below_producer_id=producer_id,
                    v3_and_below_producer_epoch=producer_epoch, v3_and_below_topics=(topic,))
    pauses, retries = busy_retry_pauses(), 0
    while True:
        try:
            response = await ctx.relay.request_to(node_id, request)
        except UpstreamUnavailable:
            return Errors.COORDINATOR_NOT_AVAILABLE, retries
        added = _partition_error(response)
        pause = next(pauses, None) if added == Errors.CONCURRENT_TRANSACTIONS else None
        if pause is None:
            return added, retries
        retries += 1
        await asyncio.sleep(pause)


def _partition_error(response: Any) -> Errors:
    for result in response.results_by_topic_v3_and_below:
        for partition in result.results_by_partition:
            if _code(partition.partition_error_code) != Errors.NONE:
                return _code(partition.partition_error_code)
    return Errors.NONE


def _code(value: int) -> Errors:
    try:
        return Errors(int(value))
    except ValueError:  # a code this table does not name: still an error
        return Errors.UNKNOWN_SERVER_ERROR


def _answer(version: int, code: Errors) -> Any:
    if version < _PRODUCER_FENCED_MIN_VERSION and code == Errors.PRODUCER_FENCED:
        code = Errors.INVALID_PRODUCER_EPOCH
    return build(response_class(API_KEY, version), throttle_time=ZERO_DURATION, error_code=error(code))
