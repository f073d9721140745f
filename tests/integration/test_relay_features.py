"""The cluster's feature flags (KIP-584) in our ApiVersions answers: clients choose protocols by them (Kafka 4's
producers run transaction version 2 when `transaction.version` is finalized at 2), so every listener of ours
answers the features the cluster's own brokers answer, per ApiVersions version, on a TV2 and a TV1 cluster (the
finalized features' epoch is the cluster's metadata offset when the relay learned them)."""

from __future__ import annotations

from typing import Any

import pytest

from protocol.apis import ApiKey
from protocol.client import KafkaClient
from tests.support.service import FAST, service, unique
from tests.support.wire import request as wire_request

pytestmark = pytest.mark.integration


def _features(answer: Any) -> tuple[object, ...]:
    return (tuple((f.name, int(f.min_version), int(f.max_version)) for f in answer.supported_features),
            int(answer.finalized_features_epoch),
            tuple((f.name, int(f.max_version_level), int(f.min_version_level)) for f in answer.finalized_features))


async def _answers(host: str, port: int) -> dict[int, tuple[object, ...]]:
    client = await KafkaClient.connect(host, port)
    try:
        return {version: _features(await client.request(wire_request(
                    ApiKey.API_VERSIONS, version, client_software_name="features-test",
                    client_software_version="1")))
                for version in (3, 4)}
    finally:
        await client.close()


@pytest.mark.parametrize(("cluster", "level"), [("kafka_bootstrap", 2), ("kafka_tv1", 1)])
async def test_every_listener_answers_the_clusters_features(request: pytest.FixtureRequest, cluster: str,
                                                            level: int) -> None:
    kafka = request.getfixturevalue(cluster)
    host, port = kafka.split(",")[0].rsplit(":", 1)
    theirs = await _answers(host, int(port))
    finalized = {name: high for name, high, _ in theirs[4][2]}  # type: ignore[misc]
    assert finalized["transaction.version"] == level and theirs[4][1] >= 0  # type: ignore[operator]
    # v3 leaves out the supported features whose minimum is 0 (transaction.version among them)
    assert len(theirs[3][0]) < len(theirs[4][0])  # type: ignore[arg-type]
    async with service(kafka, unique("__state-features"), *FAST, relay=True) as running:
        client = await running.client()
        try:
            metadata = await client.request(wire_request(ApiKey.METADATA, 12, topics=None,
                                                         allow_auto_topic_creation=False,
                                                         include_topic_authorized_operations=False))
        finally:
            await client.close()
        listeners = {(b.host, int(b.port)) for b in metadata.brokers} | {("127.0.0.1", running.port)}
        assert len(listeners) >= 2  # the bootstrap/coordinator listener and broker 1's
        for listener in sorted(listeners):
            ours = await _answers(*listener)
            for version in (3, 4):
                supported, epoch, finalized_ours = ours[version]
                assert (supported, finalized_ours) == (theirs[version][0], theirs[version][2]), (listener, version)
                # the epoch is the cluster's metadata offset when the relay learned them: it only grows
                assert epoch >= theirs[version][1], (listener, version, epoch)  # type: ignore[operator]
