"""While Kafka is unreachable, librdkafka's stream of "Connection refused" ERROR lines becomes one WARNING per
outage, and the first acknowledged write logs one WARNING that it is back (real librdkafka clients against a
closed loopback port)."""

from __future__ import annotations

import json
import logging
import subprocess
import sys

from coordinator.storage import kafka_logs
from coordinator.storage.kafka_logs import kafka_reachable
from tests.support.ports import free_port


def test_an_outage_is_one_warning_and_its_end_another() -> None:
    # The outage is the process's (one warning whichever client meets it first), so it is watched in a process of
    # its own: librdkafka clients other tests of this worker left running would start or end it meanwhile.
    done = subprocess.run([sys.executable, "-c", _OUTAGE, str(free_port())], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.splitlines()[-1])
    assert report["suppressed"] >= 5, "librdkafka logged too few connection errors to test anything"
    warnings = [(level, text) for level, text in report["during"] if "kafka_unreachable" in text]
    assert len(warnings) == 1 and warnings[0][0] == logging.WARNING, report["during"]
    assert f"127.0.0.1:{report['port']}" in warnings[0][1]
    assert not [text for level, text in report["during"] if level >= logging.ERROR]
    back = [(level, text) for level, text in report["after"] if "kafka_reachable_again" in text]
    assert len(back) == 1 and back[0][0] == logging.WARNING, report["after"]


_OUTAGE = """
import json, logging, sys, time
from confluent_kafka import Producer
from coordinator.storage import kafka_logs
from coordinator.storage.kafka_logs import kafka_reachable, librdkafka_logger
from tests.support.log_capture import Capture

capture = Capture()
logging.getLogger("coordinator.storage").addHandler(capture)
port = int(sys.argv[1])  # nobody listens there
clients = [Producer({"bootstrap.servers": f"127.0.0.1:{port}", "reconnect.backoff.ms": 10,
                     "reconnect.backoff.max.ms": 50, "logger": librdkafka_logger(name)})
           for name in ("state-producer", "events")]
deadline = time.monotonic() + 30  # bounded for a loaded machine; a few connection errors come in ~1 s
while kafka_logs._outage.suppressed < 5 and time.monotonic() < deadline:
    for client in clients:
        client.poll(0.1)
during = [(r.levelno, r.getMessage()) for r in capture.records]
suppressed = kafka_logs._outage.suppressed
capture.records.clear()
kafka_reachable()
kafka_reachable()
after = [(r.levelno, r.getMessage()) for r in capture.records]
print(json.dumps({"port": port, "suppressed": suppressed, "during": during, "after": after}))
"""


def test_other_librdkafka_lines_pass_unchanged() -> None:
    record = logging.LogRecord("coordinator.storage.librdkafka.loader", logging.ERROR, __file__, 1,
                               "FATAL [rdkafka#consumer-1] idempotence error", (), None)
    assert kafka_logs.ConnectivityFilter().filter(record) is True
    assert record.levelno == logging.ERROR and record.getMessage().startswith("FATAL")


# as librdkafka logged them when a coordinator started on a fresh broker (coordinator demo, 2026-11-26)
GETPID = ("GETPID [group-coordinator-state#producer-3] [thrd:main]: Failed to acquire transactional PID from broker "
          "TxnCoordinator/1: Broker: {}: retrying")


def librdkafka_record(client: str, level: int, text: str) -> logging.LogRecord:
    return logging.LogRecord(f"coordinator.storage.librdkafka.{client}", level, __file__, 1, text, (), None)


def test_a_loading_transaction_coordinator_is_said_once_at_info_until_an_outage_ends() -> None:
    kafka_reachable()
    kafka_logs._outage.loading_said = False
    kept = []
    for client in ("state-producer-0", "state-producer-1"):
        for reason in ("Not coordinator", "Not coordinator", "Coordinator load in progress"):
            record = librdkafka_record(client, logging.WARNING, GETPID.format(reason))
            if kafka_logs.ConnectivityFilter().filter(record):
                kept.append(record)
    assert len(kept) == 1 and kept[0].levelno == logging.INFO
    assert kept[0].getMessage().startswith("event=transaction_coordinator_loading client=state-producer-0 ")
    assert "Failed to acquire transactional PID" in kept[0].getMessage()
    # an outage and its end: a restarted broker loads again, and that is said again
    outage = librdkafka_record("events", logging.ERROR, "Connect to ipv4#127.0.0.1:9 failed: Connection refused")
    assert kafka_logs.ConnectivityFilter().filter(outage)
    kafka_reachable()
    again = librdkafka_record("state-producer-0", logging.WARNING, GETPID.format("Not coordinator"))
    assert kafka_logs.ConnectivityFilter().filter(again) and again.levelno == logging.INFO


def test_a_transactional_pid_refused_for_another_reason_passes_unchanged() -> None:
    record = librdkafka_record("state-producer-0", logging.WARNING,
                               GETPID.format("Transactional Id authorization failed"))
    assert kafka_logs.ConnectivityFilter().filter(record) and record.levelno == logging.WARNING
