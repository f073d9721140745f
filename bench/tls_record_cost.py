"""Would a newer OpenSSL cut TLS's per-heartbeat cost? The server side of one Heartbeat v4 over TLS 1.3, memory BIOs,
no sockets, on two stacks side by side in one run:

  (a) `ssl`       Python's ssl.SSLObject (the system's OpenSSL, 3.0.19 here): what coordinator/security/
                  tls_transport.py calls (`_sslobj.read` into a buffer, `_sslobj.write`, the outgoing BIO's `read`);
  (b) `pyopenssl` pyOpenSSL's SSL.Connection over memory BIOs (`bio_write`, `recv_into`, `send`, `bio_read`),
                  driving the OpenSSL that the `cryptography` wheel bundles (4.0.3 here);
  (c) `cffi`      the same four OpenSSL 4 calls made straight through the cffi binding (no pyOpenSSL wrapper:
                  what OpenSSL 4's record path alone costs from Python, the floor any layer on it could reach).

  python -m bench.tls_record_cost [--connections 1,1000] [--requests 100000] [--repeats 5]

Per request, on the server: the client's 77-byte request record (99 bytes on the wire) is fed to the incoming BIO,
the plaintext read, a 16-byte answer written and the outgoing BIO's bytes taken. The requests are encrypted by each
connection's client beforehand (untimed); `--connections N` server objects are served round-robin (the cache effect
of many connections). CPU time (time.process_time) per request; the stacks alternate within each repeat. Needs
pyOpenSSL (`pip install pyOpenSSL`; not a project dependency). Last line: a JSON object with the best of the
repeats per stack, the ratios b/a and c/a, every repeat, the negotiated cipher suites, versions and load average.
"""

from __future__ import annotations

import argparse
import json
import os
import ssl
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

REQUEST = b"\x00\x00\x00\x49" + b"\x00\x0c\x00\x04" + b"\x00" * 69  # 77 bytes: a Heartbeat v4 request's size
RESPONSE = b"\x00\x00\x00\x0c" + b"\x00" * 12  # 16 bytes: its response's
STACKS = ("ssl", "pyopenssl", "cffi")


class Pair:
    """One TLS 1.3 server object and its client, handshaken over memory BIOs."""

    cipher: str

    def requests(self, count: int) -> list[bytes]:
        raise NotImplementedError

    def serve(self, records: list[bytes]) -> None:
        raise NotImplementedError


class StdlibPair(Pair):
    def __init__(self, server_context: ssl.SSLContext, client_context: ssl.SSLContext) -> None:
        self.client_in, self.client_out, self.server_in, self.server_out = (ssl.MemoryBIO() for _ in range(4))
        self.client = client_context.wrap_bio(self.client_in, self.client_out, server_hostname="localhost")
        self.server = server_context.wrap_bio(self.server_in, self.server_out, server_side=True)
        for _ in range(10):
            for side in (self.client, self.server):
                try:
                    side.do_handshake()
                except ssl.SSLWantReadError:
                    pass
            self.server_in.write(self.client_out.read())
            self.client_in.write(self.server_out.read())
        cipher = self.server.cipher()
        assert cipher is not None and self.server.version() == "TLSv1.3", cipher
        self.cipher = cipher[0]
        self.server_out.read()  # the session tickets
        self.buffer = bytearray(65_536)
        sslobj = self.server._sslobj  # type: ignore[attr-defined]
        self.read, self.write = sslobj.read, sslobj.write  # as tls_transport.py calls them

    def requests(self, count: int) -> list[bytes]:
        wire = []
        for _ in range(count):
            self.client.write(REQUEST)
            wire.append(self.client_out.read())
        return wire

    def serve(self, records: list[bytes]) -> None:
        incoming, read, write, outgoing, buffer = self.server_in.write, self.read, self.write, self.server_out.read, \
            self.buffer
        for record in records:
            incoming(record)
            if read(65_536, buffer) != 77:
                raise AssertionError("short read")
            write(RESPONSE)
            outgoing()


class PyOpenSSLPair(Pair):
    def __init__(self, server_context: Any, client_context: Any) -> None:
        from OpenSSL import SSL

        self.server = SSL.Connection(server_context, None)
        self.server.set_accept_state()
        self.client = SSL.Connection(client_context, None)
        self.client.set_connect_state()
        self.client.set_tlsext_host_name(b"localhost")
        for _ in range(10):
            for side in (self.client, self.server):
                try:
                    side.do_handshake()
                except SSL.WantReadError:
                    pass
            self._pump(self.client, self.server)
            self._pump(self.server, self.client)
        assert self.server.get_protocol_version_name() == "TLSv1.3"
        self.cipher = str(self.server.get_cipher_name())
        self._drain(self.server)
        self.buffer = bytearray(65_536)

    @staticmethod
    def _drain(connection: Any) -> bytes:
        from OpenSSL import SSL

        chunks = []
        while True:
            try:
                chunks.append(connection.bio_read(65_536))
            except SSL.WantReadError:
                return b"".join(chunks)

    def _pump(self, source: Any, sink: Any) -> None:
        data = self._drain(source)
        if data:
            sink.bio_write(data)

    def requests(self, count: int) -> list[bytes]:
        wire = []
        for _ in range(count):
            self.client.send(REQUEST)
            wire.append(self.client.bio_read(65_536))
        return wire

    def serve(self, records: list[bytes]) -> None:
        server, buffer = self.server, self.buffer
        incoming, read, write, outgoing = server.bio_write, server.recv_into, server.sendall, server.bio_read
        for record in records:
            incoming(record)
            if read(buffer, 65_536) != 77:
                raise AssertionError("short read")
            write(RESPONSE)
            outgoing(65_536)


class CffiPair(PyOpenSSLPair):
    """The pyOpenSSL pair's server served with OpenSSL's calls straight through the binding."""

    def __init__(self, server_context: Any, client_context: Any) -> None:
        super().__init__(server_context, client_context)
        from OpenSSL._util import ffi, lib

        self.ffi, self.lib = ffi, lib
        self.c_buffer = ffi.new("char[]", 65_536)
        self.out_buffer = ffi.new("char[]", 65_536)

    def serve(self, records: list[bytes]) -> None:
        lib, ssl_, into, out = self.lib, self.server._ssl, self.server._into_ssl, self.server._from_ssl
        bio_write, ssl_read, ssl_write, bio_read = lib.BIO_write, lib.SSL_read, lib.SSL_write, lib.BIO_read
        c_buffer, out_buffer, buffer, buffer_out = self.c_buffer, self.out_buffer, self.buffer, self.ffi.buffer
        for record in records:
            bio_write(into, record, len(record))
            n = ssl_read(ssl_, c_buffer, 65_536)
            if n != 77:
                raise AssertionError("short read")
            buffer[:n] = buffer_out(c_buffer, n)  # into the layer's buffer, as recv_into would
            ssl_write(ssl_, RESPONSE, 16)
            n = bio_read(out, out_buffer, 65_536)
            buffer_out(out_buffer, n)[:]  # the record as bytes, as the transport would take it


def make_pairs(stack: str, connections: int, certificates: Path) -> list[Pair]:
    pem, ca = str(certificates / "broker.pem"), str(certificates / "ca.pem")
    if stack == "ssl":
        server_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        server_context.minimum_version = ssl.TLSVersion.TLSv1_3
        server_context.load_cert_chain(pem)
        client_context = ssl.create_default_context(cafile=ca)
        return [StdlibPair(server_context, client_context) for _ in range(connections)]
    from OpenSSL import SSL

    server = SSL.Context(SSL.TLS_METHOD)
    server.set_min_proto_version(SSL.TLS1_3_VERSION)
    server.use_certificate_chain_file(pem)
    server.use_privatekey_file(pem)
    client = SSL.Context(SSL.TLS_METHOD)
    client.set_min_proto_version(SSL.TLS1_3_VERSION)
    client.load_verify_locations(ca)
    client.set_verify(SSL.VERIFY_PEER, lambda *_: True)
    cls: Callable[[Any, Any], Pair] = CffiPair if stack == "cffi" else PyOpenSSLPair
    return [cls(server, client) for _ in range(connections)]


def measure(pairs: list[Pair], requests: int) -> float:
    """CPU µs per request, `requests` served round-robin over the pairs, each pair's records in order."""
    per = max(1, requests // len(pairs))
    wires = [pair.requests(per) for pair in pairs]
    # round-robin: request i of every connection, then request i+1 of every connection, ...
    rounds = [[(pair, [wire[i]]) for pair, wire in zip(pairs, wires)] for i in range(per)]
    started = time.process_time()
    for one_round in rounds:
        for pair, record in one_round:
            pair.serve(record)
    return (time.process_time() - started) / (per * len(pairs)) * 1e6


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None,
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--connections", default="1,1000", help="comma-separated server-object counts")
    parser.add_argument("--requests", type=int, default=100_000, help="requests per measurement")
    parser.add_argument("--repeats", type=int, default=5, help="alternating repeats per size")
    parser.add_argument("--stacks", default=",".join(STACKS), help=f"comma-separated, of {STACKS}")
    args = parser.parse_args(argv)
    from coordinator.embedded.certificates import make_test_certificates
    from cryptography.hazmat.backends.openssl import backend

    stacks = [s for s in args.stacks.split(",") if s]
    load_before = os.getloadavg()
    results: dict[str, Any] = {}
    ciphers: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="bench-tls-record-") as directory:
        certificates = Path(directory)
        make_test_certificates(certificates, hosts=("localhost",), clients=())
        for connections in (int(n) for n in args.connections.split(",")):
            pairs = {stack: make_pairs(stack, connections, certificates) for stack in stacks}
            for stack in stacks:
                ciphers[stack] = pairs[stack][0].cipher
            runs: dict[str, list[float]] = {stack: [] for stack in stacks}
            for _ in range(args.repeats):
                for stack in stacks:
                    runs[stack].append(round(measure(pairs[stack], args.requests), 3))
            best = {stack: min(r) for stack, r in runs.items()}
            entry: dict[str, Any] = {"cpu_us_per_request_best": best, "all": runs,
                                     "load_average": round(os.getloadavg()[0], 2)}
            if "ssl" in best:
                entry["ratio_to_ssl_best"] = {s: round(best[s] / best["ssl"], 3) for s in stacks if s != "ssl"}
                entry["ratio_to_ssl_per_repeat"] = {
                    s: [round(x / y, 3) for x, y in zip(runs[s], runs["ssl"])] for s in stacks if s != "ssl"}
            print(json.dumps({"connections": connections, **entry}), file=sys.stderr, flush=True)
            results[str(connections)] = entry
            del pairs
    print(json.dumps({"benchmark": "tls_record_cost", "requests": args.requests, "repeats": args.repeats,
                      "ssl_openssl": ssl.OPENSSL_VERSION, "cryptography_openssl": backend.openssl_version_text(),
                      "ciphers": ciphers, "results": results,
                      "load_average_before_after": [round(load_before[0], 2), round(os.getloadavg()[0], 2)]}),
          flush=True)


if __name__ == "__main__":
    main()
