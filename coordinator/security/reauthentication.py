"""KIP-368 on the client side, for a connection the coordinator authenticated itself and keeps (the relay's
control connection and its connections to transaction coordinators): before the broker's session on it ends, the
SASL exchange runs again on the same connection, as Java's clients do (at 85–95% of the session lifetime the broker
gave, picked at random). A broker whose session expired closes the connection on its next request instead.

While the exchange runs, other requests wait and are sent after it: requests already sent are answered first (a
broker reads one request of a connection at a time), but a request written between the exchange's frames would be
read as a SASL token. A refused re-authentication closes the connection (its requests fail; the relay opens a new
one on the next request, whose authentication then says what is wrong)."""

from __future__ import annotations

import asyncio
import logging
import random
from typing import Any

from protocol.client import KafkaClient
from protocol.errors import ConnectionClosed, ProtocolError, RequestTimedOut

from coordinator.security.client_config import ClientSecurity
from coordinator.security.sasl_client import ClusterAuthenticationError, authenticate

log = logging.getLogger("coordinator.security")

_REAUTH_AT = (0.85, 0.95)  # of the session lifetime: Java's SaslClientAuthenticator's window


class ReauthenticatingClient(KafkaClient):
    """A KafkaClient that re-authenticates itself once `keep_authenticated` told it the session's lifetime."""

    def __init__(self, client_id: str | None, default_timeout_ms: int) -> None:
        super().__init__(client_id, default_timeout_ms)
        self._security: ClientSecurity | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._exchange: asyncio.Task[None] | None = None
        self._held: list[tuple[tuple[Any, ...], asyncio.Future[Any]]] | None = None  # None: not re-authenticating
        self._sending_exchange = False
        self.reauthentications = 0

    def keep_authenticated(self, security: ClientSecurity, lifetime_ms: int) -> None:
        """The exchange `security` describes just completed with this session lifetime (0: it never expires)."""
        self._security = security
        self._schedule(lifetime_ms)

    def _schedule(self, lifetime_ms: int) -> None:
        if lifetime_ms > 0 and not self.is_closed:
            self._timer = self._loop.call_later(lifetime_ms * random.uniform(*_REAUTH_AT) / 1000, self._begin)

    def _begin(self) -> None:
        self._timer = None
        if not self.is_closed:
            self._exchange = self._loop.create_task(self._reauthenticate())

    async def _reauthenticate(self) -> None:
        assert self._security is not None
        self._held = []
        try:
            lifetime_ms = await authenticate(self._request_now, self._security)
        except (ClusterAuthenticationError, ConnectionClosed, RequestTimedOut, ProtocolError) as exc:
            log.warning("event=upstream_reauthentication_failed upstream=%s mechanism=%s error=%s", self.address,
                        self._security.mechanism, exc)
            self._fail_all(ConnectionClosed(f"re-authentication failed: {exc}"))
            return
        self.reauthentications += 1
        log.info("event=upstream_reauthenticated upstream=%s mechanism=%s principal=%s session_lifetime_ms=%d",
                 self.address, self._security.mechanism, self._security.principal, lifetime_ms)
        held, self._held = self._held, None
        for arguments, future in held:
            if not future.done():  # its caller may have given up meanwhile
                _forward(super()._send(*arguments), future)
        self._schedule(lifetime_ms)

    async def _request_now(self, body: Any) -> Any:
        """A request of the exchange itself: not held."""
        self._sending_exchange = True
        try:
            sent = self.send(body)
        finally:
            self._sending_exchange = False
        return await sent

    def _send(self, frame: bytes, correlation_id: int, api_key: int, version: int, timeout_ms: int | None,
              raw: bool) -> asyncio.Future[Any]:
        if self._held is None or self._sending_exchange:
            return super()._send(frame, correlation_id, api_key, version, timeout_ms, raw)
        future = self._loop.create_future()
        self._held.append(((frame, correlation_id, api_key, version, timeout_ms, raw), future))
        return future

    def _fail_all(self, error: BaseException) -> None:
        super()._fail_all(error)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._exchange is not None and self._exchange is not asyncio.current_task():
            self._exchange.cancel()
        held, self._held = self._held, None
        for _arguments, future in held or ():
            if not future.done():
                future.set_exception(error)


def _forward(source: asyncio.Future[Any], target: asyncio.Future[Any]) -> None:
    def copy(done: asyncio.Future[Any]) -> None:
        if target.done():
            return
        if done.cancelled():
            target.cancel()
        elif done.exception() is not None:
            target.set_exception(done.exception())  # type: ignore[arg-type]
        else:
            target.set_result(done.result())

    source.add_done_callback(copy)
