"""Simulated test consumers with failure injection (`coordinator simulate`).

Speaks the Kafka group protocol through `protocol/` only (never imports coordinator.group), so it drives any
Kafka-protocol group coordinator: ours, or a real Kafka broker's.
"""

from coordinator.loadgen.options import FAILURE_KINDS, ScheduledFailure, SimOptions
from coordinator.loadgen.simulation import Progress, Simulation

__all__ = ["FAILURE_KINDS", "Progress", "ScheduledFailure", "SimOptions", "Simulation"]
