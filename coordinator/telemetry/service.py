"""Wiring telemetry into a running coordinator: the observers, the request spans, the metrics' readers of
coordinator state, and trace ids on log lines. Only what is on is installed: with tracing off no tracer
observer exists, so group logic calls nothing of it."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from coordinator.group.observer import ObserverMux
from coordinator.telemetry import logs
from coordinator.telemetry.consumer_tracing import ConsumerRebalanceTracer
from coordinator.telemetry.metrics import MetricsObserver
from coordinator.telemetry.otel import Telemetry
from coordinator.telemetry.requests import RequestSpans
from coordinator.telemetry.tracing import RebalanceTracer
from coordinator.telemetry.txn_tracing import TxnOffsetsTracer

INSTRUMENTATION_SCOPE = "coordinator"


@dataclass
class Instrumented:
    rebalances: RebalanceTracer | None = None
    consumer_rebalances: ConsumerRebalanceTracer | None = None
    metrics: MetricsObserver | None = None
    _log_filter: logs.TraceIdFilter | None = field(default=None, repr=False)

    @property
    def trace_id_for(self) -> Callable[[str], str | None] | None:
        """A group's rebalance trace: its consumer group's (epoch bumps) if it has one here, else its classic
        group's."""
        classic, consumer = self.rebalances, self.consumer_rebalances
        if classic is None or consumer is None:
            return None if classic is None else classic.trace_id_for
        return lambda group_id: consumer.trace_id_for(group_id) or classic.trace_id_for(group_id)

    def uninstall(self) -> None:
        if self._log_filter is not None:
            logs.uninstall(self._log_filter)
            self._log_filter = None


def instrument(telemetry: Telemetry, coordinator: Any, observer: ObserverMux, now_ns: Callable[[], int] = time.time_ns) -> Instrumented:
    """Install what `telemetry` has on: call before any other observer is added to `observer`, so the event
    topic's records of a rebalance already see its trace id."""
    done = Instrumented()
    if telemetry.tracer_provider is not None:
        tracer = telemetry.tracer_provider.get_tracer(INSTRUMENTATION_SCOPE)

        def member_lookup(group_id: str, member_id: str) -> Any:
            group = coordinator.groups.get(group_id)
            return None if group is None else group.members.get(member_id)

        done.rebalances = RebalanceTracer(tracer, now_ns, member_lookup)
        observer.add(done.rebalances)
        done.consumer_rebalances = ConsumerRebalanceTracer(tracer, now_ns)
        observer.add(done.consumer_rebalances)
        coordinator.request_spans = RequestSpans(tracer, done.rebalances)
        observer.add(TxnOffsetsTracer(tracer))
        trace_id_for = done.trace_id_for
        assert trace_id_for is not None
        done._log_filter = logs.install(trace_id_for)
    if telemetry.meter_provider is not None:
        done.metrics = MetricsObserver(telemetry.meter_provider.get_meter(INSTRUMENTATION_SCOPE))
        observer.add(done.metrics)
        done.metrics.watch_coordinator(coordinator)
    for line in telemetry.describe:
        logging.getLogger("coordinator.telemetry").info("event=telemetry %s", line)
    return done
