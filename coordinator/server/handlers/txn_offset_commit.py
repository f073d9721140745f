"""TxnOffsetCommit (28): the transactional append of a client's offsets to the group's state partition.

The offsets are written as a transactional record batch *of the client's producer* (its transactional id,
producer id and epoch; the sequence is ours, coordinator/group/txn_sequences.py), in Kafka's offset-commit record
format, with our own Produce to the partition's leader. Produce v11 (TxnOffsetCommit v0–4) only verifies that the
partition is in the transaction (the relay added it at AddOffsetsToTxn); v12 (TxnOffsetCommit v5) adds it.

Not served yet (not in the handlers' table, so not advertised): the request handler that validates
(coordinator/group/txn_commit.py), claims a sequence and answers once the partition's tail has read the batch
back needs that tail; until it settles pending offsets end to end, API 28 stays unadvertised.
"""

from __future__ import annotations

import datetime
import io
from collections.abc import Sequence
from dataclasses import dataclass

from kio.records.schema import NewRecordBatch, Record as BatchRecord
from kio.records.writers import write_new_batch
from kio.static.primitive import TZAwareMicros, i8, i16, i32, i64

from coordinator.group.records import OffsetCommitRecord
from coordinator.storage.records import encode
from protocol.apis import request_class
from protocol.client import KafkaClient
from protocol.error_codes import Errors
from protocol.messages import build, item_class

_PRODUCE = 0
_TRANSACTIONAL = 0x10  # record batch attribute bit
VERIFYING_PRODUCE_VERSION = 11  # the leader verifies the partition is in the transaction (TV1)
ADDING_PRODUCE_VERSION = 12  # the leader adds the partition to the transaction (TV2)


@dataclass(frozen=True, slots=True)
class ClientProducer:
    transactional_id: str
    producer_id: int
    producer_epoch: int


@dataclass(frozen=True, slots=True)
class Appended:
    error: Errors
    base_offset: int  # -1 unless appended (or recognised as a duplicate of an appended batch)


def transactional_batch(producer: ClientProducer, sequence: int, records: Sequence[OffsetCommitRecord],
                        now: datetime.datetime | None = None) -> bytes:
    """The offset records as one transactional v2 record batch of the client's producer."""
    timestamp = TZAwareMicros.parse(now or datetime.datetime.now(datetime.timezone.utc))
    encoded = [encode(record) for record in records]
    buffer = io.BytesIO()
    write_new_batch(buffer, NewRecordBatch(
        producer_id=i64(producer.producer_id), producer_epoch=i16(producer.producer_epoch),
        base_sequence=i32(sequence), attributes=i16(_TRANSACTIONAL),
        records=tuple(BatchRecord(attributes=i8(0), timestamp=timestamp, offset=i64(index), key=key, value=value,
                                  headers=()) for index, (key, value) in enumerate(encoded))))
    return buffer.getvalue()


async def append_transactional_batch(leader: KafkaClient, producer: ClientProducer, topic: str, partition: int,
                                     batch: bytes, *, produce_version: int, timeout_ms: int) -> Appended:
    """One Produce (acks=all) of `batch` with the client's transactional id; the partition's answer."""
    cls = request_class(_PRODUCE, produce_version)
    topic_data = item_class(cls, "topic_data")
    partition_data = item_class(topic_data, "partition_data")
    answer = await leader.request(build(
        cls, transactional_id=producer.transactional_id, acks=i16(-1),
        timeout=datetime.timedelta(milliseconds=timeout_ms),
        topic_data=(topic_data(name=topic, partition_data=(partition_data(index=i32(partition), records=batch),)),)),
        timeout_ms=timeout_ms + 5_000)
    result = answer.responses[0].partition_responses[0]
    try:
        error = Errors(int(result.error_code))
    except ValueError:
        error = Errors.UNKNOWN_SERVER_ERROR
    return Appended(error, int(result.base_offset) if error == Errors.NONE else -1)
