"""Kafka's classic consumer-group protocol: state machine, members, delayed operations, offsets."""
