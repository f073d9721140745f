"""The Kafka error of a failed state-topic append, as the broker path would have reported it."""

from __future__ import annotations

from confluent_kafka import KafkaError

from protocol.error_codes import Errors

_LOCAL_ERRORS = {  # librdkafka's client-side errors → the Kafka error the broker path would have produced
    KafkaError._MSG_TIMED_OUT: Errors.REQUEST_TIMED_OUT,
    KafkaError._TIMED_OUT: Errors.REQUEST_TIMED_OUT,
    KafkaError._TIMED_OUT_QUEUE: Errors.REQUEST_TIMED_OUT,
    KafkaError._UNKNOWN_PARTITION: Errors.UNKNOWN_TOPIC_OR_PARTITION,
    KafkaError._UNKNOWN_TOPIC: Errors.UNKNOWN_TOPIC_OR_PARTITION,
    KafkaError._TRANSPORT: Errors.NETWORK_EXCEPTION,
    # fenced by a newer holder of the transactional.id (transactions.py reports every fencing error as this):
    # another instance owns the partition now
    KafkaError._FENCED: Errors.NOT_COORDINATOR,
    # the producer's own state (sequence numbers, producer id, transaction state) after an outage: the write was
    # not stored and the producer recovers (aborts with an epoch bump, or is replaced): the client retries
    KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER: Errors.COORDINATOR_NOT_AVAILABLE,
    KafkaError.UNKNOWN_PRODUCER_ID: Errors.COORDINATOR_NOT_AVAILABLE,
    KafkaError.INVALID_TXN_STATE: Errors.COORDINATOR_NOT_AVAILABLE,
    KafkaError.INVALID_PRODUCER_ID_MAPPING: Errors.COORDINATOR_NOT_AVAILABLE,
    KafkaError.CONCURRENT_TRANSACTIONS: Errors.COORDINATOR_NOT_AVAILABLE,
    # our producer's transaction refusals that no group API answers with (the client's transaction is not ours)
    KafkaError.INVALID_PRODUCER_EPOCH: Errors.UNKNOWN_SERVER_ERROR,
    KafkaError.PRODUCER_FENCED: Errors.UNKNOWN_SERVER_ERROR,
    KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED: Errors.UNKNOWN_SERVER_ERROR,
    KafkaError.TRANSACTION_ABORTABLE: Errors.UNKNOWN_SERVER_ERROR,
}


def append_error(error: KafkaError) -> Errors:
    """The raw Kafka error of a failed append. Broker errors keep their code; local ones are translated; what
    has no Kafka equivalent (queue full, fatal producer, shutdown) becomes COORDINATOR_NOT_AVAILABLE, which
    every client retries."""
    code = error.code()
    if code in _LOCAL_ERRORS:
        return _LOCAL_ERRORS[code]
    if code > 0:
        try:
            return Errors(code)
        except ValueError:
            return Errors.UNKNOWN_SERVER_ERROR
    return Errors.COORDINATOR_NOT_AVAILABLE
