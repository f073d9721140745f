"""Security beside a secured Kafka cluster (docs/security.md): how the coordinator's own clients reach it
(client_config, properties, clusters, connections, sasl_client) and our listeners' TLS and SASL passed through to
the cluster (listeners, sasl_passthrough)."""
