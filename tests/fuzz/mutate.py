"""Mutations of corpus frames, as a hostile or broken client would send them.

Each mutation takes a corpus frame and a `random.Random` and returns the bytes to send (size prefix included,
so a mutation may lie about the size). Structure-aware mutations use the frame's sites (tests.fuzz.corpus):
a null where the schema forbids one, forged lengths, over-long varints, invalid booleans and struct markers,
strings that are not UTF-8; value mutations keep the request well-formed but give it odd values (boundary
integers, empty or long strings), so it reaches the handlers; the rest work on raw bytes: truncation, trailing
garbage, size-prefix lies, unknown API keys and versions, bit flips, overwrites and plain noise.
"""

from __future__ import annotations

import random
import struct
from collections.abc import Callable

from protocol.fastpath import unsigned_varint as varint
from tests.fuzz.corpus import BOOL, INT, LENGTH_KINDS, MARKER, STRING, TAG_COUNT, CorpusFrame, Site

Mutation = Callable[[CorpusFrame, random.Random], bytes]
_INT32_LIES = (0, 1, 2, 3, 127, 128, 255, 0x7FFF, 0x8000, 0xFFFF, 0x7FFFFFFF, -2, -3, -0x8000, -0x80000000)
_INT16_LIES = (0, 1, 2, 127, 255, 0x7FFF, -2, -3, -0x8000)
_VARINT_LIES = (1, 2, 3, 127, 128, 255, 16_383, 16_384, 0x7FFFFFFF, 0xFFFFFFFF, 0x7FFFFFFFF)


def framed(payload: bytes) -> bytes:
    return struct.pack(">i", len(payload)) + payload


def _replace(frame: CorpusFrame, site: Site, encoded: bytes) -> bytes:
    payload = frame.payload
    return framed(payload[: site.offset] + encoded + payload[site.offset + site.width :])


def _pick(frame: CorpusFrame, rng: random.Random, kinds: tuple[str, ...]) -> Site | None:
    sites = [site for site in frame.sites if site.kind in kinds]
    return rng.choice(sites) if sites else None


def _legacy_format(site: Site) -> str:
    return ">h" if site.kind == STRING else ">i"


# ---------------------------------------------------------------------------------------------- structural


def null_length(frame: CorpusFrame, rng: random.Random) -> bytes:
    """A well-formed null (-1, or compact 0) in place of an array/string/bytes, its content removed too, mostly
    where the schema forbids null; sometimes the content is left behind (then it reads as trailing bytes)."""
    site = _pick(frame, rng, LENGTH_KINDS)
    if site is None:
        return noise(frame, rng)
    forbidden = [s for s in frame.sites if s.kind in LENGTH_KINDS and not s.nullable]
    if forbidden and rng.random() < 0.8:
        site = rng.choice(forbidden)
    null = b"\x00" if site.compact else struct.pack(_legacy_format(site), -1)
    end = site.end if rng.random() < 0.9 else site.offset + site.width
    return framed(frame.payload[: site.offset] + null + frame.payload[end:])


def forged_length(frame: CorpusFrame, rng: random.Random) -> bytes:
    """An array/string/bytes length (or tag count) that lies: too long, too short, huge, negative."""
    site = _pick(frame, rng, (*LENGTH_KINDS, TAG_COUNT))
    if site is None:
        return noise(frame, rng)
    if site.compact:
        return _replace(frame, site, varint(rng.choice(_VARINT_LIES) if rng.random() < 0.7
                                            else rng.getrandbits(rng.choice((7, 14, 28, 32)))))
    lies = _INT16_LIES if site.kind == STRING else _INT32_LIES
    value = rng.choice(lies) if rng.random() < 0.7 else rng.randint(-(2 ** (8 * site.width - 1)),
                                                                     2 ** (8 * site.width - 1) - 1)
    return _replace(frame, site, struct.pack(_legacy_format(site), value))


def overlong_varint(frame: CorpusFrame, rng: random.Random) -> bytes:
    """A varint (compact length or tag count, header's included) that is over-long: more than five bytes, or a
    fifth byte with high bits set, or a padded encoding of the true value."""
    site = _pick(frame, rng, (*LENGTH_KINDS, TAG_COUNT))
    if site is None or not site.compact:
        site = _pick(frame, rng, (TAG_COUNT,))
    if site is None:
        return unknown_key_version(frame, rng)
    choice = rng.randrange(3)
    if choice == 0:
        encoded = b"\xff" * rng.randint(5, 12) + b"\x01"
    elif choice == 1:
        encoded = b"\x80" * 4 + bytes([rng.randint(0x10, 0x7F)])
    else:  # the true value padded with continuation bytes (legal up to five bytes in Kafka)
        value = frame.payload[site.offset] & 0x7F
        encoded = bytes([value | 0x80]) + b"\x80" * rng.randint(0, 5) + b"\x00"
    return _replace(frame, site, encoded)


def invalid_bool(frame: CorpusFrame, rng: random.Random) -> bytes:
    site = _pick(frame, rng, (BOOL,)) or _pick(frame, rng, (MARKER,))
    if site is None:
        return null_length(frame, rng)
    return _replace(frame, site, bytes([rng.randint(2, 255)]))


def bad_marker(frame: CorpusFrame, rng: random.Random) -> bytes:
    site = _pick(frame, rng, (MARKER,))
    if site is None:
        return invalid_bool(frame, rng)
    return _replace(frame, site, bytes([rng.choice((0, 2, 0x7F, 0x80, 0xFE))]))


def invalid_utf8(frame: CorpusFrame, rng: random.Random) -> bytes:
    """A string's content bytes replaced by bytes that are not UTF-8 (the header's client_id included)."""
    sites = [s for s in frame.sites if s.kind == STRING and frame.payload[s.offset : s.offset + s.width] not in
             (b"\x00", b"\xff\xff")]
    if not sites:
        return noise(frame, rng)
    site = rng.choice(sites)
    start = site.offset + site.width
    payload = bytearray(frame.payload)
    payload[start] = rng.choice((0xC0, 0xFF, 0x80, 0xED))
    return framed(bytes(payload))


def unknown_tags(frame: CorpusFrame, rng: random.Random) -> bytes:
    """A tag section claiming tags: some well-formed (to be skipped), some whose length lies."""
    site = _pick(frame, rng, (TAG_COUNT,))
    if site is None:
        return forged_length(frame, rng)
    count = rng.randint(1, 3)
    section = varint(count)
    for _ in range(count):
        data = rng.randbytes(rng.randint(0, 4))
        length = len(data) if rng.random() < 0.5 else rng.choice((len(data) + 1, 200, 0xFFFFFFF))
        section += varint(rng.choice((0, 1, 2, 99, 0x7FFFFFFF))) + varint(length) + data
    return _replace(frame, site, section)


# ---------------------------------------------------------------------------------------------- values
# Well-formed requests with values a handler must cope with: these decode cleanly and reach the group logic.


def boundary_ints(frame: CorpusFrame, rng: random.Random) -> bytes:
    """One to three integer fields (durations, generations, partitions, epochs) set to 0, -1, -2 or the extremes."""
    sites = [s for s in frame.sites if s.kind == INT]
    if not sites:
        return empty_string(frame, rng)
    payload = bytearray(frame.payload)
    for site in rng.sample(sites, min(len(sites), rng.randint(1, 3))):
        bits = 8 * site.width
        value = rng.choice((0, -1, -2, 1, 2 ** (bits - 1) - 1, -(2 ** (bits - 1)), rng.getrandbits(bits - 1)))
        payload[site.offset : site.end] = value.to_bytes(site.width, "big", signed=True)
    return framed(bytes(payload))


def empty_string(frame: CorpusFrame, rng: random.Random) -> bytes:
    """A string (group id, member id, topic, protocol name ...) made empty, or long, but well-formed."""
    sites = [s for s in frame.sites[1:] if s.kind == STRING and s.end > s.offset + s.width]
    if not sites:
        return boundary_ints(frame, rng) if any(s.kind == INT for s in frame.sites) else truncate(frame, rng)
    site = rng.choice(sites)
    content = b"" if rng.random() < 0.6 else "é".encode() * rng.randint(100, 2_000)
    length = varint(len(content) + 1) if site.compact else struct.pack(">h", len(content))
    return framed(frame.payload[: site.offset] + length + content + frame.payload[site.end :])


# ---------------------------------------------------------------------------------------------- raw bytes


def truncate(frame: CorpusFrame, rng: random.Random) -> bytes:
    return framed(frame.payload[: rng.randrange(len(frame.payload))])


def trailing_garbage(frame: CorpusFrame, rng: random.Random) -> bytes:
    return framed(frame.payload + rng.randbytes(rng.randint(1, 32)))


def size_prefix_lie(frame: CorpusFrame, rng: random.Random) -> bytes:
    """A frame size that is not the frame's: a little off, zero, negative, past the 100 MiB limit, or a big size
    within the limit (which must not make the server reserve that much before the bytes arrive)."""
    size = len(frame.payload)
    lie = rng.choice((size - 1, size - rng.randint(2, size), size + 1, size + rng.randint(2, 64), 0, -1,
                      -rng.randint(2, 2**31), 2**31 - 1, 100 * 2**20 + 1, rng.randint(2**16, 2**20),
                      rng.randint(2**20, 2**25), rng.randint(2**25, 100 * 2**20)))
    return struct.pack(">i", lie) + frame.payload


def unknown_key_version(frame: CorpusFrame, rng: random.Random) -> bytes:
    api_key, version = struct.unpack_from(">hh", frame.payload)
    choice = rng.randrange(3)
    if choice != 1:
        api_key = rng.choice((-1, 7, 99, 0x7FFF, rng.randint(-0x8000, 0x7FFF)))
    if choice != 0:
        version = rng.choice((-1, version + 1, version + 50, 0x7FFF, rng.randint(-0x8000, 0x7FFF)))
    return framed(struct.pack(">hh", api_key, version) + frame.payload[4:])


def bit_flips(frame: CorpusFrame, rng: random.Random) -> bytes:
    payload = bytearray(frame.payload)
    for _ in range(rng.randint(1, 8)):
        payload[rng.randrange(len(payload))] ^= 1 << rng.randrange(8)
    return framed(bytes(payload))


def overwrite(frame: CorpusFrame, rng: random.Random) -> bytes:
    payload = bytearray(frame.payload)
    start = rng.randrange(len(payload))
    chunk = rng.choice((b"\xff", b"\x00", b"\x7f", b"\x80")) * rng.randint(1, 8) if rng.random() < 0.5 \
        else rng.randbytes(rng.randint(1, 8))
    payload[start : start + len(chunk)] = chunk
    return framed(bytes(payload))


def noise(frame: CorpusFrame, rng: random.Random) -> bytes:
    """Random bytes behind the frame's own header, or no header at all."""
    garbage = rng.randbytes(rng.randint(0, 96))
    if rng.random() < 0.5:
        header_end = frame.sites[0].offset + frame.sites[0].width  # after client_id's length: keep the header
        return framed(frame.payload[:header_end] + garbage)
    return framed(garbage)


MUTATIONS: dict[str, Mutation] = {
    "null_length": null_length,
    "forged_length": forged_length,
    "overlong_varint": overlong_varint,
    "invalid_bool": invalid_bool,
    "bad_marker": bad_marker,
    "invalid_utf8": invalid_utf8,
    "unknown_tags": unknown_tags,
    "boundary_ints": boundary_ints,
    "empty_string": empty_string,
    "truncate": truncate,
    "trailing_garbage": trailing_garbage,
    "size_prefix_lie": size_prefix_lie,
    "unknown_key_version": unknown_key_version,
    "bit_flips": bit_flips,
    "overwrite": overwrite,
    "noise": noise,
}


VALUE_MUTATIONS: dict[str, Mutation] = {name: MUTATIONS[name] for name in ("boundary_ints", "empty_string")}


def mutate(frame: CorpusFrame, rng: random.Random, mutations: dict[str, Mutation] = MUTATIONS) -> tuple[str, bytes]:
    name = rng.choice(tuple(mutations))
    return name, mutations[name](frame, rng)

