"""Sans-IO framing: frames come out whole however the bytes are split, bad size prefixes fail before any
allocation, and big frames do not leave a big buffer behind."""

from __future__ import annotations

import struct
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.errors import InvalidFrameSize
from protocol.framing import FrameReader, encode_frame


def _drain(reader: FrameReader) -> list[bytes]:
    frames = []
    while (frame := reader.next_frame()) is not None:
        frames.append(frame)
    return frames


def test_one_byte_at_a_time_yields_each_frame_once_complete() -> None:
    payloads = [b"", b"a", b"hello world" * 10]
    stream = b"".join(encode_frame(p) for p in payloads)
    reader = FrameReader()
    received = []
    for i in range(len(stream)):
        reader.feed(stream[i : i + 1])
        received += _drain(reader)
    assert received == payloads
    assert reader.buffered_bytes == 0


@settings(max_examples=200, deadline=None)
@given(
    payloads=st.lists(st.binary(max_size=300), max_size=20),
    cuts=st.lists(st.integers(min_value=0, max_value=7000), max_size=30),
)
def test_any_split_through_the_lent_buffer_gives_the_same_frames(payloads: list[bytes], cuts: list[int]) -> None:
    reader = FrameReader()
    received = []
    for read, last_of_cut in _reads(reader, payloads, cuts):
        _lend(reader, read)
        if last_of_cut:
            received += _drain(reader)
    assert received == payloads


def test_a_two_gib_size_prefix_is_refused_before_allocating() -> None:
    reader = FrameReader(max_frame_bytes=104_857_600)
    reader.feed(struct.pack(">I", 2**31 - 1))
    with pytest.raises(InvalidFrameSize):
        reader.next_frame()
    assert len(reader.get_buffer()) < 1_000_000  # nothing sized after the bogus prefix


def test_negative_size_prefix_is_refused() -> None:
    reader = FrameReader()
    reader.feed(struct.pack(">i", -5) + b"xxxxx")
    with pytest.raises(InvalidFrameSize):
        reader.next_frame()


def test_frame_at_the_limit_passes_and_one_byte_more_fails() -> None:
    reader = FrameReader(max_frame_bytes=100)
    reader.feed(encode_frame(b"x" * 100))
    assert reader.next_frame() == b"x" * 100
    reader.feed(encode_frame(b"x" * 101))
    with pytest.raises(InvalidFrameSize):
        reader.next_frame()


def test_a_big_frame_gets_room_and_the_room_is_given_back() -> None:
    reader = FrameReader()
    payload = bytes(range(256)) * 4096  # 1 MiB
    stream = encode_frame(payload)
    offset = 0
    while offset < len(stream):
        buffer = reader.get_buffer()
        n = min(len(buffer), len(stream) - offset)
        buffer[:n] = stream[offset : offset + n]
        del buffer
        reader.buffer_updated(n)
        offset += n
    assert reader.next_frame() == payload
    assert len(reader.get_buffer()) < 1_000_000


def test_a_size_prefix_that_lies_within_the_limit_costs_room_only_for_bytes_that_arrive() -> None:
    reader = FrameReader()  # max 100 MiB
    reader.feed(struct.pack(">i", 100 * 2**20 - 1) + b"abcd")  # 8 bytes claiming 100 MiB
    assert reader.next_frame() is None
    for _ in range(8):  # the transport fills every buffer it is lent: room grows with what arrived, doubling
        buffer = reader.get_buffer()
        assert len(buffer) <= max(reader.buffered_bytes, 65_536)
        buffer[:] = b"z" * len(buffer)
        filled = len(buffer)
        del buffer
        reader.buffer_updated(filled)
    assert 8 * 2**20 < reader.buffered_bytes < 9 * 2**20 and reader.next_frame() is None


def test_partial_frame_is_held_until_complete() -> None:
    reader = FrameReader()
    frame = encode_frame(b"abcdef")
    reader.feed(frame[:7])
    assert reader.next_frame() is None
    assert reader.buffered_bytes == 7
    reader.feed(frame[7:])
    assert reader.next_frame() == b"abcdef"


# ---------------------------------------------------------------------------------------------- only_frame


def _reads(reader: FrameReader, payloads: list[bytes], cuts: list[int]) -> Iterator[tuple[bytes, bool]]:
    """The framed payloads' bytes as a transport lends them to `reader`: cut at `cuts`, each cut in reads of at
    most what the lent buffer holds (the caller lends each before the next is cut); with each, whether it is its
    cut's last."""
    stream = b"".join(encode_frame(p) for p in payloads)
    bounds = sorted({0, len(stream), *(c for c in cuts if c < len(stream))})
    for begin, end in zip(bounds, bounds[1:]):
        chunk = stream[begin:end]
        while chunk:
            n = min(len(reader.get_buffer()), len(chunk))
            yield chunk[:n], n == len(chunk)
            chunk = chunk[n:]


def _lend(reader: FrameReader, data: bytes) -> None:
    """`data` written into the lent buffer and reported, as a transport does."""
    buffer = reader.get_buffer()
    buffer[: len(data)] = data
    del buffer
    reader.buffer_updated(len(data))


def test_exactly_one_whole_frame_is_handed_out_and_leaves_nothing() -> None:
    reader = FrameReader()
    _lend(reader, encode_frame(b"heartbeat"))
    frame = reader.only_frame()
    assert frame == b"heartbeat" and type(frame) is bytes
    assert reader.buffered_bytes == 0 and reader.next_frame() is None and reader.only_frame() is None
    _lend(reader, encode_frame(b"next"))
    assert reader.only_frame() == b"next"  # and again on the next read


@pytest.mark.parametrize("stream", [encode_frame(b"one") + encode_frame(b"two"), encode_frame(b"partial")[:-1],
                                    encode_frame(b""), encode_frame(b"x")[:4]],
                         ids=["two-frames", "part-of-one", "empty-frame", "size-prefix-only"])
def test_anything_else_is_left_for_next_frame(stream: bytes) -> None:
    reader = FrameReader()
    _lend(reader, stream)
    assert reader.only_frame() is None
    assert reader.buffered_bytes == len(stream)
    expected = FrameReader()
    expected.feed(stream)
    assert _drain(reader) == _drain(expected)


def test_a_frame_completed_by_a_later_read_is_the_only_frame_then() -> None:
    reader = FrameReader()
    stream = encode_frame(b"split") + encode_frame(b"second")
    _lend(reader, stream[:3])
    assert reader.only_frame() is None
    _lend(reader, stream[3:9])
    assert reader.only_frame() == b"split"
    _lend(reader, stream[9:])
    assert reader.only_frame() == b"second" and reader.buffered_bytes == 0


@pytest.mark.parametrize("prefix", [struct.pack(">i", 11), struct.pack(">i", -1)], ids=["over-the-limit", "negative"])
def test_a_bad_size_prefix_is_never_handed_out_and_next_frame_refuses_it(prefix: bytes) -> None:
    reader = FrameReader(max_frame_bytes=10)
    _lend(reader, prefix + b"x" * 11)
    assert reader.only_frame() is None
    with pytest.raises(InvalidFrameSize):
        reader.next_frame()


def test_the_room_a_big_only_frame_needed_is_given_back() -> None:
    reader = FrameReader()
    payload = b"b" * 200_000
    stream = encode_frame(payload)
    while stream:
        n = min(len(reader.get_buffer()), len(stream))
        _lend(reader, stream[:n])
        stream = stream[n:]
    assert reader.only_frame() == payload
    assert len(reader.get_buffer()) <= 8_192


@settings(max_examples=200, deadline=None)
@given(
    payloads=st.lists(st.binary(max_size=300), max_size=20),
    cuts=st.lists(st.integers(min_value=0, max_value=7000), max_size=30),
)
def test_only_frame_then_next_frame_give_the_same_frames_for_any_split(payloads: list[bytes], cuts: list[int]) -> None:
    """What a connection does per read (only_frame, else next_frame for whatever is there) hands out every frame
    once, in order, however the bytes arrive."""
    reader = FrameReader()
    received = []
    for read, _ in _reads(reader, payloads, cuts):
        _lend(reader, read)
        frame = reader.only_frame()
        if frame is not None:
            received.append(frame)
        received += _drain(reader)
    assert received == payloads
