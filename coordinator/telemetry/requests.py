"""Spans for the group requests that are not part of a rebalance's own story: LeaveGroup, OffsetCommit,
DescribeGroups and DeleteGroups. Each is a short server span of its own trace, linked to the group's current
(or latest) rebalance trace, so Jaeger leads from a commit or a leave to the rebalance it happened in.

Heartbeats are counted, never traced; JoinGroup and SyncGroup are the rebalance trace itself.
The coordinator's request methods are wrapped on the instance (group logic stays unaware of telemetry), and
only when tracing is on.
"""

from __future__ import annotations

from typing import Any, Awaitable, Callable, Iterable

from opentelemetry.trace import Link, SpanKind, Status, StatusCode, Tracer

from coordinator.security.identity import identity_attributes
from coordinator.telemetry.tracing import GROUP, MEMBER_ID, SYSTEM, RebalanceTracer

_Handler = Callable[[Any], Awaitable[Any]]


def trace_group_requests(coordinator: Any, tracer: Tracer, rebalances: RebalanceTracer) -> None:
    wrap = _Wrapper(tracer, rebalances)
    coordinator.leave_group = wrap("LeaveGroup", coordinator.leave_group, _one_group, _leave_error)
    coordinator.commit_offsets = wrap("OffsetCommit", coordinator.commit_offsets, _one_group, _commit_error)
    coordinator.describe_groups = wrap("DescribeGroups", coordinator.describe_groups, _listed_groups,
                                       _describe_error)
    coordinator.delete_groups = wrap("DeleteGroups", coordinator.delete_groups, _named_groups, _delete_error)


class _Wrapper:
    def __init__(self, tracer: Tracer, rebalances: RebalanceTracer) -> None:
        self.tracer, self.rebalances = tracer, rebalances

    def __call__(self, api: str, handler: _Handler, groups_of: Callable[[Any], list[str]],
                 error_of: Callable[[Any], str | None]) -> _Handler:
        tracer, rebalances = self.tracer, self.rebalances

        async def traced(req: Any) -> Any:
            groups = groups_of(req)
            links = [Link(context, {GROUP: group_id}) for group_id in groups
                     if (context := rebalances.current_context(group_id)) is not None]
            attributes: dict[str, Any] = {SYSTEM: "kafka", "rpc.method": api, **identity_attributes()}
            if len(groups) == 1:
                attributes[GROUP] = groups[0]
            members = [m.member_id for m in getattr(req, "members", ())] or [getattr(req, "member_id", "")]
            members = [m for m in members if m]
            if len(members) == 1:
                attributes[MEMBER_ID] = members[0]
            elif members:
                attributes["coordinator.member.ids"] = members
            with tracer.start_as_current_span(api, kind=SpanKind.SERVER, links=links, attributes=attributes,
                                              record_exception=True) as span:
                response = await handler(req)
                error = error_of(response)
                if error:
                    span.set_attribute("coordinator.error", error)
                    span.set_status(Status(StatusCode.ERROR, error))
                return response

        return traced


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
