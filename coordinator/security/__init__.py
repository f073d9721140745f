"""Security beside a secured Kafka cluster (docs/security.md): how the coordinator's own clients reach it
(client_config, properties, stores, clusters, connections, sasl_client, reauthentication) and our listeners' TLS
and SASL passed through to the cluster (listeners, sasl_passthrough), who may do what on them (access, principals,
authorizer, acl_cache, identity, topic_writers); every refused setting is an errors.ClientConfigError."""
