"""KIP-368 on our SASL listeners, on a manual clock: the session lifetime we give (min of connections.max.reauth.ms
and the broker's), re-authentication (where its exchange goes, Kafka's rules on mechanism, principal and
frequency) and what an expired session gets."""

from __future__ import annotations

import asyncio
import datetime
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coordinator.security.sasl_passthrough import HOLD, Refusal, SaslPassthrough, State
from coordinator.timer.clock import ManualClock
from protocol import apis, codec
from protocol.codec import RequestHeader
from protocol.errors import ProtocolError
from protocol.messages import build, error


def frame(api_key: int, version: int, correlation_id: int, **fields: object) -> bytes:
    return codec.encode_request(correlation_id, "c", build(apis.request_class(api_key, version), **fields))[4:]


def answer(api_key: int, version: int, correlation_id: int, **fields: object) -> bytes:
    body = build(apis.response_class(api_key, version), **fields)
    return codec.encode_response(RequestHeader(api_key, version, correlation_id, None), body)


class Session:
    """One connection's SaslPassthrough and the broker's side of its PLAIN exchanges."""

    def __init__(self, max_reauth_ms: int) -> None:
        self.clock = ManualClock()
        self.sasl = SaslPassthrough(max_reauth_ms=max_reauth_ms, now_ms=self.clock.now_ms)
        self.correlation_id = 0

    def next_id(self) -> int:
        self.correlation_id += 1
        return self.correlation_id

    def handshake(self, mechanism: str = "PLAIN") -> bytes | None:
        correlation_id = self.next_id()
        reply = self.sasl.admit(frame(17, 1, correlation_id, mechanism=mechanism))
        if reply is None:
            self.sasl.observe(correlation_id, answer(17, 1, correlation_id, error_code=error(0),
                                                     mechanisms=(mechanism,)))
        return reply

    def authenticate(self, user: str = "alice", broker_lifetime_ms: int = 0, version: int = 2) -> tuple[int, object]:
        """(error code, session lifetime ms or None for v0) of the answer the client gets."""
        correlation_id = self.next_id()
        assert self.sasl.admit(frame(36, version, correlation_id, auth_bytes=f"\0{user}\0secret".encode())) is None
        fields: dict[str, object] = {"error_code": error(0), "error_message": None, "auth_bytes": b""}
        if version >= 1:
            fields["session_lifetime"] = datetime.timedelta(milliseconds=broker_lifetime_ms)
        sent = answer(36, version, correlation_id, **fields)
        replaced = self.sasl.observe(correlation_id, sent)
        _correlation, body = codec.decode_response(36, version, (replaced or sent)[4:])
        lifetime = getattr(body, "session_lifetime", None)
        return int(body.error_code), None if lifetime is None else int(lifetime.total_seconds() * 1000)

    def request(self) -> None:
        """A group request (a Heartbeat)."""
        self.sasl.admit(frame(12, 4, self.next_id(), group_id="g", generation_id=1, member_id="m",
                              group_instance_id=None))


@pytest.mark.parametrize(("ours", "brokers", "given"), [(3_000, 0, 3_000), (0, 5_000, 5_000), (3_000, 5_000, 3_000),
                                                        (8_000, 5_000, 5_000), (0, 0, 0)])
def test_the_session_lifetime_is_the_smaller_of_ours_and_the_brokers(ours: int, brokers: int, given: int) -> None:
    session = Session(ours)
    session.handshake()
    assert session.authenticate(broker_lifetime_ms=brokers) == (0, given)
    assert session.sasl.state is State.COMPLETE
    assert session.sasl.expires_at_ms == (given or None)


def test_an_expired_session_gets_any_request_but_a_handshake_closed() -> None:
    session = Session(3_000)
    session.handshake()
    session.authenticate()
    session.clock.advance(3_000)
    session.request()  # at the expiry, not after it (Kafka: now - expiration > 0)
    session.clock.advance(1)
    with pytest.raises(Refusal) as refused:
        session.request()
    assert refused.value.kind == "sasl_session_expired" and refused.value.reply is None
    with pytest.raises(Refusal):  # ApiVersions too (SocketServer checks the expiry before any API)
        session.sasl.admit(frame(18, 3, 99, client_software_name="x", client_software_version="1"))


def test_a_handshake_after_expiry_re_authenticates_and_the_session_goes_on() -> None:
    session = Session(3_000)
    session.handshake()
    session.authenticate()
    session.clock.advance(10_000)
    assert session.handshake() is None
    assert session.sasl.state is State.AUTHENTICATING
    with pytest.raises(Refusal):  # nothing but SaslAuthenticate during the exchange
        session.request()


def test_re_authentication_keeps_the_connection_across_several_lifetimes() -> None:
    session = Session(3_000)
    session.handshake()
    session.authenticate()
    for _ in range(5):
        session.clock.advance(2_700)  # Java re-authenticates at 85-95% of the lifetime
        assert session.handshake() is None
        assert session.authenticate() == (0, 3_000)
        session.request()
    assert session.sasl.principal == "alice"


def test_without_a_session_expiry_a_second_handshake_is_answered_illegal_sasl_state() -> None:
    session = Session(0)
    session.handshake()
    session.authenticate()
    reply = session.handshake()
    assert reply is not None
    _correlation, body = codec.decode_response(17, 1, reply[4:])
    assert int(body.error_code) == 34
    session.request()  # the connection stays, as Kafka's KafkaApis answer leaves it


def test_at_most_one_re_authentication_a_second() -> None:
    session = Session(3_000)
    session.handshake()
    session.authenticate()
    session.clock.advance(1_500)
    assert session.handshake() is None
    assert session.authenticate() == (0, 3_000)
    session.clock.advance(999)
    reply = session.handshake()  # within a second of the previous start: processed as a plain request
    assert reply is not None and int(codec.decode_response(17, 1, reply[4:])[1].error_code) == 34
    session.clock.advance(1)
    assert session.handshake() is None


def test_the_exchange_goes_to_a_fresh_connection_only_when_the_links_session_does_not_expire() -> None:
    for broker_lifetime, fresh in ((0, True), (6_000, False)):
        session = Session(3_000)
        session.handshake()
        session.authenticate(broker_lifetime_ms=broker_lifetime)
        session.clock.advance(2_800)
        assert not session.sasl.on_fresh_link(17)
        session.handshake()
        assert session.sasl.on_fresh_link(36) is fresh
        assert not session.sasl.on_fresh_link(12)
        session.authenticate(broker_lifetime_ms=broker_lifetime)
        assert session.sasl.fresh_link_done is fresh  # the relay side closes that connection then
        assert not session.sasl.on_fresh_link(36)


def test_another_mechanism_on_re_authentication_is_answered_then_closed() -> None:
    session = Session(3_000)
    session.handshake("PLAIN")
    session.authenticate()
    session.clock.advance(2_800)
    reply = session.handshake("SCRAM-SHA-256")
    assert reply is not None and int(codec.decode_response(17, 1, reply[4:])[1].error_code) == 0
    with pytest.raises(Refusal, match="SASL mechanism 'SCRAM-SHA-256' requested by client is not supported for "
                                      "re-authentication of mechanism 'PLAIN'"):
        session.sasl.admit(frame(36, 2, 50, auth_bytes=b"n,,n=alice,r=x"))


def test_another_principal_on_re_authentication_fails_with_kafkas_message() -> None:
    session = Session(3_000)
    session.handshake()
    session.authenticate("alice")
    session.clock.advance(2_800)
    session.handshake()
    code, _lifetime = session.authenticate("bob")
    assert code == 58
    assert session.sasl.close_reason == "Cannot change principals during re-authentication from User.alice: User.bob"
    with pytest.raises(Refusal):
        session.request()


def test_a_v0_authenticate_gets_no_lifetime_but_its_session_still_expires() -> None:
    session = Session(3_000)
    session.handshake()
    assert session.authenticate(version=0) == (0, None)
    session.clock.advance(3_001)
    with pytest.raises(Refusal):
        session.request()


def failed_authenticate(session: Session, message: str) -> str:
    """The message the client gets when the broker refuses a PLAIN SaslAuthenticate with `message`."""
    correlation_id = session.next_id()
    session.sasl.admit(frame(36, 2, correlation_id, auth_bytes=b"\0alice\0old"))
    sent = answer(36, 2, correlation_id, error_code=error(58), error_message=message, auth_bytes=b"",
                  session_lifetime=datetime.timedelta(0))
    replaced = session.sasl.observe(correlation_id, sent)
    return str(codec.decode_response(36, 2, (replaced or sent)[4:])[1].error_message)


@pytest.mark.parametrize(("broker_lifetime", "said"), [
    (0, "Authentication failed during re-authentication due to invalid credentials with SASL mechanism PLAIN"),
    (6_000, "Authentication failed during authentication due to invalid credentials with SASL mechanism PLAIN")])
def test_refused_credentials_on_a_fresh_connection_get_kafkas_re_authentication_message(broker_lifetime: int,
                                                                                       said: str) -> None:
    """The fresh connection's broker saw a first authentication; the message the client gets is Kafka's for a
    re-authentication. Over the link the broker's own message passes unchanged."""
    session = Session(3_000)
    session.handshake()
    session.authenticate(broker_lifetime_ms=broker_lifetime)
    session.clock.advance(2_800)
    session.handshake()
    generic = "Authentication failed during authentication due to invalid credentials with SASL mechanism PLAIN"
    assert failed_authenticate(session, generic) == said


@settings(max_examples=300, deadline=None)
@given(api_key=st.sampled_from([17, 36, 18, 12]), version=st.integers(0, 4), body=st.binary(max_size=64),
       elapsed_ms=st.integers(0, 10_000))
def test_untrusted_frames_on_a_session_that_expires_are_refused_or_admitted_never_crash(
        api_key: int, version: int, body: bytes, elapsed_ms: int) -> None:
    session = Session(3_000)
    session.handshake()
    session.authenticate()
    session.clock.advance(elapsed_ms)
    try:
        session.sasl.admit(struct.pack(">hhih", api_key, version, 5, 1) + b"c" + body)
    except (Refusal, ProtocolError, ValueError, LookupError):
        pass


def test_a_delegation_token_exchange_is_refused_with_a_message_not_mistaken_for_its_owner() -> None:
    """SCRAM with tokenauth=true names the token, not its owner (the broker's principal): refused, with an answer,
    rather than authorizing the token's id."""
    sasl = SaslPassthrough()
    sasl.admit(frame(17, 1, 1, mechanism="SCRAM-SHA-256"))
    with pytest.raises(Refusal, match="delegation tokens") as refused:
        sasl.admit(frame(36, 2, 2, auth_bytes=b"n,,n=T0k3nId,r=abc,tokenauth=true"))
    assert refused.value.reply is not None
    assert int(codec.decode_response(36, 2, refused.value.reply[4:])[1].error_code) == 58
    sasl = SaslPassthrough()
    sasl.admit(frame(17, 1, 1, mechanism="SCRAM-SHA-256"))
    sasl.admit(frame(36, 2, 2, auth_bytes=b"n,,n=tokenauth=3Dtrue,r=abc"))  # a user's name is not an extension
    assert sasl.principal == "tokenauth=true"


class Wakeable:
    """What a connection is to its SaslPassthrough's owner lookup: something with a method to wake."""

    def __init__(self) -> None:
        self.woken = asyncio.Event()

    def wake(self) -> None:
        self.woken.set()


@pytest.mark.parametrize(("token_id", "principal", "error_code"), [("T1", "alice", 0), ("gone", None, 58)])
async def test_a_delegation_tokens_final_answer_waits_for_its_owner(token_id: str, principal: str | None,
                                                                    error_code: int) -> None:
    release = asyncio.Event()

    async def look_up(token: str) -> str | None:
        await release.wait()
        return {"T1": "alice"}.get(token)

    connection = Wakeable()
    sasl = SaslPassthrough(token_owner=look_up, wake=connection.wake)
    sasl.admit(frame(17, 1, 1, mechanism="SCRAM-SHA-256"))
    sasl.observe(1, answer(17, 1, 1, error_code=error(0), mechanisms=("SCRAM-SHA-256",)))
    sasl.admit(frame(36, 2, 2, auth_bytes=f"n,,n={token_id},r=abc,tokenauth=true".encode()))
    fields = {"error_code": error(0), "error_message": None, "session_lifetime": datetime.timedelta(0)}
    assert sasl.observe(2, answer(36, 2, 2, auth_bytes=b"r=abcdef,s=c2FsdA==,i=4096", **fields)) is None
    sasl.admit(frame(36, 2, 3, auth_bytes=b"c=biws,r=abcdef,p=proof"))
    final = answer(36, 2, 3, auth_bytes=b"v=signature", **fields)
    assert sasl.observe(3, final) is HOLD and sasl.state is State.AUTHENTICATING and sasl.principal is None
    release.set()
    await asyncio.wait_for(connection.woken.wait(), 5)
    sent = sasl.observe(3, final) or final
    assert int(codec.decode_response(36, 2, sent[4:])[1].error_code) == error_code
    assert sasl.principal == principal and not sasl.awaiting
    assert (sasl.state is State.COMPLETE) is (principal is not None)
    assert (sasl.close_reason is None) is (principal is not None)
