"""Hierarchical timing wheel timer (Kafka's purgatory timer), asyncio-native. See wheel.py for the theory."""
from coordinator.timer.clock import Clock, ManualClock, MonotonicClock, WallClock
from coordinator.timer.delay_queue import BucketQueue
from coordinator.timer.system_timer import SystemTimer
from coordinator.timer.task import PENDING_RUN, CallbackTask, TimerTask, TimerTaskEntry, TimerTaskList
from coordinator.timer.wheel import TimingWheel

__all__ = [
    "BucketQueue", "CallbackTask", "Clock", "ManualClock", "MonotonicClock", "PENDING_RUN", "SystemTimer",
    "TimerTask", "TimerTaskEntry", "TimerTaskList", "TimingWheel", "WallClock",
]
