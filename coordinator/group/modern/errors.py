"""An error a consumer group request is answered with: Kafka's code and its message."""

from __future__ import annotations

from protocol.error_codes import Errors


class ApiError(Exception):
    def __init__(self, error: Errors, message: str | None = None) -> None:
        super().__init__(message or error.name)
        self.error = error
        self.message = message
