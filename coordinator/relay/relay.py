"""The relay: fronts the upstream Kafka cluster so stock consumers bootstrap to the coordinator.

It owns the per-broker listeners, the buffer pool shared by every upstream link, one control connection to
the cluster (for the answers we rewrite: Metadata, FindCoordinator for transactions, and the topic lookups of
OffsetCommit; and the registered brokers' racks, fenced ones too), the advertised API table, and the cluster
metadata cache. Client connections (coordinator/server/connection.py) ask it to route each request and to open
their upstream link.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import struct
from collections.abc import Callable, Sequence
from typing import Any

from coordinator.relay.buffer_pool import BufferPool
from coordinator.relay.cluster import ClusterMetadata
from coordinator.relay.config import RelayConfig
from coordinator.relay.errors import UpstreamUnavailable
from coordinator.relay.group_configs import alteration_observer
from coordinator.relay.listeners import BrokerListeners, OpenListener, PortMapping, UpstreamBroker
from coordinator.relay.rewrite import rewrite_find_coordinator, rewrite_metadata, upstream_brokers
from coordinator.relay.produce_endpoints import endpoints_rewriter
from coordinator.relay.upstream import LinkOwner, RelayCounters, Rewrite, UpstreamLink
from coordinator.relay.versions import (RELAYED_MAX, ClusterFeatures, Route, advertised_ranges, local_keys,
                                        route_of)
from coordinator.security.clusters import cluster_security, without_sasl
from coordinator.security.connections import ClusterAccessError, connect
from coordinator.security.sasl_passthrough import passed_through_ranges
from kio.schema.api_versions.v4.request import ApiVersionsRequest as ApiVersionsRequestV4

from protocol import apis
from protocol.client import KafkaClient
from protocol.errors import ConnectionClosed, ProtocolError, RequestTimedOut, UnknownApiKey, UnsupportedVersion
from protocol.messages import build

log = logging.getLogger("coordinator.relay")

_CLIENT_ID = "kafka-group-coordinator-relay"
_API_KEY_AND_VERSION = struct.Struct(">hh")
_SOFTWARE_VERSION = "1"
_FEATURES_REFRESH_S = 30.0
_DESCRIBE_DELEGATION_TOKEN = 41
_DESCRIBE_CLUSTER, _INCLUDES_FENCED, _BROKERS = 60, 2, 1  # API key, first version with IncludeFencedBrokers, type


class Relay:
    def __init__(self, config: RelayConfig, bootstrap: str, *, served: dict[int, tuple[int, int]],
                 max_frame_bytes: int) -> None:
        self.config = config
        self.bootstrap = [_host_port(address) for address in bootstrap.split(",") if address.strip()]
        self.security = cluster_security(bootstrap)  # TLS/SASL of the relay's own connections (--command-config)
        # per-client upstream links: with SASL passed through, TLS only (the client authenticates itself)
        self.link_security = without_sasl(self.security) if config.sasl_passthrough else self.security
        self.served = served
        self._local_keys = local_keys(served)
        self.max_frame_bytes = max_frame_bytes
        self.pool = BufferPool(config.buffer_memory_bytes, config.poolable_bytes, config.max_block_ms)
        self.counters = RelayCounters()  # every link's requests and bytes, for the metrics
        self.cluster = ClusterMetadata(self._refresh_topics, config.metadata_refresh_min_interval_ms,
                                       refresh_all=self._all_topics, registered_brokers=self._registered_brokers)
        self.brokers: dict[int, UpstreamBroker] = {}
        self.cluster_id: str | None = None
        self.advertised = {}  # (the property below; with its route table)
        self.listeners: BrokerListeners | None = None
        self._advertised_host = config.advertised_host
        self._coordinator_node: Any = None  # coordinator.server.context.Node, set by attach()
        self._control: KafkaClient | None = None
        self._control_lock = asyncio.Lock()
        self._node_clients: dict[int, KafkaClient] = {}  # our own connection per broker (transaction coordinators)
        self._node_locks: dict[int, asyncio.Lock] = {}
        self._bootstrap_turn = itertools.count()
        self._produce_rewrites: dict[int, Rewrite | None] = {}
        self.features = ClusterFeatures()  # the cluster's, passed on in our ApiVersions answers
        self._features_learned_at = 0.0  # loop time
        self._features_refresh: asyncio.Task[None] | None = None
        # told which groups' configurations an (Incremental)AlterConfigs relayed for a client altered
        self.on_group_configs_altered: Callable[[list[str]], None] | None = None

    # ------------------------------------------------------------------------------------------ lifecycle

    def attach(self, listen_host: str, bootstrap_port: int, node: Any, open_listener: OpenListener,
               close_connections: Callable[[int], None]) -> None:
        """Called by the server once its bootstrap listener is bound (the port mapping may derive from it)."""
        self._coordinator_node = node
        if self._advertised_host is None:
            self._advertised_host = node.host
        base = self.config.base_port
        if base is None and bootstrap_port:
            base = bootstrap_port + 1
        if base is None:
            log.warning("event=relay_ephemeral_ports reason=listen_port_0 detail=broker listeners take any free "
                        "port; clients reconnecting after a restart must bootstrap again")
        self.listeners = BrokerListeners(listen_host, PortMapping(base), open_listener, close_connections)

    async def start(self) -> None:
        """Learn the cluster (ApiVersions, brokers) and open a listener per broker before clients arrive."""
        client = await self._control_client()
        self.advertised = advertised_ranges(client.api_versions, self.served)
        await self._learn_features()
        if self.config.sasl_passthrough:
            self.advertised = {**self.advertised, **passed_through_ranges(client.api_versions)}
        await self._learn_cluster()
        await self._learn_registered_brokers()
        if self.listeners is not None:
            self.listeners.refuse_clash(self.config.base_port is not None)
        log.info("event=relay_started upstream=%s brokers=%s advertised_apis=%d buffer_memory=%d poolable=%d",
                 client.address, sorted(self.brokers), len(self.advertised),
                 self.config.buffer_memory_bytes, self.config.poolable_bytes)

    def stop_accepting(self) -> None:
        if self.listeners is not None:
            self.listeners.stop_accepting()

    async def close(self) -> None:
        if self.listeners is not None:
            await self.listeners.close()
        if self._control is not None:
            await self._control.close()
        for client in list(self._node_clients.values()):
            await client.close()
        if self._features_refresh is not None:
            self._features_refresh.cancel()

    # ------------------------------------------------------------------------------------------ routing

    @property
    def advertised(self) -> dict[int, tuple[int, int]]:
        """api key -> (min, max) version of what we advertise (our ApiVersions answer). Set as a whole (never
        changed in place): the route table is made from it."""
        return self._advertised

    @advertised.setter
    def advertised(self, table: dict[int, tuple[int, int]]) -> None:
        self._advertised = table
        # every advertised (api key, version), keyed by a request's first four bytes as they come (big-endian
        # int16 api key, int16 version): `route` in one lookup on the path of every request a connection reads
        self.routes: dict[bytes, Route] = {
            _API_KEY_AND_VERSION.pack(key, version): route_of(key, self._local_keys)
            for key, (low, high) in table.items() for version in range(low, high + 1)}

    def route(self, api_key: int, api_version: int) -> Route:
        """How to handle a request; raises UnknownApiKey/UnsupportedVersion for what we do not advertise."""
        advertised = self.advertised.get(api_key)
        if advertised is None:
            raise UnknownApiKey(f"api_key={api_key} is not advertised by the relay")
        if not advertised[0] <= api_version <= advertised[1]:
            raise UnsupportedVersion(f"api_key={api_key} api_version={api_version} is not advertised "
                                     f"(range {advertised[0]}-{advertised[1]})")
        return route_of(api_key, self._local_keys)

    def open_link(self, owner: LinkOwner, node_id: int | None) -> UpstreamLink:
        """An upstream connection for one client connection: to broker `node_id`, or (bootstrap listener) to
        the known brokers in turn."""
        if node_id is None:
            if not self.brokers:
                raise UpstreamUnavailable("no upstream broker known")
            ids = sorted(self.brokers)
            node_id = ids[next(self._bootstrap_turn) % len(ids)]
        broker = self.brokers.get(node_id)
        if broker is None:
            raise UpstreamUnavailable(f"broker {node_id} is not in the cluster's metadata")
        link = UpstreamLink(owner, self.pool, node_id, broker.host, broker.port, self.max_frame_bytes, self.counters,
                            self.link_security)
        link.connect()
        return link

    # ------------------------------------------------------------------------------------------ rewritten APIs

    async def metadata(self, body: Any, coordinator_nodes: Sequence[Any]) -> Any:
        """A client's Metadata request answered by the cluster, addresses rewritten, the coordinators' nodes
        (ours, and every other live instance's) added."""
        response = await self.request(body)
        await self._observe_brokers(response)
        self.cluster.observe(response, all_topics=body.topics is None)
        return rewrite_metadata(response, coordinator_nodes, self._address_of)

    async def transaction_coordinators(self, body: Any) -> Any:
        """FindCoordinator for TRANSACTION keys: the cluster's answer with its broker addresses rewritten."""
        response = await self.request(body)
        return rewrite_find_coordinator(response, self._address_of)

    async def _learn_features(self) -> None:
        """The cluster's features from its ApiVersions v4 answer (v3 leaves some supported ones out)."""
        answer = await self.request(ApiVersionsRequestV4(client_software_name=_CLIENT_ID,
                                                         client_software_version=_SOFTWARE_VERSION))
        features = ClusterFeatures.of(answer)
        if features != self.features:
            log.info("event=relay_cluster_features epoch=%d finalized=%s", features.epoch,
                     ",".join(f"{name}={level}" for name, level, _ in features.finalized))
        self.features = features
        self._features_learned_at = asyncio.get_running_loop().time()

    def _refresh_features_now_and_then(self) -> None:
        """Finalized features change (kafka-features upgrade): learned again at most once a refresh interval,
        in the background, so a client's Metadata never waits for it."""
        loop = asyncio.get_running_loop()
        if (self._features_refresh is not None and not self._features_refresh.done()
                or loop.time() - self._features_learned_at < _FEATURES_REFRESH_S):
            return
        self._features_refresh = loop.create_task(self._refresh_features())

    async def _refresh_features(self) -> None:
        try:
            await self._learn_features()
        except UpstreamUnavailable as exc:
            log.warning("event=relay_features_refresh_failed error=%s", exc)

    def produce_rewrite(self, version: int) -> Rewrite | None:
        """What a Produce response of `version` goes through on its way to the client (KIP-951 endpoints)."""
        if version not in self._produce_rewrites:
            self._produce_rewrites[version] = endpoints_rewriter(version, self._address_of)
        return self._produce_rewrites[version]

    def config_alteration(self, api_key: int, version: int) -> Rewrite | None:
        """What an (Incremental)AlterConfigs answer goes through: read for the groups it altered (none when no one
        listens), relayed unchanged."""
        altered = self.on_group_configs_altered
        return None if altered is None else alteration_observer(api_key, version, altered)

    def _address_of(self, node_id: int) -> tuple[str, int] | None:
        """Where clients reach upstream broker `node_id` through us; None if we have no listener for it."""
        if self.listeners is None:
            return None
        port, host = self.listeners.port_of(node_id), self._advertised_host
        return None if port is None or host is None else (host, port)  # attach() set both

    # ------------------------------------------------------------------------------------------ the control link

    async def request(self, body: Any) -> Any:
        """One request to the cluster on the control connection; reconnects (to any broker) once on failure."""
        for attempt in (1, 2):
            client = await self._control_client()
            try:
                return await client.request(body, timeout_ms=self.config.upstream_timeout_ms)
            except (ConnectionClosed, RequestTimedOut, ProtocolError) as exc:
                log.warning("event=relay_control_request_failed attempt=%d api_key=%d upstream=%s error=%r",
                            attempt, body.__api_key__, client.address, exc)
                await client.close()
                if attempt == 2:
                    raise UpstreamUnavailable(f"the cluster did not answer: {exc!r}") from exc
        raise AssertionError("unreachable")

    async def token_owner(self, token_id: str) -> str | None:
        """The user owning delegation token `token_id` (a client authenticating with it is that user), as the
        coordinator's principal may describe it; None if it may not, or no such token."""
        response = await self.request(build(apis.request_class(_DESCRIBE_DELEGATION_TOKEN, 3), owners=None))
        if int(response.error_code) != 0:
            log.warning("event=describe_delegation_token_failed error_code=%d", int(response.error_code))
            return None
        for token in response.tokens:
            if token.token_id == token_id and token.principal_type == "User":
                return str(token.principal_name)
        return None

    async def request_to(self, node_id: int, body: Any, *, undecoded: bool = False) -> Any:
        """One request to broker `node_id` (a transaction coordinator: its requests must reach that broker) on
        our own connection to it; reconnects once on failure. `undecoded`: the response frame as bytes (for an
        answer kio cannot read, which the caller parses)."""
        for attempt in (1, 2):
            client = await self._node_client(node_id)
            try:
                return await client.send(body, timeout_ms=self.config.upstream_timeout_ms, raw=undecoded)
            except (ConnectionClosed, RequestTimedOut, ProtocolError) as exc:
                log.warning("event=relay_node_request_failed attempt=%d api_key=%d node=%d error=%r",
                            attempt, body.__api_key__, node_id, exc)
                await client.close()
                if attempt == 2:
                    raise UpstreamUnavailable(f"broker {node_id} did not answer: {exc!r}") from exc
        raise AssertionError("unreachable")

    async def _node_client(self, node_id: int) -> KafkaClient:
        async with self._node_locks.setdefault(node_id, asyncio.Lock()):
            client = self._node_clients.get(node_id)
            if client is not None and not client.is_closed:
                return client
            broker = self.brokers.get(node_id)
            if broker is None:
                raise UpstreamUnavailable(f"broker {node_id} is not in the cluster's metadata")
            try:
                client = await connect(broker.host, broker.port, self.security, client_id=_CLIENT_ID,
                                       timeout_ms=self.config.upstream_timeout_ms, reauthenticate=True)
            except (OSError, asyncio.TimeoutError, ProtocolError, ClusterAccessError) as exc:
                raise UpstreamUnavailable(f"broker {node_id} unreachable: {exc!r}") from exc
            self._node_clients[node_id] = client
            return client

    async def _control_client(self) -> KafkaClient:
        async with self._control_lock:
            if self._control is not None and not self._control.is_closed:
                return self._control
            candidates = [(b.host, b.port) for b in self.brokers.values()] + self.bootstrap
            errors = []
            for host, port in dict.fromkeys(candidates):
                try:
                    self._control = await connect(host, port, self.security, client_id=_CLIENT_ID,
                                                  timeout_ms=self.config.upstream_timeout_ms, reauthenticate=True)
                    return self._control
                except (OSError, asyncio.TimeoutError, ProtocolError, ClusterAccessError) as exc:
                    errors.append(f"{host}:{port}: {exc!r}")
            raise UpstreamUnavailable("no upstream broker reachable: " + "; ".join(errors))

    async def _learn_cluster(self, topics: tuple[Any, ...] | None = ()) -> Any:
        """The cluster's brokers, and `topics` (None: every topic)."""
        client = await self._control_client()
        version = client.version_for(int(apis.ApiKey.METADATA), self.served[int(apis.ApiKey.METADATA)][1])
        body = build(apis.request_class(apis.ApiKey.METADATA, version), topics=topics, allow_auto_topic_creation=False,
                     include_cluster_authorized_operations=False, include_topic_authorized_operations=False)
        response = await self.request(body)
        await self._observe_brokers(response)
        return response

    async def _learn_registered_brokers(self) -> None:
        try:
            await self.cluster.learn_registered_brokers()
        except UpstreamUnavailable as exc:  # asked again when a topic's replica is on a broker not seen
            log.warning("event=registered_brokers_unread error=%s", exc)

    async def _registered_brokers(self) -> Any:
        """DescribeCluster v2 listing fenced brokers too (KIP-1073, Kafka 4.0+); None from an older cluster."""
        client = await self._control_client()
        if client.api_versions.get(_DESCRIBE_CLUSTER, (0, -1))[1] < _INCLUDES_FENCED:
            return None
        return await self.request(build(apis.request_class(_DESCRIBE_CLUSTER, _INCLUDES_FENCED),
                                        include_cluster_authorized_operations=False, endpoint_type=_BROKERS,
                                        include_fenced_brokers=True))

    async def _all_topics(self) -> Any:
        return await self._learn_cluster(None)

    async def _refresh_topics(self, topics: list[str]) -> Any:
        client = await self._control_client()
        version = client.version_for(int(apis.ApiKey.METADATA), self.served[int(apis.ApiKey.METADATA)][1])
        request_class = apis.request_class(apis.ApiKey.METADATA, version)
        from protocol.messages import item_class

        topic_class = item_class(request_class, "topics")
        wanted = tuple(build(topic_class, name=name, topic_id=None) for name in topics)
        body = build(request_class, topics=wanted, allow_auto_topic_creation=False,
                     include_cluster_authorized_operations=False, include_topic_authorized_operations=False)
        response = await self.request(body)
        await self._observe_brokers(response)
        return response

    async def _observe_brokers(self, response: Any) -> None:
        brokers = upstream_brokers(response)
        if not brokers:
            return
        if self._coordinator_node is not None and self._coordinator_node.node_id in brokers:
            log.error("event=relay_node_id_clash node_id=%d detail=an upstream broker has the coordinator's node "
                      "id; set --node-id to an id no broker uses", self._coordinator_node.node_id)
        self.cluster_id = getattr(response, "cluster_id", None) or self.cluster_id
        if brokers != self.brokers:
            joined, left = sorted(set(brokers) - set(self.brokers)), sorted(set(self.brokers) - set(brokers))
            if self.brokers:
                log.info("event=relay_cluster_changed joined=%s left=%s", joined, left)
            self.brokers = brokers
        if self.listeners is not None:
            await self.listeners.reconcile(brokers)


def _host_port(address: str) -> tuple[str, int]:
    host, _, port = address.strip().rpartition(":")
    return host.strip("[]"), int(port)



