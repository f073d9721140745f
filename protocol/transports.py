"""asyncio transports and the reference cycle CPython 3.11 leaves in them."""

from __future__ import annotations


def _read_nothing() -> None:
    pass


def release_transport_cycle(transport: object) -> None:
    """Break the reference cycle CPython 3.11's selector transport keeps to itself, once its connection is lost.

    `_SelectorSocketTransport` stores a bound method of itself (`_read_ready_cb`), so every closed transport is
    cyclic garbage, freed only by the collector: never, if the service's collector policy
    (coordinator/runtime_health.py) froze it while its connection lived. Python 3.12 clears it on close (gh-100348); this does the same for 3.11 (the reader is already
    removed then, so nothing calls it). Call it from a protocol's connection_lost or after abort(); uvloop's
    transports have no such cycle and are left alone."""
    if getattr(transport, "_read_ready_cb", None) is not None:
        setattr(transport, "_read_ready_cb", _read_nothing)  # a private attribute of CPython's transport
