"""librdkafka's log lines, made something an operator can alert on.

While Kafka is unreachable every librdkafka client (state producer, event producer, loader, admin) logs a
"Connect to ... failed: Connection refused" line per broker per retry, at ERROR: hundreds a minute. Here one
shared filter turns the first such line of an outage into one WARNING (`event=kafka_unreachable`), drops the rest
(counted), and the first acknowledged write afterwards logs one WARNING `event=kafka_reachable_again` with the
count.

Two expected conditions are said once, at the level they deserve: a transactional producer asking a fresh broker
for its producer id while Kafka still loads its transaction state ("Failed to acquire transactional PID ...
retrying", a WARNING per retry per producer) is one INFO line until the next outage ends; and librdkafka's
CRITICAL/ERROR lines about a producer fenced by a newer one (the coordinator reports the fence itself and acts on
it) become INFO. Everything else librdkafka logs passes unchanged.
"""

from __future__ import annotations

import logging
import re
import threading

log = logging.getLogger("coordinator.storage")

_CONNECTIVITY = re.compile(
    r"Connection refused|brokers are down|Disconnected|Connect to .* failed|Receive failed|Send failed|"
    r"Connection reset|Broker transport failure|Failed to resolve|timed out", re.IGNORECASE)


_COORDINATOR_LOADING = re.compile(
    r"Failed to acquire transactional PID .*(Not coordinator|Coordinator load in progress|"
    r"Coordinator not available).*retrying", re.IGNORECASE)
_FENCED = re.compile(r"fenced by a newer instance|PRODUCER_FENCED|INVALID_PRODUCER_EPOCH|\(_FENCED\)", re.IGNORECASE)


class _Outage:
    def __init__(self) -> None:
        self.lock = threading.Lock()  # librdkafka logs from its own threads
        self.active = False
        self.suppressed = 0
        self.loading_said = False  # the transaction coordinator's loading, said once (again after an outage)


_outage = _Outage()


class ConnectivityFilter(logging.Filter):
    """One WARNING per outage instead of librdkafka's stream of connection errors."""

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        if _COORDINATOR_LOADING.search(text):
            return _loading_once(record, text)
        if _FENCED.search(text):
            if record.levelno > logging.INFO:
                _rewrite(record, logging.INFO, "event=librdkafka_fenced client=%s detail=%s (expected when a newer "
                                               "producer took this transactional.id; the coordinator logs what it "
                                               "does about it)", text)
            return True
        if not _CONNECTIVITY.search(text):
            return True
        with _outage.lock:
            if _outage.active:
                _outage.suppressed += 1
                return False
            _outage.active, _outage.suppressed = True, 0
        _rewrite(record, logging.WARNING, "event=kafka_unreachable client=%s detail=%s (further connection errors "
                                          "are counted, not logged, until Kafka acknowledges a write again)", text)
        return True


def _loading_once(record: logging.LogRecord, text: str) -> bool:
    with _outage.lock:
        if _outage.loading_said:
            return False
        _outage.loading_said = True
    _rewrite(record, logging.INFO, "event=transaction_coordinator_loading client=%s detail=%s (expected on a fresh "
                                   "or restarted broker: Kafka is loading its transaction state and librdkafka "
                                   "retries until it answers; further such lines are not logged)", text)
    return True


def _rewrite(record: logging.LogRecord, level: int, message: str, text: str) -> None:
    record.levelno, record.levelname = level, logging.getLevelName(level)
    record.msg = message
    record.args = (record.name.rsplit(".", 1)[-1], text)


_FILTER = ConnectivityFilter()


def librdkafka_logger(client: str) -> logging.Logger:
    """The logger to hand a librdkafka client as its `logger` setting."""
    logger = logging.getLogger(f"coordinator.storage.librdkafka.{client}")
    if _FILTER not in logger.filters:
        logger.addFilter(_FILTER)
    return logger


def kafka_reachable() -> None:
    """Kafka acknowledged something: ends an outage (any thread; free when there is none)."""
    if not _outage.active:
        return
    with _outage.lock:
        if not _outage.active:
            return
        _outage.active, suppressed = False, _outage.suppressed
        _outage.loading_said = False  # a broker back from an outage loads its transaction state again
    log.warning("event=kafka_reachable_again suppressed_client_errors=%d", suppressed)
