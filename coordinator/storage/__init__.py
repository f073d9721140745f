"""Group state in a real Kafka topic: Kafka's `__consumer_offsets` record formats, the Kafka-backed store, loading."""
