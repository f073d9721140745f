"""Errors split by blame, as h11 does: a ProtocolError is the peer's fault (close its connection, log a line);
anything else escaping the protocol layer is our bug."""

from __future__ import annotations


class ProtocolError(Exception):
    """The peer sent bytes that are not a request we can serve; its connection must be closed."""


class InvalidFrameSize(ProtocolError):
    """A size prefix that is negative or larger than the configured maximum frame size."""


class UnknownApiKey(ProtocolError):
    pass


class UnsupportedVersion(ProtocolError):
    pass


class CorruptRequest(ProtocolError):
    """A known (API, version) whose header or body does not decode."""


class ConnectionClosed(Exception):
    """Raised to callers of the client when the connection closes with their request outstanding."""


class RequestTimedOut(Exception):
    """Raised to a client caller whose request got no response within its timeout."""
