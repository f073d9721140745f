"""The relay's errors that other rooms catch (the server closes a client connection on them)."""


class UpstreamUnavailable(Exception):
    """No upstream broker answered."""
