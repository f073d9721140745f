"""Shared by the discovery tests: several coordinator instances in-process, each a real CoordinatorServer and
GroupRuntime (in-memory store) owning its share of the state partitions, with one directory between them that the
test controls (what the owner map would say).

Moving partitions here stands in for what Kafka does between real instances (coordinator/cluster): the state a
real instance would read from the state topic is copied from the old owner's in-memory store."""

from __future__ import annotations

from coordinator.config import CoordinatorConfig
from coordinator.group.partitioner import partition_for
from coordinator.server.context import Node
from tests.support.server import FAST_GROUPS, RunningServer

PARTITIONS = FAST_GROUPS.offsets_topic_num_partitions


class StaticDirectory:
    """The directory (coordinator/server/context.py) as a table: partition → node, and the live nodes."""

    def __init__(self, num_partitions: int = PARTITIONS) -> None:
        self.num_partitions = num_partitions
        self.owners: dict[int, Node | None] = {}
        self.live: list[Node] = []

    def coordinator_node(self, group_id: str) -> Node | None:
        return self.owners.get(partition_for(group_id, self.num_partitions))

    def nodes(self) -> list[Node]:
        return list(self.live)


class Instances:
    """`async with Instances(3) as cluster:` instance i owns the partitions p with p % n == i."""

    def __init__(self, count: int, config: CoordinatorConfig = FAST_GROUPS) -> None:
        self.directory = StaticDirectory(config.offsets_topic_num_partitions)
        self.envs = [RunningServer(config, node_id=100 + i, directory=self.directory) for i in range(count)]
        self.alive = [False] * count

    async def __aenter__(self) -> Instances:
        try:
            for index, env in enumerate(self.envs):
                await env.__aenter__()
                self.alive[index] = True
                self.directory.live.append(env.server.node)
            everything = set(range(self.directory.num_partitions))
            for index, env in enumerate(self.envs):
                owned = {p for p in everything if p % len(self.envs) == index}
                await env.coordinator.unload(everything - owned)
                self.directory.owners.update({p: env.server.node for p in owned})
        except BaseException:
            await self.__aexit__(None, None, None)
            raise
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        for index in range(len(self.envs)):
            await self.stop(index)

    @property
    def addresses(self) -> tuple[tuple[str, int], ...]:
        return tuple(("127.0.0.1", env.port) for env in self.envs)

    def owned_by(self, index: int) -> list[int]:
        node = self.envs[index].server.node
        return sorted(p for p, owner in self.directory.owners.items() if owner == node)

    async def stop(self, index: int) -> None:
        """The instance is gone: its listener closed (connections refused), its connections dropped. The
        directory still names it (as a stale owner map does) until the test says otherwise."""
        if self.alive[index]:
            self.alive[index] = False
            await self.envs[index].__aexit__(None, None, None)
            node = self.envs[index].server.node
            self.directory.live = [n for n in self.directory.live if n != node]

    def forget_owner(self, partitions: list[int]) -> None:
        self.directory.owners.update({p: None for p in partitions})

    async def take_over(self, index: int, partitions: list[int], from_index: int) -> None:
        """Instance `index` loads `partitions` with the state `from_index` had written, then serves them."""
        source, target = self.envs[from_index].store, self.envs[index].store
        target.groups.update(source.groups)
        target.offsets.update(source.offsets)
        target.partition_of.update(source.partition_of)
        await self.envs[index].coordinator.load(partitions)
        self.directory.owners.update({p: self.envs[index].server.node for p in partitions})

