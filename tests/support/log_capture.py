"""A logging handler that keeps every record it is given, for tests of what the service logs."""
from __future__ import annotations

import logging


class Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)
