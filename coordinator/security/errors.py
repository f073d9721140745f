"""The error every security setting is refused with, naming the setting (a client properties key, or a broker
property of our listeners)."""

from __future__ import annotations


class ClientConfigError(ValueError):
    """A setting that cannot be used; the message starts with the key."""

    def __init__(self, key: str, problem: str) -> None:
        super().__init__(f"{key}: {problem}")
        self.key = key
