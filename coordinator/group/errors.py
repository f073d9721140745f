"""How failed state-topic appends are reported per API (Kafka 3.9). The error codes themselves are
protocol.error_codes.Errors, imported from there only."""
from __future__ import annotations

from protocol.error_codes import Errors

__all__ = ["kafka4_append_error", "group_append_error", "offset_append_error"]


# How a failed group-metadata append (SyncGroup, static replacement) is reported (3.9 `storeGroup`).
_GROUP_APPEND_ERRORS = {
    Errors.UNKNOWN_TOPIC_OR_PARTITION: Errors.COORDINATOR_NOT_AVAILABLE,
    Errors.NOT_ENOUGH_REPLICAS: Errors.COORDINATOR_NOT_AVAILABLE,
    Errors.NOT_ENOUGH_REPLICAS_AFTER_APPEND: Errors.COORDINATOR_NOT_AVAILABLE,
    Errors.NOT_LEADER_OR_FOLLOWER: Errors.NOT_COORDINATOR,
    Errors.KAFKA_STORAGE_ERROR: Errors.NOT_COORDINATOR,
    Errors.REQUEST_TIMED_OUT: Errors.REBALANCE_IN_PROGRESS,
    Errors.MESSAGE_TOO_LARGE: Errors.UNKNOWN_SERVER_ERROR,
    Errors.RECORD_LIST_TOO_LARGE: Errors.UNKNOWN_SERVER_ERROR,
    Errors.INVALID_FETCH_SIZE: Errors.UNKNOWN_SERVER_ERROR,
}

# How a failed offset-commit append is reported (3.9 `maybeConvertOffsetCommitError`).
_OFFSET_APPEND_ERRORS = {
    Errors.NETWORK_EXCEPTION: Errors.COORDINATOR_LOAD_IN_PROGRESS,
    Errors.UNKNOWN_TOPIC_OR_PARTITION: Errors.COORDINATOR_NOT_AVAILABLE,
    Errors.NOT_ENOUGH_REPLICAS: Errors.COORDINATOR_NOT_AVAILABLE,
    Errors.NOT_ENOUGH_REPLICAS_AFTER_APPEND: Errors.COORDINATOR_NOT_AVAILABLE,
    Errors.NOT_LEADER_OR_FOLLOWER: Errors.NOT_COORDINATOR,
    Errors.KAFKA_STORAGE_ERROR: Errors.NOT_COORDINATOR,
    Errors.MESSAGE_TOO_LARGE: Errors.INVALID_COMMIT_OFFSET_SIZE,
    Errors.RECORD_LIST_TOO_LARGE: Errors.INVALID_COMMIT_OFFSET_SIZE,
    Errors.INVALID_FETCH_SIZE: Errors.INVALID_COMMIT_OFFSET_SIZE,
}


def group_append_error(error: Errors) -> Errors:
    return _GROUP_APPEND_ERRORS.get(error, error)


def offset_append_error(error: Errors) -> Errors:
    return _OFFSET_APPEND_ERRORS.get(error, error)


# How a failed append is answered in Kafka 4 (GroupCoordinatorService.handleOperationException): every write of a
# consumer group, and the tombstones of DeleteGroups/OffsetDelete (3.9 appended those to its own log, which could not
# refuse them).
_KAFKA4_APPEND_ERRORS = {
    Errors.UNKNOWN_TOPIC_OR_PARTITION: Errors.COORDINATOR_NOT_AVAILABLE,
    Errors.NOT_ENOUGH_REPLICAS: Errors.COORDINATOR_NOT_AVAILABLE,
    Errors.NOT_ENOUGH_REPLICAS_AFTER_APPEND: Errors.COORDINATOR_NOT_AVAILABLE,
    Errors.REQUEST_TIMED_OUT: Errors.COORDINATOR_NOT_AVAILABLE,
    Errors.NOT_LEADER_OR_FOLLOWER: Errors.NOT_COORDINATOR,
    Errors.KAFKA_STORAGE_ERROR: Errors.NOT_COORDINATOR,
    Errors.MESSAGE_TOO_LARGE: Errors.UNKNOWN_SERVER_ERROR,
    Errors.RECORD_LIST_TOO_LARGE: Errors.UNKNOWN_SERVER_ERROR,
    Errors.INVALID_FETCH_SIZE: Errors.UNKNOWN_SERVER_ERROR,
}


def kafka4_append_error(error: Errors) -> Errors:
    return _KAFKA4_APPEND_ERRORS.get(error, error)
