"""An answer kio cannot read fails the one request it answers; the connection and the requests after it go on
(a shared upstream connection must not be lost to one odd answer)."""

from __future__ import annotations

import asyncio
import struct

import pytest
from kio.schema.api_versions.v0.request import ApiVersionsRequest
from kio.schema.api_versions.v0.response import ApiVersionsResponse
from kio.schema.errors import ErrorCode

from protocol import codec
from protocol.client import KafkaClient
from protocol.errors import ProtocolError


async def test_an_undecodable_answer_fails_only_its_request() -> None:
    answered = 0

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal answered
        while True:
            try:
                (size,) = struct.unpack(">i", await reader.readexactly(4))
            except asyncio.IncompleteReadError:
                return
            request = await reader.readexactly(size)
            correlation_id = struct.unpack_from(">i", request, 4)[0]
            if answered == 0:  # framed, right correlation id, a body cut short (no api_keys array length)
                writer.write(struct.pack(">iih", 6, correlation_id, 0))
            else:
                writer.write(codec.encode_response_frame(correlation_id, 0,
                                                         ApiVersionsResponse(error_code=ErrorCode.none, api_keys=())))
            answered += 1
            await writer.drain()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client = await KafkaClient.connect("127.0.0.1", port, negotiate=False, timeout_ms=5_000)
    try:
        first = client.send(ApiVersionsRequest())
        second = client.send(ApiVersionsRequest())
        with pytest.raises(ProtocolError, match="undecodable response"):
            await asyncio.wait_for(first, 5)
        assert (await asyncio.wait_for(second, 5)).error_code == ErrorCode.none
        assert not client.is_closed
    finally:
        await client.close()
        server.close()
        await server.wait_closed()
