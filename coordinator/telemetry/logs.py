"""Trace ids on rebalance log lines: a logging filter that appends `trace_id=<hex>` to the group logic's
`event=...` lines about a group whose rebalance is traced. Group logic knows nothing of tracing; its lines
carry `group=<id>` as their first field, which is how the filter finds the trace. The failure line
("Member X in group Y has failed, removing it from the group") is left exactly as Kafka writes it.
"""

from __future__ import annotations

import logging
from typing import Callable

# Lines written while the rebalance's trace exists. (A join or leave is logged just before the rebalance it
# causes begins, when the trace id at hand would still be the previous rebalance's: those lines get none.)
_TRACED_EVENTS = ("event=rebalance", "event=group_stabilized", "event=group_empty", "event=members_not",
                  "event=assignment", "event=no_member_rejoined", "event=join_complete")


class TraceIdFilter(logging.Filter):
    def __init__(self, trace_id_for: Callable[[str], str | None]) -> None:
        super().__init__()
        self.trace_id_for = trace_id_for

    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.msg
        if (isinstance(msg, str) and msg.startswith(_TRACED_EVENTS) and " group=%s" in msg
                and isinstance(record.args, tuple) and record.args):
            trace_id = self.trace_id_for(str(record.args[0]))
            if trace_id:
                record.msg = msg + " trace_id=%s"
                record.args = (*record.args, trace_id)
        return True


def install(trace_id_for: Callable[[str], str | None], logger_name: str = "coordinator.group") -> TraceIdFilter:
    log_filter = TraceIdFilter(trace_id_for)
    logging.getLogger(logger_name).addFilter(log_filter)
    return log_filter


def uninstall(log_filter: TraceIdFilter, logger_name: str = "coordinator.group") -> None:
    logging.getLogger(logger_name).removeFilter(log_filter)
