"""Kafka's server-side SASL sequence on a connection whose exchange the broker judges: what is admitted before
authentication, when it is complete (by mechanism, from the broker's answers), v0 and unknown mechanisms."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coordinator.security.sasl_passthrough import Refusal, SaslPassthrough, State, weak_method
from protocol import apis, codec
from protocol.errors import ProtocolError
from protocol.codec import RequestHeader
import datetime

from protocol.messages import build, error

SCRAM_FIRST = b"n,,n=alice,r=abc"


def frame(api_key: int, version: int, correlation_id: int, **fields: object) -> bytes:
    """A request frame without its size prefix."""
    return codec.encode_request(correlation_id, "c", build(apis.request_class(api_key, version), **fields))[4:]


def answer(api_key: int, version: int, correlation_id: int, **fields: object) -> bytes:
    """A response frame with its size prefix, as a relayed one is handed over."""
    body = build(apis.response_class(api_key, version), **fields)
    return codec.encode_response(RequestHeader(api_key, version, correlation_id, None), body)


def handshake(sasl: SaslPassthrough, mechanism: str, correlation_id: int = 1) -> None:
    sasl.admit(frame(17, 1, correlation_id, mechanism=mechanism))
    sasl.observe(correlation_id, answer(17, 1, correlation_id, error_code=error(0), mechanisms=(mechanism,)))


def authenticate(sasl: SaslPassthrough, correlation_id: int, token: bytes, server_token: bytes,
                 error_code: int = 0) -> None:
    sasl.admit(frame(36, 2, correlation_id, auth_bytes=token))
    sasl.observe(correlation_id, answer(36, 2, correlation_id, error_code=error(error_code), error_message=None,
                                        auth_bytes=server_token, session_lifetime=datetime.timedelta(0)))


def group_request(correlation_id: int = 9) -> bytes:
    """A group request (a Heartbeat): served only once authenticated."""
    return frame(12, 4, correlation_id, group_id="g", generation_id=1, member_id="m", group_instance_id=None)


def test_api_versions_is_admitted_before_authentication_anything_else_closes() -> None:
    sasl = SaslPassthrough()
    sasl.admit(frame(18, 3, 1, client_software_name="x", client_software_version="1"))
    with pytest.raises(Refusal, match="before SASL authentication completed"):
        sasl.admit(group_request())


def test_scram_completes_only_with_the_server_final_message() -> None:
    sasl = SaslPassthrough()
    handshake(sasl, "SCRAM-SHA-256")
    authenticate(sasl, 2, SCRAM_FIRST, b"r=abcdef,s=c2FsdA==,i=4096")
    assert sasl.state is State.AUTHENTICATING and sasl.principal == "alice"
    with pytest.raises(Refusal):  # a group request between the two rounds: closed, as Kafka does
        sasl.admit(group_request())
    authenticate(sasl, 3, b"c=biws,r=abcdef,p=proof", b"v=signature")
    assert sasl.state is State.COMPLETE
    sasl.admit(group_request())


def test_a_failed_exchange_never_completes() -> None:
    sasl = SaslPassthrough()
    handshake(sasl, "PLAIN")
    authenticate(sasl, 2, b"\0alice\0wrong", b"", error_code=58)
    assert sasl.state is State.AUTHENTICATING
    with pytest.raises(Refusal):
        sasl.admit(group_request())


def test_plain_completes_after_one_round_and_the_password_is_not_kept() -> None:
    sasl = SaslPassthrough()
    handshake(sasl, "PLAIN")
    authenticate(sasl, 2, b"\0alice\0s3cret", b"")
    assert sasl.state is State.COMPLETE and sasl.principal == "alice"
    assert "s3cret" not in repr(sasl.__slots__) + str(sasl.principal)


def test_oauthbearer_completes_when_the_broker_sends_no_challenge() -> None:
    sasl = SaslPassthrough()
    handshake(sasl, "OAUTHBEARER")
    authenticate(sasl, 2, b"n,,\x01auth=Bearer x\x01\x01", b'{"status":"invalid_token"}')
    assert sasl.state is State.AUTHENTICATING
    authenticate(sasl, 3, b"\x01", b"")
    assert sasl.state is State.COMPLETE


def test_authenticate_before_handshake_and_handshake_v0_are_refused() -> None:
    with pytest.raises(Refusal, match="before SaslHandshake"):
        SaslPassthrough().admit(frame(36, 2, 1, auth_bytes=b"x"))
    with pytest.raises(Refusal, match="v0"):
        SaslPassthrough().admit(frame(17, 0, 1, mechanism="PLAIN"))


def test_a_mechanism_we_cannot_follow_gets_kafkas_answer() -> None:
    with pytest.raises(Refusal) as refused:
        SaslPassthrough().admit(frame(17, 1, 7, mechanism="GSSAPI"))
    assert refused.value.reply is not None
    _correlation, body = codec.decode_response(17, 1, refused.value.reply[4:])
    assert int(body.error_code) == 33 and "SCRAM-SHA-512" in body.mechanisms


@settings(max_examples=300, deadline=None)
@given(api_key=st.sampled_from([17, 36, 18, 12]), version=st.integers(0, 4), body=st.binary(max_size=64),
       stage=st.sampled_from(["initial", "handshaken", "complete"]))
def test_untrusted_sasl_frames_are_refused_or_admitted_never_crash(api_key: int, version: int, body: bytes,
                                                                   stage: str) -> None:
    """Whatever follows a request header: admitted, or a Refusal / an unreadable-request error that closes the
    connection (Connection._sasl_admits), nothing else."""
    sasl = SaslPassthrough()
    if stage != "initial":
        handshake(sasl, "SCRAM-SHA-256")
    if stage == "complete":
        authenticate(sasl, 2, SCRAM_FIRST, b"r=abcdef,s=c2FsdA==,i=4096")
        authenticate(sasl, 3, b"c=biws,r=abcdef,p=proof", b"v=signature")
    frame_bytes = struct.pack(">hhih", api_key, version, 5, 1) + b"c" + body
    try:
        sasl.admit(frame_bytes)
    except (Refusal, ProtocolError, ValueError, LookupError):
        pass


def test_a_mechanism_outside_sasl_enabled_mechanisms_is_refused_with_the_enabled_list() -> None:
    sasl = SaslPassthrough(enabled=("SCRAM-SHA-512",))
    with pytest.raises(Refusal) as refused:
        sasl.admit(frame(17, 1, 1, mechanism="PLAIN"))
    assert refused.value.reply is not None
    _correlation, body = codec.decode_response(17, 1, refused.value.reply[4:])
    assert int(body.error_code) == 33 and list(body.mechanisms) == ["SCRAM-SHA-512"]


def test_oauthbearer_principal_is_the_tokens_sub_claim_once_the_broker_accepted() -> None:
    import base64
    import json

    def part(value: dict[str, object]) -> str:
        return base64.urlsafe_b64encode(json.dumps(value).encode()).decode().rstrip("=")

    token = f"{part({'alg': 'none'})}.{part({'sub': 'carol', 'client_id': 'svc-7'})}."
    for claim, principal in (("sub", "carol"), ("client_id", "svc-7")):  # sasl.oauthbearer.sub.claim.name
        sasl = SaslPassthrough(claim=claim)
        handshake(sasl, "OAUTHBEARER")
        authenticate(sasl, 2, f"n,,\x01auth=Bearer {token}\x01\x01".encode(), b"")
        assert sasl.state is State.COMPLETE and sasl.principal == principal


def test_the_wake_is_held_weakly_for_a_python_and_for_a_compiled_method() -> None:
    """A compiled connection's method (mypyc) is a builtin bound method, which weakref.WeakMethod refuses: with it,
    every connection to a compiled server's SASL listener failed at accept. OrderedDict's `clear` is such a method."""
    import collections
    import gc

    class Python:
        def __init__(self) -> None:
            self.woken = 0

        def wake(self) -> None:
            self.woken += 1

    python, builtin = Python(), collections.OrderedDict(a=1)
    assert type(builtin.clear).__name__ == "builtin_function_or_method"
    for owner, method in ((python, python.wake), (builtin, builtin.clear)):
        held = weak_method(method)
        woken = held()
        assert woken is not None
        woken()
        del woken, method
        del owner
    assert python.woken == 1 and builtin == {}
    held_python, held_builtin = weak_method(python.wake), weak_method(builtin.clear)
    del python, builtin
    gc.collect()
    assert held_python() is None and held_builtin() is None
