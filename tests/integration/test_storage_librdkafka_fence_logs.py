"""An expected fence, as librdkafka logs it: a transactional producer whose transactional.id a newer one took
(a zombie) logs no CRITICAL or ERROR through the shared filter; the coordinator's own line says what happened.
Real producers on the real broker."""

from __future__ import annotations

import logging
import uuid

import pytest
from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from coordinator.storage import kafka_logs
from coordinator.storage.kafka_logs import librdkafka_logger
from tests.support.log_capture import Capture

pytestmark = pytest.mark.integration


def test_a_fenced_zombie_producer_logs_no_critical_or_error(kafka_bootstrap: str) -> None:
    topic = f"fence-logs-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    capture = Capture()
    root = logging.getLogger("coordinator.storage")
    root.addHandler(capture)
    transactional_id = f"fence-logs-{uuid.uuid4().hex[:8]}"

    def producer(name: str) -> Producer:
        return Producer({"bootstrap.servers": kafka_bootstrap, "transactional.id": transactional_id,
                         "logger": librdkafka_logger(name)})

    kafka_logs._outage.loading_said = False  # whatever ran before in this process: said once from here
    zombie, successor = producer("zombie"), producer("successor")
    try:
        zombie.init_transactions(30)
        zombie.begin_transaction()
        zombie.produce(topic, b"from the zombie")
        zombie.flush(30)
        successor.init_transactions(30)  # bumps the epoch: the zombie is fenced
        with pytest.raises(KafkaException) as raised:
            zombie.commit_transaction(30)
        assert raised.value.args[0].fatal() or "fenced" in str(raised.value).lower(), raised.value
        with pytest.raises(KafkaException):  # the fatal error, raised by the next poll
            zombie.poll(0.5)
    finally:
        root.removeHandler(capture)
    lines = [(r.levelname, r.name, r.getMessage()) for r in capture.records]
    fenced = [line for line in lines if "event=librdkafka_fenced" in line[2]]
    assert fenced and {level for level, _name, _text in fenced} == {"INFO"}, lines  # said, not alarmed
    assert "fenced by a newer instance" in fenced[0][2]
    assert not [line for line in lines if line[0] in ("CRITICAL", "ERROR")], lines
    # on a fresh broker the first producer's PID requests are refused while Kafka loads its transaction state:
    # at most one line says so, at INFO (none when another test's producer met the loading first)
    loading = [line for line in lines if "transactional PID" in line[2]]
    assert len(loading) <= 1 and all(level == "INFO" for level, _name, _text in loading), loading
