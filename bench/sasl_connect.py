"""Authenticated connections per second: TLS + SCRAM-SHA-256 straight to Kafka's broker, and through a SASL_SSL
listener of ours (the exchange passed through to the same broker over a TLS upstream link), in one run.

  python -m bench.sasl_connect [--connections 300] [--concurrency 8] [--repeats 3]

A secured embedded broker (coordinator/embedded/secured.py) and `coordinator serve --listen SASL_SSL://...` are
started here. Each connection: TCP, TLS handshake, SaslHandshake + two SaslAuthenticate rounds (our client,
coordinator/security/connections.py, a full TLS handshake every time, as librdkafka makes them), close; the
coordinator's upstream links resume TLS sessions (coordinator/security/tls_sessions.py). Reported: connections/s
each way (best of the repeats, alternating), the ratio, the coordinator's CPU per connection (from /proc), and how
many of its upstream TLS handshakes resumed a session (its `coordinator.relay.tls.handshakes` metric, scraped);
then, from this process, the CPU of opening an upstream link as the relay does (TLS only, an ApiVersions round
trip) with a full handshake each time and resuming sessions, alternating.
Loopback, a shared machine: quote the load average.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import re
import socket
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from coordinator.embedded import EmbeddedKafka
from coordinator.embedded.secured import secure_listeners_in, write_client_properties
from coordinator.security.client_config import load_command_config
from coordinator.security.clusters import ClusterSecurity, without_sasl
from coordinator.security.connections import connect
from coordinator.security.tls_sessions import TlsSessions


def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _connections(host: str, port: int, security: ClusterSecurity, count: int, concurrency: int) -> float:
    """Connections per second: `count` authenticated connections, `concurrency` at a time."""
    semaphore = asyncio.Semaphore(concurrency)

    async def one() -> None:
        async with semaphore:
            client = await connect(host, port, security, client_id="bench", timeout_ms=30_000, negotiate=False)
            await client.close()

    started = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(count)))
    return count / (time.perf_counter() - started)


async def _upstream_handshake_cpu_ms(host: str, port: int, security: ClusterSecurity, count: int) -> float:
    """This process's CPU per connection opened as the relay opens a client's upstream link (TLS only, the SASL
    being the client's), one at a time, each with an ApiVersions round trip (so a session ticket has arrived)."""
    started = time.process_time()
    for _ in range(count):
        client = await connect(host, port, security, client_id="bench", timeout_ms=30_000, negotiate=True)
        await client.close()
    return (time.process_time() - started) / count * 1e3


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _upstream_handshakes(metrics_port: int) -> dict[str, float]:
    """The coordinator's upstream TLS handshakes so far, by session (new, resumed)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {match[1]: float(match[2]) for match in
            re.finditer(r'^coordinator_relay_tls_handshakes_total\{[^}]*session="(\w+)"[^}]*\} (\S+)$', text, re.M)}


async def main(args: argparse.Namespace) -> None:
    data_dir = Path(tempfile.mkdtemp(prefix="bench-sasl-"))
    secure = secure_listeners_in(data_dir)
    broker = EmbeddedKafka(data_dir / "kafka", secure=secure)
    await broker.start()
    coordinator = None
    try:
        admin_properties = write_client_properties(secure)["SASL_SSL"]
        alice = data_dir / "alice.properties"
        alice.write_text(f"security.protocol=SASL_SSL\nsasl.mechanism=SCRAM-SHA-256\nsasl.username=alice\n"
                         f"sasl.password={secure.users['alice']}\nssl.ca.location={secure.certificates.ca}\n")
        security = dataclasses.replace(ClusterSecurity.of(load_command_config(alice)), tls_sessions=None)
        metrics_port = _free_port()
        coordinator = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "coordinator.cli", "serve", "--listen", "SASL_SSL://127.0.0.1:0",
            "--bootstrap-server", broker.sasl_ssl_bootstrap, "--command-config", str(admin_properties),
            "--config", "ssl.keystore.type=PEM", "--config", f"ssl.keystore.location={secure.certificates.broker_keystore}",
            "--config", "offsets.topic.num.partitions=1", "--state-topic", "bench-sasl-state", "--event-topic", "",
            "--metrics-listen", f"127.0.0.1:{metrics_port}",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL)
        assert coordinator.stdout is not None
        line = (await asyncio.wait_for(coordinator.stdout.readline(), 120)).decode()
        ours_port = int(line.split()[3].rsplit(":", 1)[1])
        broker_host, broker_port = broker.sasl_ssl_bootstrap.rsplit(":", 1)
        direct, through = [], []
        cpu_per_connection = []
        handshakes = {"new": 0.0, "resumed": 0.0}  # upstream, during the measured connections through us
        await _connections("127.0.0.1", ours_port, security, 20, args.concurrency)  # warm up both paths
        await _connections(broker_host, int(broker_port), security, 20, args.concurrency)
        for _ in range(args.repeats):
            direct.append(await _connections(broker_host, int(broker_port), security, args.connections,
                                             args.concurrency))
            counted = await asyncio.to_thread(_upstream_handshakes, metrics_port)
            before = _cpu_s(coordinator.pid)
            through.append(await _connections("127.0.0.1", ours_port, security, args.connections, args.concurrency))
            cpu_per_connection.append((_cpu_s(coordinator.pid) - before) / args.connections * 1e3)
            for session, total in (await asyncio.to_thread(_upstream_handshakes, metrics_port)).items():
                handshakes[session] = handshakes.get(session, 0.0) + total - counted.get(session, 0.0)
        # our half of the upstream handshake, alone: full handshakes against resumed ones, alternating
        tls_only = without_sasl(security)
        assert tls_only is not None
        full_cpu, resumed_cpu = [], []
        resuming = dataclasses.replace(tls_only, tls_sessions=TlsSessions())
        for _ in range(args.repeats):
            full_cpu.append(await _upstream_handshake_cpu_ms(broker_host, int(broker_port), tls_only,
                                                             args.connections // 2))
            resumed_cpu.append(await _upstream_handshake_cpu_ms(broker_host, int(broker_port), resuming,
                                                                args.connections // 2))
        assert resuming.tls_sessions is not None
        print(json.dumps({
            "benchmark": "sasl_connect", "mechanism": "SCRAM-SHA-256", "connections": args.connections,
            "concurrency": args.concurrency, "repeats": args.repeats,
            "broker_connections_per_s": round(max(direct), 1), "ours_connections_per_s": round(max(through), 1),
            "ratio_ours_to_broker": round(max(through) / max(direct), 3),
            "coordinator_cpu_ms_per_connection": round(min(cpu_per_connection), 2),
            "upstream_tls_handshakes": {session: int(count) for session, count in handshakes.items()},
            "upstream_link_cpu_ms_full_handshake": round(min(full_cpu), 3),
            "upstream_link_cpu_ms_resuming": round(min(resumed_cpu), 3),
            "upstream_link_resumed": f"{resuming.tls_sessions.resumed}/{resuming.tls_sessions.handshakes}",
            "load_average": os.getloadavg()[0],
        }), flush=True)
    finally:
        if coordinator is not None and coordinator.returncode is None:
            coordinator.kill()
            await coordinator.wait()
        await broker.stop()
        import shutil

        shutil.rmtree(data_dir, ignore_errors=True)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--connections", type=int, default=300)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    return parser.parse_args(argv)


if __name__ == "__main__":
    asyncio.run(main(parse_args()))
