"""Hostile variants of a valid frame for property tests of hand-written readers."""
from __future__ import annotations

from hypothesis import strategies as st


def hostile(frame: bytes, data: st.DataObject) -> bytes:
    """A truncation, a mutation of a few bytes, or a few bytes inserted (a grown length prefix) of a valid frame."""
    kind = data.draw(st.sampled_from(["truncate", "mutate", "insert"]))
    if kind == "truncate":
        return frame[:data.draw(st.integers(0, len(frame)))]
    mutated = bytearray(frame)
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, len(mutated) - 1))
        if kind == "mutate":
            mutated[at] = data.draw(st.sampled_from([0x00, 0x01, 0x7F, 0x80, 0xFF, data.draw(st.integers(0, 255))]))
        else:
            mutated[at:at] = data.draw(st.binary(min_size=1, max_size=5))
    return bytes(mutated)
