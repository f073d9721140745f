"""Hand-packed encoders for hot fixed-shape responses.

kio's writer is pure Python and costs ~7 µs per response, the largest cost on the heartbeat path
(/work/shared/perf-notes.md); a struct pack costs ~0.15 µs. Tests compare every version byte for byte with kio.

HeartbeatResponse layouts (after the int32 size prefix and the int32 correlation id):
- v0:    error_code int16                                          (response header v0)
- v1–v3: throttle_time_ms int32, error_code int16                  (response header v0)
- v4:    0 (header tags), throttle_time_ms int32, error_code int16, 0 (body tags)   (flexible)
"""

from __future__ import annotations

import struct

_V0 = struct.Struct(">iih")
_V1_TO_V3 = struct.Struct(">iiih")
_V4 = struct.Struct(">iiBihB")


def pack_heartbeat_response(version: int, correlation_id: int, error_code: int, throttle_time_ms: int = 0) -> bytes:
    if version >= 4:
        return _V4.pack(_V4.size - 4, correlation_id, 0, throttle_time_ms, error_code, 0)
    if version >= 1:
        return _V1_TO_V3.pack(_V1_TO_V3.size - 4, correlation_id, throttle_time_ms, error_code)
    return _V0.pack(_V0.size - 4, correlation_id, error_code)
