"""Telemetry: OpenTelemetry tracing of rebalances, metrics, and the event-topic writer."""
