"""`coordinator serve --command-config` beside a real secured Kafka broker (SASL_SSL and SSL listeners, PEM
certificates from a test CA made here, SCRAM and PLAIN users): every client of ours authenticates, stock consumers
form a group through the relay and their commits survive a coordinator restart; a wrong password or CA is one
error line and exit 1, not a hang."""

from __future__ import annotations

import asyncio
import os
import signal
import ssl
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from coordinator.embedded import EmbeddedKafka
from coordinator.embedded.certificates import CertificateSet, make_ca_file, make_test_certificates
from coordinator.embedded.secured import SecureListeners
from coordinator.security.client_config import load_command_config
from coordinator.security.clusters import ClusterSecurity
from coordinator.security.connections import connect
from coordinator.security.sasl_passthrough import SASL_AUTHENTICATE, SASL_HANDSHAKE
from protocol.apis import ApiKey
from protocol.client import KafkaClient
from protocol.errors import ConnectionClosed, RequestTimedOut
from tests.support import service as e2e
from tests.support.eos_loop import consume_transform_produce
from tests.support.pipes import DrainedPipe
from tests.support.relay import ConsumerProcess, committed_offsets, start_consumers, stop_all
from tests.support.polling import wait_until
from tests.support.service import FAST, service, unique, until_loaded
from tests.support.wire import ms, nested, request, subscription_metadata

PARTITIONS = 3
RECORDS = 30  # per partition
TIMEOUT_S = 180  # a loaded 2-core machine: broker, coordinator and consumers start side by side
SCRAM = "org.apache.kafka.common.security.scram.ScramLoginModule"


class SecuredBroker:
    def __init__(self, broker: EmbeddedKafka, certificates: CertificateSet, directory: Path) -> None:
        self.broker, self.certificates, self.directory = broker, certificates, directory

    def properties_file(self, name: str, text: str) -> Path:
        path = self.directory / f"{name}.properties"
        path.write_text(text)
        return path

    def scram(self, password: str = "admin-secret", truststore: Path | None = None) -> Path:
        """The Java client's way: SCRAM-SHA-512 through the JAAS config, a PEM truststore."""
        return self.properties_file(f"scram-{password}", (
            "security.protocol=SASL_SSL\nsasl.mechanism=SCRAM-SHA-512\n"
            f"sasl.jaas.config={SCRAM} required \\\n    username=\"admin\" password=\"{password}\";\n"
            f"ssl.truststore.type=PEM\nssl.truststore.location={truststore or self.certificates.ca}\n"))


@pytest.fixture(scope="module")
def secured_kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecuredBroker]:
    directory = tmp_path_factory.mktemp("secured-kafka")
    certificates = make_test_certificates(directory / "certificates", clients=("coordinator",))
    broker = EmbeddedKafka(secure=SecureListeners(certificates), startup_timeout_s=240)
    broker.start_blocking()
    try:
        yield SecuredBroker(broker, certificates, directory)
    finally:
        broker.stop_blocking()
        broker.remove_data()


def create_topic_and_records(bootstrap: str, settings: dict[str, str], topic: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap, **settings})
    admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result(60)
    producer = Producer({"bootstrap.servers": bootstrap, **settings, "acks": "all", "linger.ms": 5})
    for partition in range(PARTITIONS):
        for n in range(RECORDS):
            producer.produce(topic, value=f"p{partition}-{n}".encode(), partition=partition)
    assert producer.flush(60) == 0, "records not delivered"


async def consume_everything(port: int, topic: str, group: str, members: int) -> None:
    """`members` confluent-kafka consumers, bootstrapped to the relay, share the topic; every record consumed
    and committed, then they leave."""
    consumers = await start_consumers([("confluent", f"{group}-{n}") for n in range(members)], f"127.0.0.1:{port}",
                                      topic, group, "range")
    try:
        await wait_until(lambda: sum(len(c.records) for c in consumers) >= PARTITIONS * RECORDS, TIMEOUT_S,
                         "every record consumed through the relay", interval_s=0.5)
        assert all(committed for c in consumers for *_rest, committed in c.records), "a commit failed"
        assert sorted(p for c in consumers for p in c.assigned) == list(range(PARTITIONS))
    finally:
        await stop_all(consumers)
    for consumer in consumers:
        assert b"Traceback" not in consumer.stderr, consumer.stderr.decode(errors="replace")[-3000:]


@pytest.mark.parametrize("writer", ["librdkafka", "native"])  # the state writer's own connections: SASL_SSL too
async def test_a_group_through_the_relay_on_a_sasl_ssl_cluster_keeps_its_offsets_across_a_restart(
        secured_kafka: SecuredBroker, writer: str) -> None:
    bootstrap = secured_kafka.broker.sasl_ssl_bootstrap
    properties = secured_kafka.scram()
    topic, group, state_topic = unique("secured"), unique("secured-app"), unique("secured-state")
    await asyncio.to_thread(create_topic_and_records, bootstrap,
                            load_command_config(properties).librdkafka_settings(), topic)
    args = ("--command-config", str(properties), "--state-writer", writer)
    async with service(bootstrap, state_topic, *FAST, relay=True, event_topic=unique("secured-events"),
                       args=args) as first:
        await consume_everything(first.port, topic, group, members=2)
        assert await committed_offsets(first.port, group, topic, PARTITIONS) == {p: RECORDS for p in
                                                                                range(PARTITIONS)}
        log = first.log_text()
        assert "event=cluster_security" in log and "principal=admin" in log and "admin-secret" not in log
        assert await first.terminate() == 0
    # the state was written to the secured cluster, and is read back from it by a new process
    async with service(bootstrap, state_topic, *FAST, relay=True, args=args) as second:
        offsets = await wait_until_loaded_offsets(second.port, group, topic)
        assert offsets == {p: RECORDS for p in range(PARTITIONS)}


async def wait_until_loaded_offsets(port: int, group: str, topic: str) -> dict[int, int]:
    deadline = asyncio.get_running_loop().time() + TIMEOUT_S
    while True:
        try:
            return await committed_offsets(port, group, topic, PARTITIONS)
        except AssertionError:  # COORDINATOR_LOAD_IN_PROGRESS while the state is read
            assert asyncio.get_running_loop().time() < deadline, "state never loaded"
            await asyncio.sleep(0.2)


@pytest.mark.parametrize("kind", ["plain-librdkafka-names", "mtls", "oauthbearer-unsecured"])
async def test_other_ways_in_serve_and_commit_through_the_relay(secured_kafka: SecuredBroker, kind: str) -> None:
    certificates = secured_kafka.certificates
    if kind == "mtls":  # the SSL listener requires a client certificate: a PEM keystore, Java's names
        bootstrap = secured_kafka.broker.ssl_bootstrap
        text = (f"security.protocol=SSL\nssl.truststore.type=PEM\nssl.truststore.location={certificates.ca}\n"
                f"ssl.keystore.type=PEM\nssl.keystore.location={certificates.client_keystore('coordinator')}\n")
    elif kind == "plain-librdkafka-names":
        bootstrap = secured_kafka.broker.sasl_ssl_bootstrap
        text = (f"security.protocol=sasl_ssl\nsasl.mechanisms=PLAIN\nsasl.username=alice\n"
                f"sasl.password=alice-secret\nssl.ca.location={certificates.ca}\n")
    else:
        bootstrap = secured_kafka.broker.sasl_ssl_bootstrap
        text = ("security.protocol=SASL_SSL\nsasl.mechanism=OAUTHBEARER\nsasl.jaas.config=org.apache.kafka.common."
                "security.oauthbearer.OAuthBearerLoginModule required unsecuredLoginStringClaim_sub=\"alice\";\n"
                f"ssl.truststore.type=PEM\nssl.truststore.location={certificates.ca}\n")
    properties = secured_kafka.properties_file(kind, text)
    topic, group = unique(kind), unique(f"{kind}-app")
    await asyncio.to_thread(create_topic_and_records, bootstrap,
                            load_command_config(properties).librdkafka_settings(), topic)
    async with service(bootstrap, unique(f"{kind}-state"), *FAST, relay=True,
                       args=("--command-config", str(properties))) as running:
        await consume_everything(running.port, topic, group, members=1)
        assert await committed_offsets(running.port, group, topic, PARTITIONS) == {p: RECORDS for p in
                                                                                  range(PARTITIONS)}


async def test_an_instance_joins_its_instances_group_and_writes_its_partitions_on_the_secured_cluster(
        secured_kafka: SecuredBroker) -> None:
    """Several-instances mode: the membership consumer, the owner map's AdminClient and the per-partition
    transactional producers all reach the cluster over SASL_SSL."""
    properties = secured_kafka.scram()
    group = unique("instance-app")
    async with service(secured_kafka.broker.sasl_ssl_bootstrap, unique("instance-state"), *FAST,
                       args=("--command-config", str(properties), "--instance-id", "secured-a")) as running:
        client = await running.client()
        try:
            async def committed() -> bool:  # NOT_COORDINATOR until Kafka assigns the partitions to the instance
                return await e2e.commit(client, group, -1, "", {0: 42}, topic="t") == [0]

            deadline = asyncio.get_running_loop().time() + TIMEOUT_S
            while not await committed():
                assert asyncio.get_running_loop().time() < deadline, running.log_text()[-5000:]
                await asyncio.sleep(0.2)
            assert await e2e.fetch_offsets(client, group, (0,), topic="t") == {0: 42}
        finally:
            await client.close()
        log = running.log_text()
        assert "event=membership_started" in log and not owner_map_refreshes_refused(log), log[-5000:]


# What Kafka answers while its group coordinator loads or moves: a refresh failing with it is retried, not refused.
_TRANSIENT_DESCRIBE_ERRORS = ("COORDINATOR_LOAD_IN_PROGRESS", "COORDINATOR_NOT_AVAILABLE", "NOT_COORDINATOR")


def owner_map_refreshes_refused(log: str) -> list[str]:
    """The owner map's failed refreshes (the instances' group described over the secured connection) for any
    reason but the cluster's coordinator loading or moving."""
    return [line for line in log.splitlines() if "event=owner_map_refresh_failed" in line
            and not any(f"code={code}," in line for code in _TRANSIENT_DESCRIBE_ERRORS)]


async def serve_until_it_exits(bootstrap: str, properties: Path) -> tuple[int, str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "coordinator.cli", "serve", "--listen", "127.0.0.1:0", "--bootstrap-server", bootstrap,
        "--command-config", str(properties), "--state-topic", unique("refused-state"),
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        _out, err = await asyncio.wait_for(process.communicate(), 90)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.returncode is not None
    return process.returncode, err.decode(errors="replace")


async def test_a_wrong_password_is_one_error_line_and_exit_1(secured_kafka: SecuredBroker) -> None:
    code, stderr = await serve_until_it_exits(secured_kafka.broker.sasl_ssl_bootstrap,
                                              secured_kafka.scram(password="not-the-password"))
    said = [line for line in stderr.splitlines() if line.startswith("coordinator serve:")]
    assert code == 1 and len(said) == 1, stderr
    assert "SASL authentication" in said[0] and "invalid credentials" in said[0] and "user admin" in said[0], said
    assert "not-the-password" not in stderr


async def test_a_truststore_without_the_brokers_ca_is_one_error_line_and_exit_1(
        secured_kafka: SecuredBroker) -> None:
    other_ca = make_ca_file(secured_kafka.directory / "other-ca.pem")
    code, stderr = await serve_until_it_exits(secured_kafka.broker.sasl_ssl_bootstrap,
                                              secured_kafka.scram(truststore=other_ca))
    said = [line for line in stderr.splitlines() if line.startswith("coordinator serve:")]
    assert code == 1 and len(said) == 1, stderr
    assert "TLS to localhost:" in said[0] and "certificate was not accepted" in said[0], said


async def test_a_bad_setting_is_refused_before_anything_starts(tmp_path: Path) -> None:
    properties = tmp_path / "client.properties"
    properties.write_text("security.protocol=SASL_SSL\nsasl.mechanism=GSSAPI\n")
    code, stderr = await serve_until_it_exits("127.0.0.1:1", properties)
    assert code == 1 and stderr.strip().splitlines()[-1].startswith(
        f"coordinator serve: --command-config {properties}: sasl.mechanism: 'GSSAPI' is not supported"), stderr


# ---------------------------------------------------------------------------------------------- our listeners


def tls_to_us(certificates: CertificateSet, with_certificate: bool) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(certificates.ca))
    if with_certificate:
        keystore = str(certificates.client_keystore("coordinator"))
        context.load_cert_chain(keystore, keystore)
    return context


def listener_tls(certificates: CertificateSet, *extra: str) -> tuple[str, ...]:
    return ("ssl.keystore.type=PEM", f"ssl.keystore.location={certificates.broker_keystore}", *extra)


async def consume_all_over_tls(port: int, topic: str, group: str, settings: dict[str, str]) -> None:
    """A confluent-kafka consumer reads every record through our SSL listener at `port` and commits them."""
    consumer = ConsumerProcess("confluent", f"{group}-0", f"127.0.0.1:{port}", topic, group, "range",
                               settings={"security.protocol": "ssl", **settings})
    await consumer.start()
    try:
        await wait_until(lambda: len(consumer.records) >= PARTITIONS * RECORDS, TIMEOUT_S,
                         "every record consumed over TLS", interval_s=0.5)
        assert all(committed for *_rest, committed in consumer.records), "a commit failed"
    finally:
        await stop_all([consumer])


async def test_a_consumer_reaches_the_relay_over_tls_and_the_relay_the_cluster_over_sasl_ssl(
        secured_kafka: SecuredBroker) -> None:
    """TLS per hop: consumer ⇄ our SSL listeners (coordinator and broker listeners), relay ⇄ SASL_SSL cluster."""
    bootstrap = secured_kafka.broker.sasl_ssl_bootstrap
    properties = secured_kafka.scram()
    certificates = secured_kafka.certificates
    topic, group = unique("tls-listener"), unique("tls-listener-app")
    await asyncio.to_thread(create_topic_and_records, bootstrap,
                            load_command_config(properties).librdkafka_settings(), topic)
    async with service(bootstrap, unique("tls-listener-state"), *FAST, *listener_tls(certificates), relay=True,
                       listen="SSL://127.0.0.1:0", args=("--command-config", str(properties))) as running:
        assert "event=listening security_protocol=SSL" in running.log_text()
        await consume_all_over_tls(running.port, topic, group, {"ssl.ca.location": str(certificates.ca)})
        client = await KafkaClient.connect("127.0.0.1", running.port, ssl=tls_to_us(certificates, False))
        try:
            assert await e2e.fetch_offsets(client, group, tuple(range(PARTITIONS)), topic=topic) == {
                p: RECORDS for p in range(PARTITIONS)}
        finally:
            await client.close()
        with pytest.raises((ConnectionClosed, RequestTimedOut, OSError)):  # plaintext bytes to a TLS listener
            await KafkaClient.connect("127.0.0.1", running.port, timeout_ms=10_000)


async def test_required_client_auth_refuses_a_client_without_a_certificate(secured_kafka: SecuredBroker) -> None:
    certificates = secured_kafka.certificates
    settings = listener_tls(certificates, f"ssl.truststore.location={certificates.ca}", "ssl.client.auth=required")
    async with service(secured_kafka.broker.bootstrap, unique("mtls-listener-state"), *settings, relay=True,
                       listen="SSL://127.0.0.1:0") as running:
        with_certificate = await KafkaClient.connect("127.0.0.1", running.port,
                                                     ssl=tls_to_us(certificates, True))
        assert with_certificate.api_versions  # ApiVersions answered once the handshake took our certificate
        await with_certificate.close()
        with pytest.raises((ConnectionClosed, ssl.SSLError, OSError)):
            await KafkaClient.connect("127.0.0.1", running.port, ssl=tls_to_us(certificates, False),
                                      timeout_ms=10_000)

        def metadata(extra: dict[str, str]) -> list[int]:
            admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{running.port}", "security.protocol": "ssl",
                                 "ssl.ca.location": str(certificates.ca), **extra})
            return sorted(admin.list_topics(timeout=15).brokers)  # the broker and the coordinator

        keystore = str(certificates.client_keystore("coordinator"))
        assert await asyncio.to_thread(metadata, {"ssl.certificate.location": keystore,
                                                  "ssl.key.location": keystore}) == [1, 2_000_000_000]
        with pytest.raises(KafkaException):  # librdkafka without a certificate: refused, never answered
            await asyncio.to_thread(metadata, {})


async def test_sasl_on_our_listener_passes_through_to_the_cluster(secured_kafka: SecuredBroker) -> None:
    """--listen SASL_SSL://: consumers' own SCRAM exchanges (librdkafka's and aiokafka's) are judged by the broker
    (over each connection's upstream link, opened with TLS only); the group APIs here and the relayed ones are
    served only after that. A client refused (wrong password, or no SASL) touches no group state, even with its
    group requests sent right behind the SaslAuthenticate."""
    bootstrap = secured_kafka.broker.sasl_ssl_bootstrap
    properties = secured_kafka.scram()
    certificates = secured_kafka.certificates
    topic, group = unique("passthrough"), unique("passthrough-app")
    await asyncio.to_thread(create_topic_and_records, bootstrap,
                            load_command_config(properties).librdkafka_settings(), topic)
    alice = {"security.protocol": "sasl_ssl", "sasl.mechanism": "SCRAM-SHA-256", "sasl.username": "alice",
             "ssl.ca.location": str(certificates.ca)}
    async with service(bootstrap, unique("passthrough-state"), *FAST, *listener_tls(certificates), relay=True,
                       listen="SASL_SSL://127.0.0.1:0", args=("--command-config", str(properties))) as running:
        address = f"127.0.0.1:{running.port}"
        consumers = [await ConsumerProcess(kind, f"{group}-{kind}", address, topic, group, "range",
                                           settings={**alice, "sasl.password": "alice-secret"}).start()
                     for kind in ("confluent", "aiokafka")]
        try:
            await wait_until(lambda: sum(len(c.records) for c in consumers) >= PARTITIONS * RECORDS, TIMEOUT_S,
                             "every record consumed by consumers authenticated through us", interval_s=0.5)
            assert all(committed for c in consumers for *_rest, committed in c.records), "a commit failed"
            await wait_until(lambda: sorted(p for c in consumers for p in c.assigned) == list(range(PARTITIONS)),
                             TIMEOUT_S, "both consumers in one group sharing the partitions")
        finally:
            await stop_all(consumers)
        for consumer in consumers:
            assert b"Traceback" not in consumer.stderr, consumer.stderr.decode(errors="replace")[-3000:]
        assert "event=sasl_authenticated" in running.log_text() and "principal=User:alice" in running.log_text()

        client_errors: list[KafkaError] = []

        def metadata_with(password: str) -> list[int]:
            admin = AdminClient({"bootstrap.servers": address, **alice, "sasl.password": password,
                                 "error_cb": client_errors.append})
            try:
                return sorted(admin.list_topics(timeout=15).brokers)
            finally:
                admin.poll(1)  # serves error_cb

        with pytest.raises(KafkaException):  # the broker refuses the password: nothing is served here
            await asyncio.to_thread(metadata_with, "not-alices-password")
        # the broker's own answer reached the client, not a bare disconnect
        assert any(error.code() == KafkaError._AUTHENTICATION and "invalid credentials" in error.str()
                   for error in client_errors), client_errors
        await wait_until(lambda: "event=sasl_failed" in running.log_text(), 30, "the refusal logged")
        assert "not-alices-password" not in running.log_text()

        unauthenticated = await KafkaClient.connect("127.0.0.1", running.port, ssl=tls_to_us(certificates, False))
        assert {17, 36} <= set(unauthenticated.api_versions)  # ApiVersions is answered before authentication
        with pytest.raises((ConnectionClosed, RequestTimedOut)):  # a group request before it closes the connection
            await e2e.describe(unauthenticated, group)
        await unauthenticated.close()

        # #20: a refused client touches no group state. Its JoinGroup and OffsetCommit go right behind its
        # SaslAuthenticate with a wrong password (and, on another connection, with no SASL at all), so a coordinator
        # that handled a request before the broker's verdict would make the group and its offset.
        rejected_group = unique("passthrough-rejected")
        wrong_password = await rejected_group_requests(running.port, certificates, rejected_group, topic,
                                                       password="not-alices-password")
        no_sasl = await rejected_group_requests(running.port, certificates, rejected_group, topic, password=None)
        alice_client = await KafkaClient.connect("127.0.0.1", running.port, ssl=tls_to_us(certificates, False))
        try:
            assert await sasl_plain(alice_client, "alice", "alice-secret") == 0
            listed = await alice_client.request(request(ApiKey.LIST_GROUPS, 4, states_filter=()))
            assert listed.error_code == 0, listed
            listed_ids = {g.group_id for g in listed.groups}
            assert group in listed_ids and rejected_group not in listed_ids, listed_ids  # the app's group is seen
            assert (await e2e.describe(alice_client, rejected_group)).group_state == "Dead"
            assert await e2e.fetch_offsets(alice_client, rejected_group, (0,), topic=topic) == {0: -1}
            assert await e2e.fetch_offsets(alice_client, group, (0,), topic=topic) == {0: RECORDS}
        finally:
            await alice_client.close()
        # Kafka's broker reads the next request only once the SaslAuthenticate is answered (SaslServerAuthenticator
        # handles one receive per authenticate() call), so it answers SASL_AUTHENTICATION_FAILED, then closes; so
        # do we (the requests behind it are read after the verdict). Neither handles the group requests.
        assert wrong_password == {"authenticate": 58, "join": "closed", "commit": "closed"}, wrong_password
        assert no_sasl == {"join": "closed", "commit": "closed"}, no_sasl
        # and with the right password what came behind the SaslAuthenticate is served, as Kafka serves it
        pipelined = await KafkaClient.connect("127.0.0.1", running.port, ssl=tls_to_us(certificates, False))
        try:
            handshake = await pipelined.request(request(SASL_HANDSHAKE, 1, mechanism="PLAIN"))
            assert handshake.error_code == 0, handshake
            authenticated = pipelined.send(request(SASL_AUTHENTICATE, 2, auth_bytes=b"\0alice\0alice-secret"))
            listed_behind = pipelined.send(request(ApiKey.LIST_GROUPS, 4, states_filter=()))
            assert int((await asyncio.wait_for(authenticated, TIMEOUT_S)).error_code) == 0
            listed = await asyncio.wait_for(listed_behind, TIMEOUT_S)
            assert listed.error_code == 0 and group in {g.group_id for g in listed.groups}, listed
        finally:
            await pipelined.close()


async def sasl_plain(client: KafkaClient, user: str, password: str) -> int:
    """PLAIN on an open connection: SaslHandshake, then SaslAuthenticate; the latter's error code."""
    handshake = await client.request(request(SASL_HANDSHAKE, 1, mechanism="PLAIN"))
    assert handshake.error_code == 0, handshake
    answer = await client.request(request(SASL_AUTHENTICATE, 2, auth_bytes=f"\0{user}\0{password}".encode()))
    return int(answer.error_code)


async def rejected_group_requests(port: int, certificates: CertificateSet, group_id: str, topic: str,
                                  password: str | None) -> dict[str, int | str]:
    """A client that is refused: a SaslAuthenticate as alice with `password` (None: no SASL at all) and, without
    waiting for its answer, a JoinGroup and an OffsetCommit of `group_id`. Returns each request's error code, or
    "closed" when the connection was closed before its answer."""
    client = await KafkaClient.connect("127.0.0.1", port, ssl=tls_to_us(certificates, False))
    try:
        sent: dict[str, asyncio.Future[Any]] = {}
        if password is not None:
            handshake = await client.request(request(SASL_HANDSHAKE, 1, mechanism="PLAIN"))
            assert handshake.error_code == 0, handshake
            sent["authenticate"] = client.send(request(SASL_AUTHENTICATE, 2,
                                                       auth_bytes=f"\0alice\0{password}".encode()))
        protocol = nested(ApiKey.JOIN_GROUP, 9, "protocols")(name="range", metadata=subscription_metadata(topic))
        sent["join"] = client.send(request(ApiKey.JOIN_GROUP, 9, group_id=group_id, session_timeout=ms(10_000),
                                           rebalance_timeout=ms(10_000), member_id="", group_instance_id=None,
                                           protocol_type="consumer", protocols=(protocol,), reason=None))
        partition = nested(ApiKey.OFFSET_COMMIT, 8, "topics", "partitions")(
            partition_index=0, committed_offset=7, committed_leader_epoch=-1, committed_metadata="")
        offsets = nested(ApiKey.OFFSET_COMMIT, 8, "topics")(name=topic, partitions=(partition,))
        sent["commit"] = client.send(request(ApiKey.OFFSET_COMMIT, 8, group_id=group_id,
                                             generation_id_or_member_epoch=-1, member_id="", group_instance_id=None,
                                             topics=(offsets,)))
        answers: dict[str, int | str] = {}
        for name, future in sent.items():
            try:
                answer = await future
            except ConnectionClosed:
                answers[name] = "closed"
            else:  # OffsetCommit v8 has no top-level error code: its partition's
                answers[name] = int(answer.topics[0].partitions[0].error_code if name == "commit"
                                    else answer.error_code)
        return answers
    finally:
        await client.close()


async def test_coordinator_kafka_secure_prints_client_settings_that_work(tmp_path: Path) -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "coordinator.cli", "kafka", "--secure", "--data-dir", str(tmp_path / "kafka"),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    stderr = DrainedPipe(process.stderr)  # the broker's start and run: never left to fill the pipe
    stdout = None
    try:
        assert process.stdout is not None
        lines = [(await asyncio.wait_for(process.stdout.readline(), 240)).decode() for _ in range(4)]
        stdout = DrainedPipe(process.stdout)  # whatever it prints after the settings
        assert lines[2].startswith("secured listeners: SASL_SSL localhost:"), (lines, stderr.text()[-3000:])
        assert lines[3].startswith("client settings: "), lines
        sasl_file, ssl_file = (Path(word.rstrip(",")) for word in lines[3].split()[2:5:2])
        sasl_bootstrap = lines[2].split()[3]
        ssl_bootstrap = lines[2].split("SSL ")[2].split()[0]

        def brokers(bootstrap: str, properties: Path) -> list[int]:
            admin = AdminClient({"bootstrap.servers": bootstrap,
                                 **load_command_config(properties).librdkafka_settings()})
            return sorted(admin.list_topics(timeout=30).brokers)

        assert await asyncio.to_thread(brokers, sasl_bootstrap, sasl_file) == [1]
        assert await asyncio.to_thread(brokers, ssl_bootstrap, ssl_file) == [1]
        process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(process.wait(), 60) == 0, stderr.text()[-3000:]
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
        await stderr.ended()
        if stdout is not None:
            await stdout.ended()


async def test_our_connections_resume_tls_sessions_with_the_brokers_network_threads(
        secured_kafka: SecuredBroker) -> None:
    """Kafka's broker keeps ticket keys per network thread and takes connections in turn: after the few refusals
    that find the turn, our SASL_SSL connections (SCRAM, as the relay's control connection makes them) resume a
    session issued by the thread that takes them."""
    host, port = secured_kafka.broker.sasl_ssl_bootstrap.rsplit(":", 1)
    security = ClusterSecurity.of(load_command_config(secured_kafka.scram()))
    resumed = []
    for _ in range(16):
        client = await connect(host, int(port), security, client_id="resumption", timeout_ms=30_000,
                               negotiate=False)
        transport = client.detach()
        resumed.append(transport.get_extra_info("ssl_object").session_reused)
        transport.close()
    assert resumed[0] is False and sum(resumed[-8:]) >= 6, resumed


async def test_the_java_consumer_authenticates_through_our_sasl_ssl_listener(secured_kafka: SecuredBroker) -> None:
    """Kafka's own client, configured with Java's names (SCRAM-SHA-512 in a JAAS config, a PEM truststore, host
    names verified): consumes and commits through the coordinator; the offsets are read back over a connection of
    ours that authenticates the same way."""
    from tests.support.java_consumer import JavaConsumer

    bootstrap = secured_kafka.broker.sasl_ssl_bootstrap
    certificates = secured_kafka.certificates
    topic, group = unique("java-sasl"), unique("java-sasl-app")
    alice = secured_kafka.properties_file("java-alice", (
        f"security.protocol=SASL_SSL\nsasl.mechanism=SCRAM-SHA-512\nsasl.jaas.config={SCRAM} required "
        f"username=\"alice\" password=\"alice-secret\";\nssl.truststore.type=PEM\n"
        f"ssl.truststore.location={certificates.ca}\n"))
    await asyncio.to_thread(create_topic_and_records, bootstrap,
                            load_command_config(secured_kafka.scram()).librdkafka_settings(), topic)
    async with service(bootstrap, unique("java-sasl-state"), *FAST, *listener_tls(certificates), relay=True,
                       listen="SASL_SSL://127.0.0.1:0",
                       args=("--command-config", str(secured_kafka.scram()))) as running:
        java = await asyncio.to_thread(
            JavaConsumer, f"127.0.0.1:{running.port}", group, topic, session_timeout_ms=10_000,
            properties=dict(line.split("=", 1) for line in alice.read_text().splitlines()))
        try:
            await asyncio.to_thread(java.wait_for, lambda c: len(c.records) >= PARTITIONS * RECORDS, TIMEOUT_S,
                                    "every record consumed by the Java consumer")
            await asyncio.to_thread(java.wait_for, lambda c: all(
                c.committed.get((topic, p)) == RECORDS for p in range(PARTITIONS)), TIMEOUT_S, "its commits")
        finally:
            await asyncio.to_thread(java.close, 60)
        security = load_command_config(alice)
        ours = ClusterSecurity(security, security.ssl_context(), security.librdkafka_settings())
        client = await connect("127.0.0.1", running.port, ours, client_id="offsets-reader", timeout_ms=15_000)
        try:
            assert await e2e.fetch_offsets(client, group, tuple(range(PARTITIONS)), topic=topic) == {
                p: RECORDS for p in range(PARTITIONS)}
        finally:
            await client.close()


async def test_kip_368_re_authentication_passes_through_our_sasl_listener(tmp_path: Path) -> None:
    """A broker with connections.max.reauth.ms: the Java consumer re-authenticates on its connections through us
    (a second SaslHandshake after completion, passed through) and keeps consuming and committing."""
    from tests.support.java_consumer import JavaConsumer

    certificates = make_test_certificates(tmp_path / "certificates", clients=("coordinator",))
    broker = EmbeddedKafka(secure=SecureListeners(certificates), startup_timeout_s=240,
                           extra_properties={"connections.max.reauth.ms": str(REAUTH_MS)})
    await asyncio.to_thread(broker.start_blocking)
    try:
        secured = SecuredBroker(broker, certificates, tmp_path)
        bootstrap, admin_properties = broker.sasl_ssl_bootstrap, secured.scram()
        settings = load_command_config(admin_properties).librdkafka_settings()
        topic, group = unique("reauth"), unique("reauth-app")
        await asyncio.to_thread(create_topic_and_records, bootstrap, settings, topic)
        alice = {"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-256",
                 "sasl.jaas.config": "org.apache.kafka.common.security.scram.ScramLoginModule required "
                                     "username=\"alice\" password=\"alice-secret\";",
                 "ssl.truststore.type": "PEM", "ssl.truststore.location": str(certificates.ca)}
        async with service(bootstrap, unique("reauth-state"), *FAST, *listener_tls(certificates), relay=True,
                           listen="SASL_SSL://127.0.0.1:0", args=("--command-config", str(admin_properties))) as running:
            java = await asyncio.to_thread(JavaConsumer, f"127.0.0.1:{running.port}", group, topic,
                                           session_timeout_ms=10_000, properties=alice)
            try:
                await asyncio.to_thread(java.wait_for, lambda c: len(c.records) >= PARTITIONS * RECORDS, TIMEOUT_S,
                                        "the first records")

                def authentications() -> dict[str, int]:
                    counts: dict[str, int] = {}
                    for line in running.log_text().splitlines():
                        if "event=sasl_authenticated" in line:
                            peer = line.split("peer=")[1].split()[0]
                            counts[peer] = counts.get(peer, 0) + 1
                    return counts

                await wait_until(lambda: max(authentications().values(), default=0) >= 3, TIMEOUT_S,
                                 "a connection of the Java consumer authenticated again twice", interval_s=0.5)
                await asyncio.to_thread(create_more_records, bootstrap, settings, topic)
                await asyncio.to_thread(java.wait_for, lambda c: len(c.records) >= 2 * PARTITIONS * RECORDS,
                                        TIMEOUT_S, "the records produced after re-authentications")
                await asyncio.to_thread(java.wait_for, lambda c: all(
                    c.committed.get((topic, p)) == 2 * RECORDS for p in range(PARTITIONS)), TIMEOUT_S, "commits")
            finally:
                await asyncio.to_thread(java.close, 60)
            assert "reason=sasl_sequence" not in running.log_text()
            # the ACL reader's own connection outlives its session too (a new connection when the broker ends it)
            assert "event=acl_refresh_failed" not in running.log_text()
    finally:
        await asyncio.to_thread(broker.stop_blocking)
        broker.remove_data()


REAUTH_MS = 6_000


def create_more_records(bootstrap: str, settings: dict[str, str], topic: str) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, **settings, "acks": "all", "linger.ms": 5})
    for partition in range(PARTITIONS):
        for n in range(RECORDS, 2 * RECORDS):
            producer.produce(topic, value=f"p{partition}-{n}".encode(), partition=partition)
    assert producer.flush(60) == 0, "records not delivered"


def grant_documented_acls(bootstrap: str, admin_settings: dict[str, str], principal: str, state_topic: str,
                          event_topic: str, instances: bool = False) -> None:
    """Exactly the ACLs docs/security.md lists for the coordinator's principal (no relay; with `instances`, only
    the several instances' additions)."""
    from confluent_kafka.admin import (AclBinding, AclOperation, AclPermissionType, ResourcePatternType,
                                       ResourceType)

    def allow(kind: ResourceType, name: str, operation: AclOperation,
              pattern: ResourcePatternType = ResourcePatternType.LITERAL) -> AclBinding:
        return AclBinding(kind, name, pattern, principal, "*", operation, AclPermissionType.ALLOW)

    topics = [allow(ResourceType.TOPIC, topic, operation) for topic in (state_topic, event_topic)
              for operation in (AclOperation.CREATE, AclOperation.DESCRIBE, AclOperation.READ, AclOperation.WRITE,
                                AclOperation.DESCRIBE_CONFIGS)]
    bindings = [*topics, allow(ResourceType.BROKER, "kafka-cluster", AclOperation.DESCRIBE),
                allow(ResourceType.GROUP, "group-coordinator-loader", AclOperation.DESCRIBE),
                *(allow(ResourceType.TRANSACTIONAL_ID, f"group-coordinator-{state_topic}", operation,
                        ResourcePatternType.PREFIXED) for operation in (AclOperation.WRITE, AclOperation.DESCRIBE))]
    if instances:
        bindings = [allow(ResourceType.GROUP, f"{state_topic}.coordinators", operation)
                    for operation in (AclOperation.READ, AclOperation.DESCRIBE)]
    admin = AdminClient({"bootstrap.servers": bootstrap, **admin_settings})
    for future in admin.create_acls(bindings).values():
        future.result(60)


def grant_write_to_everyone_on(bootstrap: str, admin_settings: dict[str, str], prefix: str) -> None:
    from confluent_kafka.admin import (AclBinding, AclOperation, AclPermissionType, ResourcePatternType,
                                       ResourceType)

    binding = AclBinding(ResourceType.TOPIC, prefix, ResourcePatternType.PREFIXED, "User:*", "*", AclOperation.WRITE,
                         AclPermissionType.ALLOW)
    admin = AdminClient({"bootstrap.servers": bootstrap, **admin_settings})
    for future in admin.create_acls([binding]).values():
        future.result(60)


async def test_the_documented_acls_are_enough_for_the_coordinators_principal(tmp_path: Path) -> None:
    """A cluster with Kafka's StandardAuthorizer: a principal with only the ACLs docs/security.md lists runs the
    coordinator (state and event topics created, transactional writes, the state read back after a restart);
    without them it cannot start."""
    certificates = make_test_certificates(tmp_path / "certificates", clients=("coordinator",))
    users = {"admin": "admin-secret", "coordinator": "coordinator-secret"}
    broker = EmbeddedKafka(secure=SecureListeners(certificates, users=users, authorizer=True), startup_timeout_s=240)
    await asyncio.to_thread(broker.start_blocking)
    try:
        secured = SecuredBroker(broker, certificates, tmp_path)
        bootstrap = broker.sasl_ssl_bootstrap
        coordinator = secured.properties_file("coordinator", (
            f"security.protocol=SASL_SSL\nsasl.mechanism=SCRAM-SHA-512\nsasl.jaas.config={SCRAM} required "
            f"username=\"coordinator\" password=\"coordinator-secret\";\nssl.truststore.type=PEM\n"
            f"ssl.truststore.location={certificates.ca}\n"))
        state_topic, event_topic, group = unique("acl-state"), unique("acl-events"), unique("acl-app")
        args = ("--command-config", str(coordinator))
        code, stderr = await serve_until_it_exits(bootstrap, coordinator)  # no ACL yet: refused, not a hang
        assert code == 1 and "could not start" in stderr, stderr[-3000:]
        assert "DESCRIBE on the cluster" in stderr, stderr[-3000:]  # the first right it needs: reading the ACLs
        admin_settings = load_command_config(secured.scram()).librdkafka_settings()
        await asyncio.to_thread(grant_documented_acls, bootstrap, admin_settings, "User:coordinator", state_topic,
                                event_topic)
        await asyncio.to_thread(grant_write_to_everyone_on, bootstrap, admin_settings, "acl-events-")
        # our PLAINTEXT listener's clients are User:ANONYMOUS, a super user as on the broker (mirrored)
        mirrored = "super.users=User:admin;User:ANONYMOUS"
        for restart in (False, True):
            async with service(bootstrap, state_topic, *FAST, mirrored, event_topic=event_topic,
                               args=args) as running:
                client = await running.client()
                try:
                    await e2e.until_loaded(client, group)
                    if not restart:
                        assert await e2e.commit(client, group, -1, "", {0: 7}, topic="t") == [0]
                    assert await e2e.fetch_offsets(client, group, (0,), topic="t") == {0: 7}
                finally:
                    await client.close()
                log = running.log_text()
                assert "AUTHORIZATION_FAILED" not in log and "authorization failed" not in log.lower(), log[-5000:]
                # the coordinator names the other writer of its event topic, and only that one
                assert f"event=state_topic_writable_by_another topic={event_topic} principal=User:*" in log, log
                assert "principal=User:coordinator" not in log.split("state_topic_writable_by_another")[-1]
                assert f"state_topic_writable_by_another topic={state_topic}" not in log
        # several instances: the membership consumer's group, the owner map's DescribeGroups, per-partition ids
        await asyncio.to_thread(grant_documented_acls, bootstrap,
                                load_command_config(secured.scram()).librdkafka_settings(), "User:coordinator",
                                state_topic, event_topic, instances=True)
        async with service(bootstrap, state_topic, *FAST, mirrored, event_topic=event_topic,
                           args=(*args, "--instance-id", "acl-a")) as running:
            client = await running.client()
            try:
                deadline = asyncio.get_running_loop().time() + TIMEOUT_S
                while True:  # NOT_COORDINATOR until Kafka assigns the instance its partitions
                    try:
                        assert await e2e.fetch_offsets(client, group, (0,), topic="t") == {0: 7}
                        break
                    except AssertionError:
                        assert asyncio.get_running_loop().time() < deadline, running.log_text()[-5000:]
                        await asyncio.sleep(0.2)
                assert await e2e.commit(client, group, -1, "", {0: 8}, topic="t") == [0]
            finally:
                await client.close()
            log = running.log_text()
            assert "AUTHORIZATION_FAILED" not in log and not owner_map_refreshes_refused(log), log[-5000:]
    finally:
        await asyncio.to_thread(broker.stop_blocking)
        broker.remove_data()


async def test_an_exactly_once_loop_through_us_on_a_sasl_ssl_cluster(secured_kafka: SecuredBroker) -> None:
    """The state partitions of a SASL_SSL cluster are read and followed by our own connections (TLS, then SCRAM):
    a consume-transform-produce loop's transactional offsets are settled by the markers while served, as on a
    plaintext cluster (40 records, the aborted transaction invisible, the group's offset 40)."""
    properties = secured_kafka.scram()
    async with service(secured_kafka.broker.sasl_ssl_bootstrap, unique("secured-eos-state"), *FAST, relay=True,
                       args=("--command-config", str(properties))) as running:
        client = await running.client()
        try:
            await until_loaded(client)
        finally:
            await client.close()
        figures = await asyncio.to_thread(consume_transform_produce, f"127.0.0.1:{running.port}",
                                          secured_kafka.broker.bootstrap, unique("secured-eos"))
        log_text = running.log_text()
    assert figures.committed_output == [f"out-{i}" for i in range(len(figures.committed_output))]
    assert len(figures.committed_output) == figures.group_offset == 40
    assert "event=txn_offsets_committed" in log_text and "event=txn_offsets_aborted" in log_text
    assert "event=state_loaded_read_committed" not in log_text


async def test_java_keystores_and_truststores_on_our_listener_and_to_the_cluster(secured_kafka: SecuredBroker,
                                                                              tmp_path: Path) -> None:
    """The stores a Kafka operator has (keytool's JKS, openssl's PKCS12): our SSL listener serves with a JKS
    keystore (Kafka's default type) and requires client certificates from a PKCS12 truststore; the coordinator
    reaches the broker's SSL listener, which requires a client certificate, with a PKCS12 keystore and a JKS
    truststore, for librdkafka's clients and the relay's own connections alike. A consumer reads and commits."""
    from tests.support.java_stores import PASSWORD, make_java_stores

    certificates = secured_kafka.certificates
    stores = make_java_stores(certificates, tmp_path / "stores")
    properties = secured_kafka.properties_file("java-stores", (
        f"security.protocol=SSL\nssl.keystore.type=PKCS12\nssl.keystore.location={stores.client_keystore_p12}\n"
        f"ssl.keystore.password={PASSWORD}\nssl.truststore.type=JKS\n"
        f"ssl.truststore.location={stores.truststore_jks}\nssl.truststore.password={PASSWORD}\n"))
    bootstrap = secured_kafka.broker.ssl_bootstrap
    topic, group = unique("java-stores"), unique("java-stores-app")
    await asyncio.to_thread(create_topic_and_records, bootstrap,
                            load_command_config(properties).librdkafka_settings(), topic)
    listener = (f"ssl.keystore.location={stores.keystore_jks}", f"ssl.keystore.password={PASSWORD}",
                f"ssl.truststore.location={stores.truststore_p12}", "ssl.truststore.type=PKCS12",
                f"ssl.truststore.password={PASSWORD}", "ssl.client.auth=required")
    async with service(bootstrap, unique("java-stores-state"), *FAST, *listener, relay=True,
                       listen="SSL://127.0.0.1:0", args=("--command-config", str(properties))) as running:
        keystore = str(certificates.client_keystore("coordinator"))
        await consume_all_over_tls(running.port, topic, group, {"ssl.ca.location": str(certificates.ca),
                                                                "ssl.certificate.location": keystore,
                                                                "ssl.key.location": keystore})
        log = running.log_text()
        assert f"client_certificate={stores.client_keystore_p12} (PKCS12)" in log and PASSWORD not in log
        with pytest.raises((ConnectionClosed, ssl.SSLError, OSError)):  # no client certificate: refused
            await KafkaClient.connect("127.0.0.1", running.port, ssl=tls_to_us(certificates, False),
                                      timeout_ms=10_000)
