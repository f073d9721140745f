"""Helpers the tests share, one module per job; no tests here, and no test module imports another.

- wire: requests our client sends (any API/version; JoinGroup, SyncGroup, Heartbeat as a consumer builds them)
- server: GroupRuntime + CoordinatorServer in-process on a loopback port; a raw-socket peer for bad bytes
- group_harness: GroupRuntime on a manual clock with in-process clients, offset commit/fetch requests
- group_invariants: what must hold of every group after any step
- ownership: Ownership on the harness's clock with Kafka's side scripted
- service: `coordinator serve` as a subprocess against a real broker
- instances, inprocess_instances: several coordinator instances (processes on Kafka; in-process, static directory)
- kafka_store: the Kafka-backed store on a real broker
- admin, kafka_tools, static_member, event_topic: real clients and tools against the service
- relay, relay_consumer, java_consumer (+ java/): stock consumers in their own processes for the relay tests
- cycles: the reference-cycle scenarios; telemetry_scenario, otlp_receiver: the tracing scenario and a receiver
- log_capture: a logging handler that keeps every record
- polling: `wait_until`, the one bounded wait for a condition
"""
