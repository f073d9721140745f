"""Delayed operations and the purgatory that watches them (Kafka's DelayedOperation/Purgatory)."""
from coordinator.purgatory.operation import CallbackOperation, DelayedOperation
from coordinator.purgatory.purgatory import DelayedOperationPurgatory

__all__ = ["CallbackOperation", "DelayedOperation", "DelayedOperationPurgatory"]
