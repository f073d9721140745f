"""KIP-368 on our SASL_SSL listeners (`connections.max.reauth.ms`), beside a real broker whose SCRAM-SHA-512
sessions expire after the same time (`listener.name.sasl_ssl.scram-sha-512.connections.max.reauth.ms`) and whose
SCRAM-SHA-256 sessions never do: so a re-authentication through us takes both upstream paths (the link's broker
session re-authenticated in place; a fresh upstream connection where the link's session never expires).

- The wire, side by side with Kafka's broker configured the same: the session lifetime given, re-authentication on
  the same connection, Kafka's answers to a second one within a second, to another principal and to another
  mechanism, and the close of an expired session.
- Real clients: the Java consumer and librdkafka (2.2+ re-authenticates) keep consuming and committing across
  several re-authentications on the coordinator listener and the relay's; aiokafka (which does not re-authenticate)
  is disconnected at expiry and reconnects.
"""

from __future__ import annotations

import asyncio
import base64
import datetime
import json
import re
import ssl
import time
from collections.abc import Generator, Iterator
from contextlib import AbstractAsyncContextManager
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import (AdminClient, NewTopic, ScramCredentialInfo, ScramMechanism,
                                  UserScramCredentialUpsertion)

from coordinator.embedded import EmbeddedKafka
from coordinator.embedded.certificates import CertificateSet, make_test_certificates
from coordinator.embedded.secured import DEFAULT_USERS, SecureListeners
from coordinator.security.client_config import ClientSecurity, load_command_config
from coordinator.security import sasl_client
from coordinator.security.sasl_client import ClusterAuthenticationError, authenticate, run_exchange
from coordinator.security.sasl_passthrough import SASL_AUTHENTICATE, SASL_HANDSHAKE
from protocol.apis import ApiKey
from protocol.client import KafkaClient
from protocol.errors import ConnectionClosed, RequestTimedOut
from tests.support.polling import wait_until
from tests.support.relay import ConsumerProcess, stop_all
from tests.support.service import FAST, Service, service, unique
from tests.support.wire import request

REAUTH_MS = 3_000
PARTITIONS = 3
RECORDS = 20  # per partition, per batch
TIMEOUT_S = 180  # a loaded 2-core machine
USERS = {**DEFAULT_USERS, "bob": "bob-secret", "carol": "carol-secret"}
SCRAM = "org.apache.kafka.common.security.scram.ScramLoginModule"
ONE_SECOND_S = 1.0
CREATE_DELEGATION_TOKEN = 38


class Cluster:
    def __init__(self, broker: EmbeddedKafka, certificates: CertificateSet, directory: Path) -> None:
        self.broker, self.certificates, self.directory = broker, certificates, directory

    def security(self, user: str, mechanism: str, password: str | None = None) -> ClientSecurity:
        """A client's settings by librdkafka's names, read as --command-config reads them."""
        path = self.directory / f"{user}-{mechanism}.properties"
        path.write_text(f"security.protocol=SASL_SSL\nsasl.mechanism={mechanism}\nsasl.username={user}\n"
                        f"sasl.password={password or USERS[user]}\nssl.ca.location={self.certificates.ca}\n")
        return load_command_config(path)

    def command_config(self) -> Path:
        """The coordinator's own: SCRAM-SHA-256, whose sessions the broker never ends."""
        self.security("admin", "SCRAM-SHA-256")
        return self.directory / "admin-SCRAM-SHA-256.properties"

    def librdkafka(self, user: str, mechanism: str) -> dict[str, str]:
        return {"security.protocol": "sasl_ssl", "sasl.mechanism": mechanism, "sasl.username": user,
                "sasl.password": USERS[user], "ssl.ca.location": str(self.certificates.ca)}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    directory = tmp_path_factory.mktemp("reauth-kafka")
    certificates = make_test_certificates(directory / "certificates", clients=("coordinator",))
    broker = EmbeddedKafka(secure=SecureListeners(certificates, users=USERS), startup_timeout_s=240,
                           extra_properties={"listener.name.sasl_ssl.scram-sha-512.connections.max.reauth.ms":
                                             str(REAUTH_MS), "delegation.token.secret.key": "reauth-test-key"})
    broker.start_blocking()
    try:
        yield Cluster(broker, certificates, directory)
    finally:
        broker.stop_blocking()
        broker.remove_data()


def ours(cluster: Cluster, max_reauth_ms: int = REAUTH_MS) -> AbstractAsyncContextManager[Service]:
    """The coordinator with the relay, SASL_SSL listeners and connections.max.reauth.ms=`max_reauth_ms`."""
    return service(cluster.broker.sasl_ssl_bootstrap, unique("reauth-state"), *FAST,
                   "ssl.keystore.type=PEM", f"ssl.keystore.location={cluster.certificates.broker_keystore}",
                   f"connections.max.reauth.ms={max_reauth_ms}", relay=True, listen="SASL_SSL://127.0.0.1:0",
                   args=("--command-config", str(cluster.command_config())))


def broker_port(cluster: Cluster) -> int:
    return int(cluster.broker.sasl_ssl_bootstrap.rsplit(":", 1)[1])


async def session(cluster: Cluster, port: int, user: str, mechanism: str,
                  password: str | None = None) -> tuple[KafkaClient, int]:
    """A connection to localhost:`port` (TLS, the host name checked) authenticated as `user`; the session lifetime
    its SaslAuthenticate answer gave."""
    context = ssl.create_default_context(cafile=str(cluster.certificates.ca))
    client = await KafkaClient.connect("localhost", port, client_id="reauth-wire", ssl=context, negotiate=False)
    try:
        return client, await authenticate(client.request, cluster.security(user, mechanism, password))
    except BaseException:
        await client.close()
        raise


async def closed(client: KafkaClient) -> bool:
    """Whether the connection is closed by the server on a Metadata request (else it is answered)."""
    try:
        await client.request(request(ApiKey.METADATA, 12, topics=(), allow_auto_topic_creation=False,
                                     include_topic_authorized_operations=False))
    except (ConnectionClosed, RequestTimedOut, ConnectionError):
        return True
    return False


async def wire_outcomes(cluster: Cluster, port: int, mechanism: str) -> dict[str, object]:
    """What a client meets on a SASL_SSL listener at `port`, step by step (sleeps measure session time here:
    the subject under test is how the server ends sessions)."""
    outcomes: dict[str, object] = {}
    client, outcomes["lifetime_ms"] = await session(cluster, port, "alice", mechanism)
    try:
        await asyncio.sleep(REAUTH_MS * 0.6 / 1000)
        outcomes["reauthenticated_lifetime_ms"] = await authenticate(client.request,
                                                                     cluster.security("alice", mechanism))
        outcomes["answered_after_reauthentication"] = not await closed(client)
        try:  # again, within a second of the previous start
            await authenticate(client.request, cluster.security("alice", mechanism))
            outcomes["second_within_a_second"] = "accepted"
        except ClusterAuthenticationError as exc:
            outcomes["second_within_a_second"] = str(exc)
        outcomes["kept_after_refused_second"] = not await closed(client)
        await asyncio.sleep(REAUTH_MS * 1.3 / 1000)
        outcomes["closed_after_expiry"] = await closed(client)
    finally:
        await client.close()

    client, _lifetime = await session(cluster, port, "alice", mechanism)
    try:
        await asyncio.sleep(ONE_SECOND_S)
        try:
            await authenticate(client.request, cluster.security("bob", mechanism))
            outcomes["another_principal"] = "accepted"
        except ClusterAuthenticationError as exc:
            outcomes["another_principal"] = str(exc)
        outcomes["closed_after_another_principal"] = await closed(client)
    finally:
        await client.close()

    other = "SCRAM-SHA-256" if mechanism == "SCRAM-SHA-512" else "SCRAM-SHA-512"
    client, _lifetime = await session(cluster, port, "alice", mechanism)
    try:
        await asyncio.sleep(ONE_SECOND_S)
        try:
            await authenticate(client.request, cluster.security("alice", other))
            outcomes["another_mechanism"] = "accepted"
        except (ConnectionClosed, RequestTimedOut, ConnectionError):
            outcomes["another_mechanism"] = "closed"
        except ClusterAuthenticationError as exc:
            outcomes["another_mechanism"] = str(exc)
    finally:
        await client.close()
    return outcomes


KAFKAS = {  # Kafka 4.1.1's answers with a 3 s SCRAM-SHA-512 session, as measured by wire_outcomes
    "lifetime_ms": REAUTH_MS,
    "reauthenticated_lifetime_ms": REAUTH_MS,
    "answered_after_reauthentication": True,
    "second_within_a_second": "SaslHandshake failed with error code 34",
    "kept_after_refused_second": True,
    "closed_after_expiry": True,
    "another_principal": "Cannot change principals during re-authentication from User.alice: User.bob",
    "closed_after_another_principal": True,
    "another_mechanism": "closed",
}


async def test_the_wire_matches_kafkas_broker_configured_the_same(cluster: Cluster) -> None:
    assert await wire_outcomes(cluster, broker_port(cluster), "SCRAM-SHA-512") == KAFKAS
    async with ours(cluster) as running:
        # the broker's sessions expire too: re-authenticated in place on the connection's link
        assert await wire_outcomes(cluster, running.port, "SCRAM-SHA-512") == KAFKAS
        # they never do: the same answers, each re-authentication checked by the cluster on a fresh connection
        assert await wire_outcomes(cluster, running.port, "SCRAM-SHA-256") == KAFKAS
        log = running.log_text()
    assert "upstream=link" in log and "upstream=fresh_connection" in log
    assert "reason=sasl_session_expired" in log
    assert "reason=sasl_reauthentication_failed" in log  # another principal
    assert "alice-secret" not in log and "bob-secret" not in log


async def oauthbearer_session(cluster: Cluster, port: int, expires_in_s: int) -> tuple[KafkaClient, int]:
    """A connection authenticated with an unsecured OAUTHBEARER token (the broker's unsecured validator) that
    expires in `expires_in_s`; the session lifetime given."""
    context = ssl.create_default_context(cafile=str(cluster.certificates.ca))
    client = await KafkaClient.connect("localhost", port, client_id="reauth-wire", ssl=context, negotiate=False)
    handshake = await client.request(request(SASL_HANDSHAKE, 1, mechanism="OAUTHBEARER"))
    assert int(handshake.error_code) == 0, handshake
    now = int(time.time())

    def part(value: dict[str, object]) -> str:
        return base64.urlsafe_b64encode(json.dumps(value).encode()).decode().rstrip("=")

    token = f"{part({'alg': 'none'})}.{part({'sub': 'alice', 'iat': now, 'exp': now + expires_in_s})}."
    answer = await client.request(request(SASL_AUTHENTICATE, 2,
                                          auth_bytes=f"n,,\x01auth=Bearer {token}\x01\x01".encode()))
    assert int(answer.error_code) == 0, answer
    return client, int(answer.session_lifetime.total_seconds() * 1000)


async def test_an_oauthbearer_tokens_expiry_bounds_the_session_as_on_kafka(cluster: Cluster) -> None:
    """No connections.max.reauth.ms for OAUTHBEARER on the broker, a longer one of ours: the token's remaining
    lifetime is the session's, on both; past it, the connection is closed on both."""
    async with ours(cluster, max_reauth_ms=60_000) as running:
        for port in (broker_port(cluster), running.port):
            client, lifetime_ms = await oauthbearer_session(cluster, port, expires_in_s=3)
            try:
                assert 1_000 < lifetime_ms <= 3_000, (port, lifetime_ms)
                assert not await closed(client)
                await asyncio.sleep(lifetime_ms / 1000 + 0.5)
                assert await closed(client), port
            finally:
                await client.close()
        assert "reason=sasl_session_expired" in running.log_text()


def set_password(cluster: Cluster, user: str, password: str) -> None:
    admin = AdminClient({"bootstrap.servers": cluster.broker.sasl_ssl_bootstrap,
                         **cluster.librdkafka("admin", "SCRAM-SHA-256")})
    for mechanism in (ScramMechanism.SCRAM_SHA_256, ScramMechanism.SCRAM_SHA_512):  # one per request (Kafka's rule)
        upsertion = UserScramCredentialUpsertion(user, ScramCredentialInfo(mechanism, 4096), password.encode())
        for future in admin.alter_user_scram_credentials([upsertion]).values():
            future.result(60)


async def accepted(cluster: Cluster, mechanism: str, password: str) -> bool:
    """Whether the broker takes carol's `password` (a credential change reaches it shortly after the controller)."""
    try:
        client, _lifetime = await session(cluster, broker_port(cluster), "carol", mechanism, password)
    except ClusterAuthenticationError:
        return False
    await client.close()
    return True


async def test_a_credential_changed_since_fails_the_re_authentication_as_on_kafka(cluster: Cluster) -> None:
    """carol's password changes during her session: her re-authentication with the old one is refused with
    Kafka's message, then the connection closed; on the broker and through us on both upstream paths (so a fresh
    upstream connection is what checks the credentials again where the link's session never expires)."""
    outcomes: dict[tuple[str, str], tuple[str, bool]] = {}
    async with ours(cluster) as running:
        for target, port, mechanism in (("kafka", broker_port(cluster), "SCRAM-SHA-512"),
                                         ("ours", running.port, "SCRAM-SHA-512"),
                                         ("ours", running.port, "SCRAM-SHA-256")):
            old, new = unique("old"), unique("new")
            await asyncio.to_thread(set_password, cluster, "carol", old)
            await wait_until(lambda: accepted(cluster, mechanism, old), 60, "carol's password set", interval_s=0.2)
            client, _lifetime = await session(cluster, port, "carol", mechanism, old)
            try:
                await asyncio.to_thread(set_password, cluster, "carol", new)
                await wait_until(lambda: accepted(cluster, mechanism, new), 60, "carol's password changed",
                                 interval_s=0.2)
                try:
                    await authenticate(client.request, cluster.security("carol", mechanism, old))
                    said = "accepted"
                except ClusterAuthenticationError as exc:
                    said = str(exc).replace(mechanism, "<mechanism>")
                outcomes[(target, mechanism)] = (said, await closed(client))
            finally:
                await client.close()
    refused = ("Authentication failed during re-authentication due to invalid credentials with SASL mechanism "
               "<mechanism>", True)
    assert outcomes == {("kafka", "SCRAM-SHA-512"): refused, ("ours", "SCRAM-SHA-512"): refused,
                        ("ours", "SCRAM-SHA-256"): refused}


async def delegation_token(cluster: Cluster, user: str) -> tuple[str, str]:
    """(token id, HMAC in base64) of a delegation token `user` creates for itself."""
    client, _lifetime = await session(cluster, broker_port(cluster), user, "SCRAM-SHA-256")
    try:
        created = await client.request(request(CREATE_DELEGATION_TOKEN, 3, owner_principal_type=None,
                                               owner_principal_name=None, renewers=(),
                                               max_lifetime=datetime.timedelta(hours=1)))
    finally:
        await client.close()
    assert int(created.error_code) == 0, created
    return str(created.token_id), base64.b64encode(bytes(created.hmac)).decode()


async def token_session(cluster: Cluster, port: int, token: tuple[str, str]) -> tuple[KafkaClient, int]:
    context = ssl.create_default_context(cafile=str(cluster.certificates.ca))
    client = await KafkaClient.connect("localhost", port, client_id="reauth-wire", ssl=context, negotiate=False)
    return client, await run_exchange(client.request, "SCRAM-SHA-256", token_exchange(token))


def token_exchange(token: tuple[str, str]) -> Generator[bytes, bytes, None]:
    return sasl_client._scram("SCRAM-SHA-256", token[0], token[1], token=True)


async def test_a_delegation_token_authenticates_as_its_owner_through_us(cluster: Cluster) -> None:
    """SCRAM with tokenauth=true: the broker checks the token, and the connection's principal is the token's owner
    (asked of the cluster), not the token's id; it re-authenticates like any session; the Java consumer
    configured with the token consumes and commits through us."""
    from tests.support.java_consumer import JavaConsumer

    token = await delegation_token(cluster, "alice")

    async def accepted_until_the_token_expires() -> bool:
        """Kafka takes the token (once it is in the broker's metadata); the session lasts until the token expires
        (the credential's lifetime: no connections.max.reauth.ms for SCRAM-SHA-256 on the broker)."""
        try:
            client, lifetime_ms = await token_session(cluster, broker_port(cluster), token)
        except ClusterAuthenticationError:
            return False
        await client.close()
        assert 3_000_000 < lifetime_ms <= 3_600_000, lifetime_ms
        return True

    await wait_until(accepted_until_the_token_expires, 60, "the token accepted by the broker", interval_s=0.5)
    topic, group = unique("token"), unique("token-app")
    await asyncio.to_thread(create_topic, cluster, topic)
    await asyncio.to_thread(produce, cluster, topic, 0)
    async with ours(cluster) as running:
        client, lifetime_ms = await token_session(cluster, running.port, token)
        try:
            assert lifetime_ms == REAUTH_MS
            await asyncio.sleep(ONE_SECOND_S)
            assert await run_exchange(client.request, "SCRAM-SHA-256", token_exchange(token)) == REAUTH_MS
            assert not await closed(client)
        finally:
            await client.close()
        said = running.log_text()
        assert f"principal=User:alice session_lifetime_ms={REAUTH_MS} reauthentication=true" in said
        assert f"principal=User:{token[0]}" not in said and token[1] not in said

        java = await asyncio.to_thread(
            JavaConsumer, f"localhost:{running.port}", group, topic, session_timeout_ms=10_000,
            properties={"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-256",
                        "sasl.jaas.config": f'{SCRAM} required username="{token[0]}" password="{token[1]}" '
                                            f'tokenauth="true";',
                        "ssl.truststore.type": "PEM", "ssl.truststore.location": str(cluster.certificates.ca)})
        try:
            await asyncio.to_thread(java.wait_for, lambda c: all(
                c.committed.get((topic, p)) == RECORDS for p in range(PARTITIONS)), TIMEOUT_S,
                "the Java consumer's commits, authenticated with alice's token")
        finally:
            await asyncio.to_thread(java.close, 60)
        assert "event=delegation_token_owner_unknown" not in running.log_text()


def create_topic(cluster: Cluster, topic: str) -> None:
    admin = AdminClient({"bootstrap.servers": cluster.broker.sasl_ssl_bootstrap,
                         **cluster.librdkafka("admin", "SCRAM-SHA-256")})
    admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result(60)


def produce(cluster: Cluster, topic: str, batch: int) -> None:
    producer = Producer({"bootstrap.servers": cluster.broker.sasl_ssl_bootstrap,
                         **cluster.librdkafka("admin", "SCRAM-SHA-256"), "acks": "all", "linger.ms": 5})
    for partition in range(PARTITIONS):
        for n in range(batch * RECORDS, (batch + 1) * RECORDS):
            producer.produce(topic, value=f"p{partition}-{n}".encode(), partition=partition)
    assert producer.flush(60) == 0, "records not delivered"


_REAUTHENTICATED = re.compile(r"event=sasl_authenticated peer=(\S+) listener=\S+:(\d+) .*reauthentication=true")


def reauthentications(running: Service) -> dict[tuple[str, int], int]:
    """(client address, our listener's port) -> re-authentications completed on that connection."""
    counts: dict[tuple[str, int], int] = {}
    for match in _REAUTHENTICATED.finditer(running.log_text()):
        key = (match.group(1), int(match.group(2)))
        counts[key] = counts.get(key, 0) + 1
    return counts


def reauthenticated_on_both_listeners(running: Service, times: int) -> bool:
    """A connection to the coordinator listener and one to a relay listener each re-authenticated `times`."""
    counts = reauthentications(running)
    return (any(n >= times for (_peer, port), n in counts.items() if port == running.port)
            and any(n >= times for (_peer, port), n in counts.items() if port != running.port))


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
async def test_java_and_librdkafka_consumers_keep_their_connections_across_reauthentications(
        cluster: Cluster, mechanism: str) -> None:
    from tests.support.java_consumer import JavaConsumer

    topic, group = unique("reauth"), unique("reauth-app")
    await asyncio.to_thread(create_topic, cluster, topic)
    await asyncio.to_thread(produce, cluster, topic, 0)
    java_properties = {"security.protocol": "SASL_SSL", "sasl.mechanism": mechanism,
                       "sasl.jaas.config": f'{SCRAM} required username="alice" password="alice-secret";',
                       "ssl.truststore.type": "PEM", "ssl.truststore.location": str(cluster.certificates.ca)}
    async with ours(cluster) as running:
        bootstrap = f"localhost:{running.port}"
        java = await asyncio.to_thread(JavaConsumer, bootstrap, f"{group}-java", topic, session_timeout_ms=10_000,
                                       properties=java_properties)
        librdkafka = await ConsumerProcess("confluent", f"{group}-librdkafka", bootstrap, topic,
                                           f"{group}-librdkafka", "range",
                                           settings=cluster.librdkafka("alice", mechanism)).start()
        try:
            await asyncio.to_thread(java.wait_for, lambda c: len(c.records) >= PARTITIONS * RECORDS, TIMEOUT_S,
                                    "the Java consumer's first records")
            await wait_until(lambda: len(librdkafka.records) >= PARTITIONS * RECORDS, TIMEOUT_S,
                             "librdkafka's first records", interval_s=0.5)
            await wait_until(lambda: reauthenticated_on_both_listeners(running, 3), TIMEOUT_S,
                             "connections to the coordinator and relay listeners re-authenticated three times",
                             interval_s=0.5)
            await asyncio.to_thread(produce, cluster, topic, 1)
            await asyncio.to_thread(java.wait_for, lambda c: all(
                c.committed.get((topic, p)) == 2 * RECORDS for p in range(PARTITIONS)), TIMEOUT_S,
                "the Java consumer's commits of the records produced after re-authentications")
            await wait_until(lambda: len(librdkafka.records) >= 2 * PARTITIONS * RECORDS, TIMEOUT_S,
                             "librdkafka's records produced after re-authentications", interval_s=0.5)
            assert all(committed for *_rest, committed in librdkafka.records), "a librdkafka commit failed"
        finally:
            await asyncio.to_thread(java.close, 60)
            await stop_all([librdkafka])
        assert b"Traceback" not in librdkafka.stderr, librdkafka.stderr.decode(errors="replace")[-3000:]
        log = running.log_text()
    # every client re-authenticated in time: no session of theirs expired, no re-authentication failed
    assert "reason=sasl_session_expired" not in log and "reason=sasl_sequence" not in log
    assert "event=sasl_failed" not in log
    assert ("upstream=fresh_connection" if mechanism == "SCRAM-SHA-256" else "upstream=link") in log


async def test_aiokafka_which_does_not_reauthenticate_is_disconnected_at_expiry_and_reconnects(
        cluster: Cluster) -> None:
    topic, group = unique("reauth-aiokafka"), unique("reauth-aiokafka-app")
    await asyncio.to_thread(create_topic, cluster, topic)
    await asyncio.to_thread(produce, cluster, topic, 0)
    settings = {**cluster.librdkafka("alice", "SCRAM-SHA-256"), "security.protocol": "SASL_SSL"}
    async with ours(cluster) as running:
        consumer = await ConsumerProcess("aiokafka", group, f"localhost:{running.port}", topic, group, "range",
                                         settings=settings).start()
        try:
            await wait_until(lambda: len(consumer.records) >= PARTITIONS * RECORDS, TIMEOUT_S,
                             "aiokafka's first records", interval_s=0.5)
            await wait_until(lambda: running.log_text().count("reason=sasl_session_expired") >= 2, TIMEOUT_S,
                             "aiokafka's connections closed when their sessions expired", interval_s=0.5)
            await asyncio.to_thread(produce, cluster, topic, 1)
            await wait_until(lambda: len(consumer.records) >= 2 * PARTITIONS * RECORDS, TIMEOUT_S,
                             "aiokafka's records after reconnecting", interval_s=0.5)
        finally:
            await stop_all([consumer])
        assert "reauthentication=true" not in running.log_text()


async def test_lifetimes_per_listener_and_mechanism_the_relays_own_reauthentication_and_the_expired_count(
        cluster: Cluster) -> None:
    """Ours configured as Kafka reads it: a per-mechanism value for SCRAM-SHA-256, the listener's own over the
    broker-wide one for the rest (each bounded by the broker's, 3 s for SCRAM-SHA-512). The coordinator's own
    SCRAM-SHA-512 session with the broker (3 s) is re-authenticated on the relay's control connection, which keeps
    answering clients' Metadata on the same connection; the client connection used past its session's end is
    counted in Kafka's expired-connections-killed-count, on our Prometheus endpoint."""
    from coordinator.embedded.broker import free_port
    from tests.support.metrics import scrape

    cluster.security("admin", "SCRAM-SHA-512")  # its properties file: the coordinator's own credentials
    metrics_port = free_port()
    async with service(cluster.broker.sasl_ssl_bootstrap, unique("reauth-state"), *FAST,
                       "ssl.keystore.type=PEM", f"ssl.keystore.location={cluster.certificates.broker_keystore}",
                       "connections.max.reauth.ms=60000", "listener.name.sasl_ssl.connections.max.reauth.ms=50000",
                       "listener.name.sasl_ssl.scram-sha-256.connections.max.reauth.ms=2000",
                       relay=True, listen="SASL_SSL://127.0.0.1:0",
                       args=("--command-config", str(cluster.directory / "admin-SCRAM-SHA-512.properties"),
                             "--metrics-listen", f"127.0.0.1:{metrics_port}")) as running:
        clients, lifetimes = {}, {}
        for mechanism in ("SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN"):
            clients[mechanism], lifetimes[mechanism] = await session(cluster, running.port, "alice", mechanism)
        try:
            assert lifetimes == {"SCRAM-SHA-256": 2_000, "SCRAM-SHA-512": REAUTH_MS, "PLAIN": 50_000}
            await wait_until(lambda: closed(clients["SCRAM-SHA-256"]), 10, "the 2 s session closed once expired",
                             interval_s=0.2)

            async def answered_across_two_reauthentications() -> bool:
                assert not await closed(clients["PLAIN"])  # Metadata: answered on the relay's control connection
                return running.log_text().count("event=upstream_reauthenticated") >= 2

            await wait_until(answered_across_two_reauthentications, 30, "the control connection re-authenticated "
                             "twice", interval_s=0.3)
            metrics = await asyncio.to_thread(scrape, f"http://127.0.0.1:{metrics_port}/metrics")
        finally:
            for client in clients.values():
                await client.close()
        log = running.log_text()
    assert metrics[("coordinator_connections_expired_killed_total", "")] == 1
    assert "mechanism=SCRAM-SHA-512 principal=User:admin session_lifetime_ms=3000" in log
    assert "event=relay_control_request_failed" not in log and "upstream_reauthentication_failed" not in log
    assert "admin-secret" not in log


async def test_requests_sent_while_our_connection_re_authenticates_wait_for_it(cluster: Cluster) -> None:
    """A connection of ours to the broker (3 s SCRAM-SHA-512 sessions) with requests always in flight: those
    written while the exchange runs are held and sent after it (the broker would read them as SASL tokens), so
    every one is answered across several re-authentications on the one connection."""
    from coordinator.security.clusters import ClusterSecurity
    from coordinator.security.connections import connect
    from coordinator.security.reauthentication import ReauthenticatingClient

    security = ClusterSecurity.of(cluster.security("admin", "SCRAM-SHA-512"))
    host, port = cluster.broker.sasl_ssl_bootstrap.rsplit(":", 1)
    client = await connect(host, int(port), security, client_id="reauth-held", timeout_ms=30_000,
                           reauthenticate=True)
    assert isinstance(client, ReauthenticatingClient)
    metadata = request(ApiKey.METADATA, 12, topics=(), allow_auto_topic_creation=False,
                       include_topic_authorized_operations=False)
    answered = 0

    async def keep_asking() -> None:
        nonlocal answered
        while client.reauthentications < 2:
            await asyncio.gather(*(client.request(metadata) for _ in range(8)))  # 8 in flight at every moment
            answered += 8

    try:
        await asyncio.wait_for(keep_asking(), 3 * REAUTH_MS / 1000 + 10)
        assert not client.is_closed and answered > 16
    finally:
        await client.close()
