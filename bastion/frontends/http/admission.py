"""Admission to the HTTP frontend, before any session work: the Host and Origin guard behind the trusted proxies,
who is calling (authentication, the scopes every request needs and a method's own), the in-flight gate of the
server a request goes to, and the audit of the refusals made here."""

from __future__ import annotations

import logging
from typing import Any, Callable

from bastion.auth.base import AuthFailure, Credentials
from bastion.auth.build import HttpAuth
from bastion.config import HttpConfig
from bastion.frontends.http.exchanges import Peeked, ServerGate
from bastion.frontends.http.guards import OriginGuard, TrustedProxies
from bastion.frontends.http.wire import HttpError, Scope
from bastion.gateway.core import Gateway
from bastion.model import Identity

log = logging.getLogger("bastion.http")


def nothing() -> None:
    return None


class Admission:
    """What a request passes before it reaches a session or the gateway; each refusal is an ``HttpError`` (or, at
    the in-flight gate, the busy error to answer with)."""

    def __init__(self, gateway: Gateway, settings: HttpConfig, auth: HttpAuth, *, bound_to_loopback: bool) -> None:
        self.gateway = gateway
        self.auth = auth
        self.gate = ServerGate(settings.max_in_flight_per_server, settings.retry_after_seconds)
        self._proxies = TrustedProxies(settings.trusted_proxies)
        self._origins = OriginGuard(bound_to_loopback=bound_to_loopback, allowed_hosts=settings.allowed_hosts,
                                    allowed_origins=settings.allowed_origins)

    def admit(self, scope: Scope, headers: dict[str, str]) -> str:
        """The client's address, once its Host and Origin are admitted."""
        client = scope.get("client") or ("", 0)
        peer = self._proxies.resolve(client[0], scope.get("scheme", "http"), headers)
        refusal = self._origins.refusal(peer, headers.get("origin"))
        if refusal is not None:
            log.warning("refused a request from %s: %s", peer.address, refusal)
            raise HttpError(403, -32600, refusal)
        return peer.address

    def site(self, scope: Scope, headers: dict[str, str]) -> tuple[str, str]:
        """The scheme and ``host[:port]`` the client addressed, behind the trusted proxies."""
        client = scope.get("client") or ("", 0)
        return self._proxies.site(client[0], scope.get("scheme", "http"), headers)

    async def authenticate(self, scope: Scope, headers: dict[str, str], route: str, peer: str) -> Identity:
        """Who sends this request, before its body is read or any session is looked at; the scopes every request
        needs are checked here, a method's own once the body names it."""
        if not self.auth.required:
            return self.gateway.identity
        try:
            identity = await self.auth.authenticator.authenticate(
                Credentials(headers, route, peer, scope.get("bastion.peer_certificate")))
            self.auth.check_scopes(identity, None)
        except AuthFailure as failure:
            raise self.refused(failure, peer, route) from None
        return identity

    def check_method_scopes(self, identity: Identity, top: Peeked) -> None:
        if top.kind == "request" and self.auth.scopes is not None:
            try:
                self.auth.check_scopes(identity, top.method)
            except AuthFailure as failure:
                self.audit_refusal(identity, top, "scopes", "http.auth.scopes", failure.reason or failure.error,
                                    failure.status)
                raise self.refused(failure, "", top.method or "", top.id) from None

    def audit_refusal(self, identity: Identity, top: Peeked, stage: str, rule: str, reason: str, outcome: int) -> None:
        """A refusal at admission is audited as the chain's own refusals are (when the policy keeps an audit)."""
        policy = self.gateway.policy
        if policy is None:
            return
        params = top.params if isinstance(top.params, dict) else {}
        target = params.get("name") or params.get("uri")
        policy.record_admission_refusal(identity, top.method or "", target if isinstance(target, str) else None,
                                        stage, rule, reason, outcome)

    @staticmethod
    def refused(failure: AuthFailure, peer: str, route: str, request_id: Any = None) -> HttpError:
        # The kind of refusal only: never the credential, nor the claims of a token that did not hold.
        log.info("refused a request%s on %s: %s (HTTP %d)", f" from {peer}" if peer else "", route,
                 failure.reason or failure.error, failure.status)
        headers: tuple[tuple[bytes, bytes], ...] = ()
        if failure.www_authenticate:
            headers = ((b"www-authenticate", failure.www_authenticate.encode("latin-1")),)
        if failure.status == 503:
            headers = (*headers, (b"retry-after", b"5"))
        return HttpError(failure.status, -32600, failure.message, request_id, headers)

    def gate_request(self, top: Peeked, identity: Identity) -> tuple[Callable[[], None], dict[str, Any] | None]:
        """Take the in-flight slot of the server a request goes to: (release, None), or (no-op, the busy error)
        when that server is full. A request the gateway answers itself (lists, ping) takes none."""
        server = self.gateway.server_for(top.method, top.params) if isinstance(top.params, dict) else None
        if server is None:
            return nothing, None
        release = self.gate.acquire(server)
        if release is None:
            log.info("refused %s for %s: it has %d requests in flight", top.method, server, self.gate.limit)
            busy = self.gate.busy_error(server)
            self.audit_refusal(identity, top, "admission", "http.max_in_flight_per_server",
                                f"server {server!r} has {self.gate.limit} requests in flight", busy["code"])
            return nothing, busy
        return release, None
