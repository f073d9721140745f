"""The embedded Apache Kafka broker used by `coordinator kafka`, the demo and the tests."""

from coordinator.embedded.broker import BrokerStartError, EmbeddedKafka, process_alive, started_pids
from coordinator.embedded.jars import JarProvisioningError, ensure_jars, ensure_spark_kafka_jars, kafka_version

__all__ = [
    "BrokerStartError", "EmbeddedKafka", "JarProvisioningError", "ensure_jars", "ensure_spark_kafka_jars",
    "kafka_version", "process_alive", "started_pids",
]
