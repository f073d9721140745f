"""How handlers are driven: inline first step, a Task only when a handler really waits (also after a bare
`sleep(0)`), and a handler that raises (our bug) closes only its own connection with an ERROR log line.
The coordinator is the real one with one entry point overridden per test (in a front, tests/support/service_front.py:
a compiled GroupRuntime cannot be subclassed here)."""

from __future__ import annotations

import asyncio
import logging

import pytest

from coordinator.group import api
from protocol.error_codes import Errors
from protocol.apis import ApiKey
from protocol.errors import ConnectionClosed
from tests.support.server import RunningServer
from tests.support.service_front import ServiceFront
from tests.support.wire import request


class YieldingCoordinator(ServiceFront):
    async def list_groups(self, req: api.ListGroupsRequest) -> api.ListGroupsResponse:
        await asyncio.sleep(0)  # a bare yield, not a future
        await asyncio.sleep(0.01)  # then a real wait
        return api.ListGroupsResponse(Errors.NONE, [api.ListedGroup("slow", "consumer", "Empty")])


class BrokenCoordinator(ServiceFront):
    async def list_groups(self, req: api.ListGroupsRequest) -> api.ListGroupsResponse:
        raise RuntimeError("a bug in the group layer")

    async def describe_groups(self, req: api.DescribeGroupsRequest) -> api.DescribeGroupsResponse:
        await asyncio.sleep(0.01)
        raise RuntimeError("a bug after parking")


async def test_a_handler_that_yields_bare_and_then_waits_is_answered_in_order() -> None:
    async with RunningServer(front=YieldingCoordinator) as env:
        client = await env.client()
        first = client.send(request(ApiKey.LIST_GROUPS, 5, states_filter=(), types_filter=()))
        second = client.send(request(ApiKey.API_VERSIONS, 3, client_software_name="t", client_software_version="1"))
        listed, versions = await asyncio.gather(first, second)
        assert [g.group_id for g in listed.groups] == ["slow"]
        assert versions.error_code == 0


@pytest.mark.parametrize("api_key", [ApiKey.LIST_GROUPS, ApiKey.DESCRIBE_GROUPS], ids=["at-once", "after-parking"])
async def test_a_failing_handler_closes_its_connection_with_an_error_line(api_key: int, caplog) -> None:
    caplog.set_level(logging.INFO, logger="coordinator.server")
    async with RunningServer(front=BrokenCoordinator) as env:
        bystander = await env.client()
        victim = await env.client()
        body = (request(ApiKey.LIST_GROUPS, 5, states_filter=(), types_filter=()) if api_key == ApiKey.LIST_GROUPS
                else request(ApiKey.DESCRIBE_GROUPS, 5, groups=("g",), include_authorized_operations=False))
        with pytest.raises(ConnectionClosed):
            await victim.request(body)
        errors = [r for r in caplog.records if r.levelno == logging.ERROR and "event=handler_failed" in r.getMessage()]
        assert len(errors) == 1 and errors[0].exc_info is not None
        assert "reason=handler_failed" in caplog.text
        versions = await bystander.request(request(ApiKey.API_VERSIONS, 0))
        assert versions.error_code == 0
