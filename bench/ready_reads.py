"""A loop turn with thousands of ready connections: asyncio's own loop against the service's (a bounded number of
ready connections a turn, coordinator/server/event_loop.py), side by side.

    python -m bench.ready_reads [--connections 3334] [--rounds 20] [--events-per-poll 128]

Our CoordinatorServer + GroupRuntime (in-memory store) in this process; `--connections` blocking client sockets in a
thread of their own, every one sending a Heartbeat v4 each round while the loop is held (all readable at the
server's next poll, as after a stretch the machine did not schedule the server), then reading its answer. A ticker rescheduled every loop turn measures each
turn's CPU time (this thread's: the machine's load does not change it) and the reads in it. Printed per loop: the
longest turn and the median of the rounds' longest turns (ms CPU), the most reads in one turn, CPU per round; then
the ratios service ÷ asyncio. A final JSON line has the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

from coordinator.config import CoordinatorConfig
from coordinator.group.runtime import GroupRuntime
from coordinator.group.store import InMemoryGroupStore
from coordinator.server import CoordinatorServer, ServerConfig
from coordinator.server import event_loop
from coordinator.server.connection import Connection
from coordinator.timer import SystemTimer
from protocol import codec
from protocol.apis import ApiKey
from tests.support.wire import request

_V4_ANSWER_BYTES = 16


async def _measure(connections: int, rounds: int) -> dict[str, Any]:
    timer = SystemTimer("ready-reads")
    timer.start()
    runtime = GroupRuntime(CoordinatorConfig(), timer, InMemoryGroupStore())
    server = CoordinatorServer(ServerConfig(listen_host="127.0.0.1", listen_port=0), runtime)
    await server.start()
    loop = asyncio.get_running_loop()
    socks = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(connections)]  # blocking: the peers'
    while server.connection_count < connections:  # thread's; the kernel's backlog completes the connects
        await asyncio.sleep(0.01)
    reads = [0]
    read = Connection.buffer_updated

    def counted(self: Connection, nbytes: int) -> None:
        reads[0] += 1
        read(self, nbytes)

    turn_cpu: list[float] = []
    turn_reads: list[int] = []
    last = [time.thread_time()]

    def tick() -> None:
        now = time.thread_time()
        turn_cpu.append(now - last[0])
        turn_reads.append(reads[0])
        reads[0] = 0
        last[0] = now
        ticker[0] = loop.call_soon(tick)

    frame = codec.encode_request(1, "bench", request(ApiKey.HEARTBEAT, 4, group_id="g", generation_id=1,
                                                     member_id="m", group_instance_id=None))
    go, sent = threading.Event(), threading.Event()

    def peers(answered: asyncio.Future[None]) -> None:
        """The peers' thread: every connection sends while the loop is held (as a server the machine did not
        schedule), then every answer is read."""
        go.wait()
        for sock in socks:
            sock.sendall(frame)
        sent.set()
        for sock in socks:
            data = b""
            while len(data) < _V4_ANSWER_BYTES:
                chunk = sock.recv(4_096)
                if not chunk:
                    raise ConnectionError("the server closed a connection")
                data += chunk
        loop.call_soon_threadsafe(answered.set_result, None)

    def hold() -> None:  # blocks the loop until every peer has sent (waiting: no CPU of this thread)
        go.set()
        sent.wait(30)
        last[0] = time.thread_time()

    longest_ms: list[float] = []
    most_reads = 0
    cpu_per_round: list[float] = []
    Connection.buffer_updated = counted  # type: ignore[method-assign]
    ticker = [loop.call_soon(tick)]
    try:
        for _ in range(rounds):
            await asyncio.sleep(0.05)  # the previous round's callbacks settled
            go.clear()
            sent.clear()
            answered: asyncio.Future[None] = loop.create_future()
            peer_thread = threading.Thread(target=peers, args=(answered,), daemon=True)
            peer_thread.start()
            loop.call_soon(hold)
            await asyncio.sleep(0)  # the hold runs: the turns measured start after it
            turn_cpu.clear()
            turn_reads.clear()
            started = time.thread_time()
            await asyncio.wait_for(answered, 60)
            cpu_per_round.append(time.thread_time() - started)
            longest_ms.append(max(turn_cpu) * 1000)
            most_reads = max(most_reads, max(turn_reads))
            peer_thread.join(10)
    finally:
        ticker[0].cancel()
        Connection.buffer_updated = read  # type: ignore[method-assign]
        for sock in socks:
            sock.close()
        await server.close()
        await runtime.shutdown()
        await timer.close()
    return {"longest_turn_ms": round(max(longest_ms), 2), "median_longest_turn_ms": round(statistics.median(longest_ms), 2),
            "most_reads_in_a_turn": most_reads,
            "cpu_per_round_ms": round(statistics.median(cpu_per_round) * 1000, 1)}


def _run(make_loop: Callable[[], asyncio.AbstractEventLoop], connections: int, rounds: int) -> dict[str, Any]:
    with asyncio.Runner(loop_factory=make_loop) as runner:
        return runner.run(_measure(connections, rounds))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--connections", type=int, default=3_334)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--events-per-poll", type=int, default=event_loop.EVENTS_PER_POLL)
    args = parser.parse_args()
    figures = {"connections": args.connections, "rounds": args.rounds, "events_per_poll": args.events_per_poll}
    for name, make_loop in (("asyncio", asyncio.new_event_loop),
                            ("service", lambda: event_loop.new_event_loop(args.events_per_poll))):
        figures[name] = _run(make_loop, args.connections, args.rounds)
        print(f"{name:8} longest turn {figures[name]['longest_turn_ms']:7.2f} ms CPU (median of the rounds' "
              f"{figures[name]['median_longest_turn_ms']:.2f}), most reads in a turn "
              f"{figures[name]['most_reads_in_a_turn']}, CPU per round {figures[name]['cpu_per_round_ms']} ms",
              flush=True)
    mine, theirs = figures["service"], figures["asyncio"]
    figures["ratio_longest_turn"] = round(mine["longest_turn_ms"] / theirs["longest_turn_ms"], 3)
    figures["ratio_median_longest_turn"] = round(mine["median_longest_turn_ms"] / theirs["median_longest_turn_ms"], 3)
    figures["ratio_cpu_per_round"] = round(mine["cpu_per_round_ms"] / theirs["cpu_per_round_ms"], 3)
    print(f"service ÷ asyncio: longest turn {figures['ratio_longest_turn']}, median longest turn "
          f"{figures['ratio_median_longest_turn']}, CPU per round {figures['ratio_cpu_per_round']}")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
