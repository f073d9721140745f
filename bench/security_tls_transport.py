"""Where TLS's per-request cost can go: the same frame-answering server over plaintext, over the event loop's TLS
transport (what our listeners use: uvloop's or asyncio's SSLProtocol over a memory BIO), and over a socket-owned
TLS connection (an `ssl.SSLSocket` driven by the loop's reader callbacks: one `recv_into` decrypts straight from
the socket, one `send` encrypts straight into it, no memory BIO and no protocol layer in between), and over our
listeners' own TLS layer (`tls-ours`: coordinator/security/tls_transport.py over the loop's TCP transport).

  python -m bench.security_tls_transport [--connections 1,100] [--seconds 3] [--repeats 3] [--loop uvloop]
  python -m bench.security_tls_transport --floor [--repeats 3]
  python -m bench.security_tls_transport --connects 400 [--repeats 3]

Each server runs in its own process; it answers every length-prefixed frame with a fixed 12-byte frame (a
Heartbeat v4 response's size) after the request's ~40 bytes (a Heartbeat v4 request's). The load generator (this
process) keeps one request in flight per connection, TLS 1.3 with an EC P-256 test certificate made for the run.
Reported per server: requests/s and the server's CPU per request (/proc), and each TLS server's CPU ratio to
plaintext. Loopback only, bounded in time; a shared machine: quote the load average with the figures.
`--floor`: no servers; OpenSSL's and `_ssl`'s own CPU per heartbeat record on the server's side (a request read,
an answer written, memory BIOs only), the least any TLS transport from Python can cost (record_floor).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import ssl
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REQUEST = (36).to_bytes(4, "big") + b"\x00\x0c\x00\x04" + b"\x00" * 32  # a 40-byte frame, Heartbeat v4's size
RESPONSE = (12).to_bytes(4, "big") + b"\x00" * 12
_FRAME = 40
MODES = ("plaintext", "tls-loop", "tls-ours", "tls-socket")


# ------------------------------------------------------------------------------------------------ servers


class FrameAnswering(asyncio.BufferedProtocol):
    """The loop's transport (plain or its TLS layer), read into our buffer as our Connection reads: every whole
    frame answered with RESPONSE, one write per read."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        self.buffer = bytearray(65_536)
        self.pending = 0

    def get_buffer(self, sizehint: int) -> bytearray:
        return self.buffer

    def buffer_updated(self, nbytes: int) -> None:
        self.pending += nbytes
        frames, self.pending = divmod(self.pending, _FRAME)
        if frames:
            self.transport.write(RESPONSE * frames)  # type: ignore[attr-defined]


class SocketTls:
    """One TLS connection owned by its socket: handshake, then read and answer from the loop's reader callback."""

    def __init__(self, loop: asyncio.AbstractEventLoop, sock: socket.socket, context: ssl.SSLContext) -> None:
        sock.setblocking(False)
        self.loop = loop
        self.tls = context.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
        self.fd = self.tls.fileno()
        self.buffer = bytearray(65_536)
        self.view = memoryview(self.buffer)
        self.pending = 0
        self.unsent = b""
        loop.add_reader(self.fd, self._handshake)

    def _handshake(self) -> None:
        try:
            self.tls.do_handshake()
        except ssl.SSLWantReadError:
            return
        except ssl.SSLWantWriteError:
            self.loop.remove_reader(self.fd)
            self.loop.add_writer(self.fd, self._handshake_writable)
            return
        except (ssl.SSLError, OSError):
            self.close()
            return
        self.loop.remove_reader(self.fd)
        self.loop.add_reader(self.fd, self._read)

    def _handshake_writable(self) -> None:
        self.loop.remove_writer(self.fd)
        self.loop.add_reader(self.fd, self._handshake)
        self._handshake()

    def _read(self) -> None:
        frames = 0
        while True:  # every record the socket holds (an SSL object may hold decrypted bytes the kernel no longer has)
            try:
                count = self.tls.recv_into(self.view, len(self.buffer))
            except ssl.SSLWantReadError:
                break
            except (ssl.SSLError, OSError):
                self.close()
                return
            if count == 0:
                self.close()
                return
            self.pending += count
            done, self.pending = divmod(self.pending, _FRAME)
            frames += done
        if frames:
            self._send(RESPONSE * frames)

    def _send(self, data: bytes) -> None:
        if self.unsent:
            self.unsent += data
            return
        try:
            sent = self.tls.send(data)
        except (ssl.SSLWantWriteError, BlockingIOError):
            sent = 0
        except (ssl.SSLError, OSError):
            self.close()
            return
        if sent < len(data):
            self.unsent = data[sent:]
            self.loop.add_writer(self.fd, self._writable)

    def _writable(self) -> None:
        data, self.unsent = self.unsent, b""
        self.loop.remove_writer(self.fd)
        self._send(data)

    def close(self) -> None:
        self.loop.remove_reader(self.fd)
        self.loop.remove_writer(self.fd)
        self.tls.close()


async def serve(mode: str, certificate: str | None) -> None:
    loop = asyncio.get_running_loop()
    context = None
    if mode != "plaintext":
        assert certificate is not None
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(certificate)
    if mode == "tls-ours":  # our listeners' TLS layer (coordinator/security/tls_transport.py) over the loop's TCP
        from coordinator.security.tls_transport import TlsServerConnection

        assert context is not None
        tls_context = context
        server = await loop.create_server(lambda: TlsServerConnection(tls_context, FrameAnswering), "127.0.0.1", 0,
                                          backlog=4096)
        port = server.sockets[0].getsockname()[1]
    elif mode == "tls-socket":
        listening = socket.create_server(("127.0.0.1", 0), backlog=4096)
        listening.setblocking(False)
        assert context is not None

        def accept() -> None:
            while True:
                try:
                    sock, _address = listening.accept()
                except BlockingIOError:
                    return
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                SocketTls(loop, sock, context)

        loop.add_reader(listening.fileno(), accept)
        port = listening.getsockname()[1]
    else:
        server = await loop.create_server(FrameAnswering, "127.0.0.1", 0, ssl=context, backlog=4096)
        port = server.sockets[0].getsockname()[1]
    print(port, flush=True)
    await asyncio.Event().wait()


# ------------------------------------------------------------------------------------------------ floor


def record_floor(certificate: str, ca: str, records: int) -> dict[str, float]:
    """What OpenSSL and `_ssl` alone cost a server per heartbeat, no transport and no socket: `records` Heartbeat-
    sized requests encrypted beforehand by a client (memory BIOs), then timed on the server's side only: each fed
    to its incoming BIO and read (SSL_read), and each answer written (SSL_write) and taken from the outgoing BIO."""
    server_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_context.load_cert_chain(certificate)
    client_context = ssl.create_default_context(cafile=ca)
    client_in, client_out, server_in, server_out = (ssl.MemoryBIO() for _ in range(4))
    client = client_context.wrap_bio(client_in, client_out, server_hostname="localhost")
    server = server_context.wrap_bio(server_in, server_out, server_side=True)
    for _ in range(10):  # the handshake, both sides in turn
        for side in (client, server):
            try:
                side.do_handshake()
            except ssl.SSLWantReadError:
                pass
        server_in.write(client_out.read())
        client_in.write(server_out.read())
    wire = []
    for _ in range(records):
        client.write(REQUEST)
        wire.append(client_out.read())
    buffer = bytearray(65_536)
    read, write, incoming, outgoing = server._sslobj.read, server._sslobj.write, server_in.write, server_out.read  # type: ignore[attr-defined]
    started = time.process_time()
    for record in wire:
        incoming(record)
        read(65_536, buffer)
    read_s = time.process_time() - started
    started = time.process_time()
    for _ in range(records):
        write(RESPONSE)
        outgoing()
    write_s = time.process_time() - started
    started = time.process_time()
    for record in wire:  # the same calls' Python overhead with no TLS: a copy in and a copy out
        buffer[:len(record)] = record
        bytes(RESPONSE)
    copy_s = time.process_time() - started
    return {"read_us_per_record": round(read_s / records * 1e6, 2),
            "write_us_per_record": round(write_s / records * 1e6, 2),
            "copies_us_per_record": round(copy_s / records * 1e6, 2)}


# ------------------------------------------------------------------------------------------------ load


def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def load(port: int, connections: int, seconds: float, warmup: float, ca: str | None,
               server_pid: int) -> tuple[int, float, float]:
    """(responses counted in the measured window, its length in s, the server's CPU s in it): closed loop, one
    request in flight per connection; the handshakes and a warm-up come before the window."""
    context = ssl.create_default_context(cafile=ca) if ca else None
    streams = [await asyncio.open_connection("127.0.0.1", port, ssl=context,
                                             server_hostname="localhost" if ca else None)
               for _ in range(connections)]
    counting = False
    counted = 0
    stop = False

    async def member(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal counted
        while not stop:
            writer.write(REQUEST)
            await reader.readexactly(len(RESPONSE))
            if counting:
                counted += 1

    tasks = [asyncio.create_task(member(r, w)) for r, w in streams]
    await asyncio.sleep(warmup)
    cpu_before = _cpu_s(server_pid)
    counting, started = True, time.perf_counter()
    await asyncio.sleep(seconds)
    counting, window = False, time.perf_counter() - started
    cpu = _cpu_s(server_pid) - cpu_before
    stop = True
    await asyncio.wait(tasks, timeout=10)
    for _reader, writer in streams:
        writer.close()
    return counted, window, cpu


async def connect_cost(mode: str, count: int, certificates: Path, loop_name: str) -> float:
    """The server's CPU ms per connection: TCP, TLS handshake, one request answered, close; 8 at a time."""
    process = subprocess.Popen([sys.executable, "-m", "bench.security_tls_transport", "--serve", mode,
                                "--certificate", str(certificates / "broker.pem"), "--loop", loop_name],
                               stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        port = int(process.stdout.readline())
        context = ssl.create_default_context(cafile=str(certificates / "ca.pem"))

        async def one() -> None:
            reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context, server_hostname="localhost")
            writer.write(REQUEST)
            await reader.readexactly(len(RESPONSE))
            writer.close()
            await writer.wait_closed()

        await one()  # warm
        cpu_before = _cpu_s(process.pid)
        for _ in range(count // 8):
            await asyncio.wait_for(asyncio.gather(*(one() for _ in range(8))), 30)
        return (_cpu_s(process.pid) - cpu_before) / (count // 8 * 8) * 1e3
    finally:
        process.kill()
        process.wait(10)


async def measure(mode: str, connections: int, args: argparse.Namespace, certificates: Path) -> dict[str, float]:
    keystore = str(certificates / "broker.pem")
    process = subprocess.Popen([sys.executable, "-m", "bench.security_tls_transport", "--serve", mode,
                                "--certificate", keystore, "--loop", args.loop], stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        port = int(process.stdout.readline())
        ca = str(certificates / "ca.pem") if mode != "plaintext" else None
        counted, window, cpu = await load(port, connections, args.seconds, args.warmup, ca, process.pid)
        return {"requests_per_s": round(counted / window),
                "server_cpu_us_per_request": round(cpu / max(counted, 1) * 1e6, 1)}
    finally:
        process.kill()
        process.wait(10)


async def main(args: argparse.Namespace) -> None:
    from coordinator.embedded.certificates import make_test_certificates

    with tempfile.TemporaryDirectory(prefix="bench-tls-") as directory:
        certificates = Path(directory)
        make_test_certificates(certificates, hosts=("localhost", "127.0.0.1"), clients=())
        if args.connects:
            costs: dict[str, list[float]] = {"tls-loop": [], "tls-ours": []}
            for _ in range(args.repeats):  # alternating
                for mode in costs:
                    costs[mode].append(await connect_cost(mode, args.connects, certificates, args.loop))
            print(json.dumps({"benchmark": "security_tls_transport", "connects": args.connects,
                              "server_cpu_ms_per_connection_best": {m: round(min(c), 3) for m, c in costs.items()},
                              "all": {m: [round(x, 3) for x in c] for m, c in costs.items()},
                              "load_average": os.getloadavg()[0]}), flush=True)
            return
        if args.floor:
            for _ in range(args.repeats):
                print(json.dumps({"benchmark": "security_tls_transport", "floor": record_floor(
                    str(certificates / "broker.pem"), str(certificates / "ca.pem"), 100_000),
                    "load_average": os.getloadavg()[0]}), flush=True)
            return
        for connections in (int(n) for n in args.connections.split(",")):
            runs: dict[str, list[dict[str, float]]] = {mode: [] for mode in MODES}
            for _ in range(args.repeats):  # alternating: the machine's load drifts the same for each
                for mode in MODES:
                    runs[mode].append(await measure(mode, connections, args, certificates))
            best = {mode: min(r["server_cpu_us_per_request"] for r in results) for mode, results in runs.items()}
            print(json.dumps({
                "benchmark": "security_tls_transport", "connections": connections, "loop": args.loop,
                "cpu_us_per_request_best": best,
                "cpu_ratio_to_plaintext": {m: round(best[m] / best["plaintext"], 2) for m in MODES[1:]},
                "requests_per_s_best": {m: max(r["requests_per_s"] for r in results) for m, results in runs.items()},
                "load_average": os.getloadavg()[0]}), flush=True)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--connections", default="1,100")
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--loop", choices=("asyncio", "uvloop"), default="uvloop")
    parser.add_argument("--connects", type=int, default=0,
                        help="only the server's CPU per TLS connection (handshake, one request, close), N connections "
                             "per run, the loop's TLS layer and ours alternating")
    parser.add_argument("--floor", action="store_true",
                        help="only OpenSSL's own cost per heartbeat record, server side, memory BIOs (no sockets)")
    parser.add_argument("--serve", choices=MODES, help=argparse.SUPPRESS)
    parser.add_argument("--certificate", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def _run(coro: object, loop: str) -> None:
    if loop == "uvloop":
        import uvloop

        uvloop.run(coro)  # type: ignore[arg-type]
    else:
        asyncio.run(coro)  # type: ignore[arg-type]


if __name__ == "__main__":
    arguments = parse_args()
    if arguments.serve:
        _run(serve(arguments.serve, arguments.certificate), arguments.loop)
    else:
        _run(main(arguments), arguments.loop)
