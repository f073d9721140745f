"""The embedded Apache Kafka (one broker or a KRaft cluster) used by `coordinator kafka`, the demo and the tests;
Spark's Kafka connector jars for `coordinator analyze`."""

from coordinator.embedded.broker import (BrokerStartError, EmbeddedKafka, KafkaNode, process_alive, process_start_ticks,
                                         started_processes)
from coordinator.embedded.cluster import EmbeddedKafkaCluster
from coordinator.embedded.jars import JarProvisioningError, ensure_jars, ensure_spark_kafka_jars, kafka_version

__all__ = [
    "BrokerStartError", "EmbeddedKafka", "EmbeddedKafkaCluster", "JarProvisioningError", "KafkaNode", "ensure_jars",
    "ensure_spark_kafka_jars", "kafka_version", "process_alive", "process_start_ticks",
    "started_processes",
]
