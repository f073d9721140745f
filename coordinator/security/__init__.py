"""Security beside a secured Kafka cluster: how the coordinator's own clients reach it (client_config,
clusters, connections, sasl_client) and, on our listeners, TLS (listeners)."""
