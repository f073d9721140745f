"""Spans for the group requests that are not part of a rebalance's own story: LeaveGroup, OffsetCommit,
DescribeGroups and DeleteGroups. Each is a short server span of its own trace, linked to the group's current
(or latest) rebalance trace, so Jaeger leads from a commit or a leave to the rebalance it happened in.

Heartbeats are counted, never traced; JoinGroup and SyncGroup are the rebalance trace itself.
The runtime calls `RequestSpans` around those four requests when tracing is on (`GroupRuntime.request_spans`);
group logic stays unaware of telemetry.
"""

from __future__ import annotations

from typing import Any, Awaitable, Callable, Iterable

from opentelemetry.trace import Link, SpanKind, Status, StatusCode, Tracer

from coordinator.security.identity import identity_attributes
from coordinator.telemetry.tracing import GROUP, MEMBER_ID, SYSTEM, RebalanceTracer

_Handler = Callable[[Any], Awaitable[Any]]


class RequestSpans:
    """`GroupRuntime.request_spans`: each of the four requests in a span of its own, linked to its groups'
    rebalance traces."""

    def __init__(self, tracer: Tracer, rebalances: RebalanceTracer) -> None:
        self.tracer, self.rebalances = tracer, rebalances

    async def __call__(self, api: str, req: Any, serve: _Handler) -> Any:
        groups_of, error_of = _TRACED[api]
        groups = groups_of(req)
        links = [Link(context, {GROUP: group_id}) for group_id in groups
                 if (context := self.rebalances.current_context(group_id)) is not None]
        attributes: dict[str, Any] = {SYSTEM: "kafka", "rpc.method": api, **identity_attributes()}
        if len(groups) == 1:
            attributes[GROUP] = groups[0]
        members = [m.member_id for m in getattr(req, "members", ())] or [getattr(req, "member_id", "")]
        members = [m for m in members if m]
        if len(members) == 1:
            attributes[MEMBER_ID] = members[0]
        elif members:
            attributes["coordinator.member.ids"] = members
        with self.tracer.start_as_current_span(api, kind=SpanKind.SERVER, links=links, attributes=attributes,
                                               record_exception=True) as span:
            response = await serve(req)
            error = error_of(response)
            if error:
                span.set_attribute("coordinator.error", error)
                span.set_status(Status(StatusCode.ERROR, error))
            return response


def _one_group(req: Any) -> list[str]:
    return [req.group_id]


def _listed_groups(req: Any) -> list[str]:
    return list(req.groups)


def _named_groups(req: Any) -> list[str]:
    return list(req.groups_names)


def _first_error(codes: Iterable[Any]) -> str | None:
    return next((code.name for code in codes if code.name != "NONE"), None)


def _leave_error(response: Any) -> str | None:
    return _first_error([response.error_code, *(m.error_code for m in response.members)])


def _commit_error(response: Any) -> str | None:
    return _first_error(p.error_code for t in response.topics for p in t.partitions)


def _describe_error(response: Any) -> str | None:
    return _first_error(g.error_code for g in response.groups)


def _delete_error(response: Any) -> str | None:
    return _first_error(r.error_code for r in response.results)


# API -> (the groups a request names, the first error its answer carries)
_TRACED: dict[str, tuple[Callable[[Any], list[str]], Callable[[Any], str | None]]] = {
    "LeaveGroup": (_one_group, _leave_error),
    "OffsetCommit": (_one_group, _commit_error),
    "DescribeGroups": (_listed_groups, _describe_error),
    "DeleteGroups": (_named_groups, _delete_error),
}
