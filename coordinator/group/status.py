"""Where a state partition stands on this instance, and the error a request for one of its groups gets (§3.0)."""
from __future__ import annotations

from enum import Enum

from protocol.error_codes import Errors


class ShardStatus(Enum):
    """Where a partition stands on this instance; requests for its groups are answered accordingly (§3.0)."""

    UNOWNED = "unowned"  # NOT_COORDINATOR: another instance (step 2) or nobody serves it
    LOADING = "loading"  # COORDINATOR_LOAD_IN_PROGRESS while its records are replayed
    ACTIVE = "active"
    STOPPED = "stopped"  # COORDINATOR_NOT_AVAILABLE: the service is shutting down


# The answer to a request for a group of a partition that is not ACTIVE here (classic and consumer groups alike).
STATUS_ERRORS = {
    ShardStatus.UNOWNED: Errors.NOT_COORDINATOR,
    ShardStatus.LOADING: Errors.COORDINATOR_LOAD_IN_PROGRESS,
    ShardStatus.STOPPED: Errors.COORDINATOR_NOT_AVAILABLE,
}
