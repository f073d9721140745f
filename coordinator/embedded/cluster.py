"""A real multi-node Apache Kafka cluster (KRaft) on loopback, built from the same `KafkaNode` as the single broker.

Every node runs in combined mode (broker and controller in one JVM) and all of them are the controller quorum.
Why combined rather than a separate controller: three JVMs instead of four on a small shared machine, and a
quorum of three voters survives any one node being stopped, so `stop_broker` exercises broker failover (and a
controller failover when it hits the active controller) without losing the cluster. Layout of the data dir:
`cluster.json` (cluster id, node count) and `node-<id>/` per node, each keeping its own ports (`ports.json`), so
a restarted node, or a whole cluster started again on the same data dir, comes back at the same addresses.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Mapping, Sequence

from coordinator.embedded.broker import AsyncLifecycle, BrokerStartError, KafkaNode, random_cluster_id
from coordinator.embedded.secured import SecureListeners

log = logging.getLogger("coordinator.embedded")


def cluster_properties(brokers: int) -> dict[str, str]:
    """Broker settings that make sense for `brokers` nodes (a user's extra properties override them)."""
    replicas = min(brokers, 3)
    return {
        "default.replication.factor": str(replicas),
        "min.insync.replicas": str(max(1, replicas - 1)),  # acks=all keeps working with one replica down
        "offsets.topic.replication.factor": str(replicas),
        # fewer than Kafka's 50: still spreads group coordinators over every node, at a fraction of the logs
        "offsets.topic.num.partitions": "12",
        "transaction.state.log.replication.factor": str(replicas),
        "transaction.state.log.min.isr": str(max(1, replicas - 1)),
        # a restarted node gets its preferred leaderships back within seconds, not Kafka's 5 minutes
        "leader.imbalance.check.interval.seconds": "5",
    }


class EmbeddedKafkaCluster(AsyncLifecycle):
    """`brokers` Kafka nodes on 127.0.0.1 forming one KRaft cluster; node ids are 1..brokers.

    Each JVM defaults to a 384 MiB heap and the C1 JIT only (-XX:TieredStopAtLevel=1): measured on this 2-core
    machine, three nodes then spend ~11 s of CPU to come up instead of ~18 s; test traffic does not need C2.
    """

    def __init__(
        self,
        brokers: int = 3,
        data_dir: str | os.PathLike[str] | None = None,
        *,
        extra_properties: Mapping[str, str] | None = None,
        heap_mb: int = 384,
        jvm_options: Sequence[str] = ("-XX:TieredStopAtLevel=1",),
        startup_timeout_s: float = 180.0,
        stop_timeout_s: float = 30.0,
        secure: SecureListeners | None = None,
    ) -> None:
        if brokers < 1:
            raise ValueError("a cluster needs at least one broker")
        self._owns_data_dir = data_dir is None
        self.data_dir = Path(data_dir) if data_dir else Path(tempfile.mkdtemp(prefix="embedded-kafka-cluster-"))
        self.startup_timeout_s = startup_timeout_s
        self.cluster_id = self._load_or_create_layout(brokers)
        properties = {**cluster_properties(brokers), **(extra_properties or {})}
        self.nodes: dict[int, KafkaNode] = {
            node_id: KafkaNode(
                self.data_dir / f"node-{node_id}", node_id=node_id, extra_properties=properties, heap_mb=heap_mb,
                jvm_options=jvm_options,
                startup_timeout_s=startup_timeout_s, stop_timeout_s=stop_timeout_s, secure=secure,
            )
            for node_id in range(1, brokers + 1)
        }
        quorum = ",".join(f"{n.node_id}@127.0.0.1:{n.controller_port}" for n in self.nodes.values())
        for node in self.nodes.values():
            node.controller_quorum = quorum
            node.cluster_id = self.cluster_id

    # -- addresses ------------------------------------------------------------------------------------
    @property
    def bootstrap(self) -> str:
        """Every node's address, so a client finds the cluster whichever nodes are up."""
        return ",".join(node.bootstrap for node in self.nodes.values())

    @property
    def node_ids(self) -> list[int]:
        return list(self.nodes)

    def address(self, node_id: int) -> str:
        return self.node(node_id).bootstrap

    def addresses(self) -> dict[int, str]:
        return {node_id: node.bootstrap for node_id, node in self.nodes.items()}

    def node(self, node_id: int) -> KafkaNode:
        try:
            return self.nodes[node_id]
        except KeyError:
            raise KeyError(f"no node {node_id}; node ids are {self.node_ids}") from None

    def running_node_ids(self) -> list[int]:
        return [node_id for node_id, node in self.nodes.items() if node.running]

    def pids(self) -> dict[int, int]:
        return {node_id: node.pid for node_id, node in self.nodes.items() if node.pid is not None}

    # -- whole cluster --------------------------------------------------------------------------------
    def start_blocking(self) -> None:
        """Start every stopped node and wait until each running node's metadata lists all running nodes."""
        stopped = [node for node in self.nodes.values() if not node.running]
        try:
            # formatting is a JVM run per node: do them side by side
            with ThreadPoolExecutor(max_workers=len(stopped) or 1) as pool:
                list(pool.map(lambda node: node._prepare(), stopped))
            for node in stopped:  # spawn here: PDEATHSIG is tied to the forking thread, pool threads exit
                node._spawn()
            self.wait_ready()
        except BaseException:
            self.stop_blocking()
            raise
        log.info("event=kafka_cluster_started brokers=%s bootstrap=%s data_dir=%s",
                 len(self.nodes), self.bootstrap, self.data_dir)

    def stop_blocking(self) -> None:
        # all at once: stopped one by one, the last nodes lose their quorum and hang in controlled shutdown
        for node in self.nodes.values():
            node.signal_stop()
        for node in self.nodes.values():
            node.wait_stopped()

    def remove_data(self) -> None:
        if self._owns_data_dir and not self.running_node_ids():
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def wait_ready(self, timeout_s: float | None = None) -> None:
        """Wait until every running node answers Metadata listing every running node (registered, unfenced)."""
        deadline = time.monotonic() + (self.startup_timeout_s if timeout_s is None else timeout_s)
        confirmed: set[int] = set()
        while not self._ready(deadline, confirmed):
            time.sleep(0.25)

    def _ready(self, deadline: float, confirmed: set[int]) -> bool:
        """One check of the nodes not yet `confirmed` (short, so an async caller stays cancellable); raises if
        a node died or the deadline passed."""
        running = set(self.running_node_ids())
        for node_id, node in self.nodes.items():
            # a node that died since its spawn still has a process: its check raises with its log
            if node_id in confirmed or node.pid is None:
                continue
            node.expected_node_ids = running
            if node._ready(deadline):
                confirmed.add(node_id)
        return confirmed >= running

    # -- one node -------------------------------------------------------------------------------------
    def stop_broker(self, node_id: int) -> None:
        """Stop one node (SIGTERM: controlled shutdown moves its leaderships first)."""
        self.node(node_id).stop_blocking()

    def start_broker(self, node_id: int) -> None:
        """Start a stopped node on its old ports and data, and wait until the running nodes all list it."""
        node = self.node(node_id)
        if node.running:
            raise RuntimeError(f"node {node_id} is already running at {node.bootstrap}")
        node.launch()
        try:
            self.wait_ready()
        except BaseException:
            node.stop_blocking()
            raise

    # -- async API (`async with` from AsyncLifecycle) ----------------------------------------------------
    async def start(self) -> None:
        stopped = [node for node in self.nodes.values() if not node.running]
        await asyncio.gather(*(asyncio.to_thread(node._prepare) for node in stopped))
        for node in stopped:
            node._spawn()  # in the caller's thread, see start_blocking
        try:
            deadline, confirmed = time.monotonic() + self.startup_timeout_s, set[int]()
            while not await asyncio.to_thread(self._ready, deadline, confirmed):
                await asyncio.sleep(0.25)
        except BaseException:
            await self.stop()
            raise

    # -- internals ------------------------------------------------------------------------------------
    def _load_or_create_layout(self, brokers: int) -> str:
        """The cluster id and node count live with the data: a data dir is one cluster, started again as such."""
        layout_file = self.data_dir / "cluster.json"
        if layout_file.exists():
            layout = json.loads(layout_file.read_text())
            if layout["brokers"] != brokers:
                raise BrokerStartError(
                    f"{self.data_dir} holds a {layout['brokers']}-broker cluster, not {brokers}; "
                    "use the same --brokers or another data dir")
            return str(layout["cluster_id"])
        if (self.data_dir / "logs" / "meta.properties").exists():
            raise BrokerStartError(
                f"{self.data_dir} holds a single broker's data, not a cluster's; use another data dir")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        cluster_id = random_cluster_id()
        layout_file.write_text(json.dumps({"cluster_id": cluster_id, "brokers": brokers}) + "\n")
        return cluster_id
