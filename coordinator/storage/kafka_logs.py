"""librdkafka's log lines, made something an operator can alert on.

While Kafka is unreachable every librdkafka client (state producer, event producer, loader, admin) logs a
"Connect to ... failed: Connection refused" line per broker per retry, at ERROR: hundreds a minute. Here one
shared filter turns the first such line of an outage into one WARNING (`event=kafka_unreachable`), drops the rest
(counted), and the first acknowledged write afterwards logs one WARNING `event=kafka_reachable_again` with the
count. Everything else librdkafka logs passes unchanged.
"""

from __future__ import annotations

import logging
import re
import threading

log = logging.getLogger("coordinator.storage")

_CONNECTIVITY = re.compile(
    r"Connection refused|brokers are down|Disconnected|Connect to .* failed|Receive failed|Send failed|"
    r"Connection reset|Broker transport failure|Failed to resolve|timed out", re.IGNORECASE)


class _Outage:
    def __init__(self) -> None:
        self.lock = threading.Lock()  # librdkafka logs from its own threads
        self.active = False
        self.suppressed = 0


_outage = _Outage()


class ConnectivityFilter(logging.Filter):
    """One WARNING per outage instead of librdkafka's stream of connection errors."""

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        if not _CONNECTIVITY.search(text):
            return True
        with _outage.lock:
            if _outage.active:
                _outage.suppressed += 1
                return False
            _outage.active, _outage.suppressed = True, 0
        record.levelno, record.levelname = logging.WARNING, "WARNING"
        record.msg = ("event=kafka_unreachable client=%s detail=%s (further connection errors are counted, not "
                      "logged, until Kafka acknowledges a write again)")
        record.args = (record.name.rsplit(".", 1)[-1], text)
        return True


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
    log.warning("event=kafka_reachable_again suppressed_client_errors=%d", suppressed)
