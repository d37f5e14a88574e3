"""The servers' messages toward clients: a server's notification to the client it belongs to (whose call, who
subscribed, every client), and a server's request (sampling, elicitation, roots) to the client whose call caused
it, never to another; all of them through the chain, a server's ping and a request of a method Bastion relays to no
client included (Bastion answers those itself, at the chain's last step)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Mapping, Protocol, Sequence

from bastion.gateway.catalog import Catalog
from bastion.gateway.pipeline import Chain, InOrder
from bastion.gateway.refresh import LIST_CHANGED, CatalogRefresh
from bastion.gateway.subscriptions import Subscriptions
from bastion.model import (
    NOTIFICATION, TO_CLIENT, CallInFlight, ClientChannel, GatewayError, GatewayRequest, Handler, Identity, Session,
)
from bastion.protocol import jsonrpc
from bastion.protocol.client_session import SELF
from bastion.protocol.correlation import Pending

if TYPE_CHECKING:
    from bastion.gateway.bridge import InputBridge
    from bastion.gateway.upstream import Upstream

log = logging.getLogger("bastion.gateway")

RELAYABLE_CLIENT_CAPABILITIES = ("sampling", "elicitation", "roots")
# A server's request to a client -> the client capability it needs.
INPUT_CAPABILITY = {"sampling/createMessage": "sampling", "elicitation/create": "elicitation", "roots/list": "roots"}


class ConnectedClient(ClientChannel, Protocol):
    """What the gateway asks of a connected client (``bastion.frontends.connection.ClientConnection`` is one): the
    frontends drive the gateway, and the gateway knows them only by this."""

    id: str
    era: str | None
    session: Session
    log_level: str | None  # a handshake-era client's logging/setLevel, None until it sets one

    def log_message(self, params: dict[str, Any]) -> None:
        """A server's log message, if the client's log level takes it."""

    def resource_updated(self, params: dict[str, Any]) -> None:
        """A resource the client subscribed to changed."""


def relayable(capabilities: Mapping[str, Any]) -> dict[str, Any]:
    """The client capabilities whose requests Bastion can relay to the client."""
    return {k: v for k, v in capabilities.items() if k in RELAYABLE_CLIENT_CAPABILITIES}


class Relay:
    def __init__(self, chain: Chain, catalog: Catalog, connections: Mapping[str, ConnectedClient],
                 inputs: InputBridge, subscriptions: Subscriptions, refresh: CatalogRefresh,
                 identity: Callable[[], Identity]) -> None:
        self._chain = chain
        self._catalog = catalog
        self._connections = connections
        self._inputs = inputs  # 2026-07-28 clients' calls in flight, where a server's question waits
        self._subscriptions = subscriptions
        self._refresh = refresh
        self._identity = identity  # Bastion's own session's identity, for a notification no one client's
        # Server notifications a route has interceptors for pass them one after another, in the servers' order; one
        # whose route is empty is delivered at once, at no cost, unless some are still passing (it waits its turn).
        # An answer that came after them waits for the last (``notices.pending()``): it leaves after them, as the
        # server sent it.
        self.notices = InOrder("a server")

    def use_chain(self, chain: Chain) -> None:
        """A reloaded configuration's chain, for the messages that come from now on."""
        self._chain = chain

    def close(self) -> None:
        self.notices.close()

    # -------------------------------------------------------------------------------------- notifications
    def notification(self, upstream: Upstream, method: str, params: dict[str, Any], pending: Pending | None) -> None:
        route = self._chain.route(TO_CLIENT, NOTIFICATION, method)
        # Whose calls the server works on is read now: by the time an interceptor passes a log message on, the
        # call it belongs to may have ended.
        callers = _log_callers(upstream) if method == "notifications/message" else None
        if route.empty and self.notices.pending() is None:
            self._deliver_notification(upstream, method, params, pending, callers)
            return

        async def deliver(passed: GatewayRequest) -> dict[str, Any]:
            self._deliver_notification(upstream, passed.method, passed.params, pending, callers)
            return {}

        if route.empty:
            # Notifications with interceptors (or of a chain a reload replaced) are still on their way: this one,
            # delivered at once, would overtake them.
            self.notices.pass_on(deliver, GatewayRequest(method, params, self._own_session(), self._catalog,
                                                         server=upstream.name, direction=TO_CLIENT,
                                                         kind=NOTIFICATION, deliver=deliver))
            return
        request = GatewayRequest(method, params, self._notice_session(pending, callers), self._catalog,
                                 server=upstream.name, direction=TO_CLIENT, kind=NOTIFICATION, deliver=deliver)
        self.notices.pass_on(route.handle, request)

    def _notice_session(self, pending: Pending | None, callers: set[str] | None) -> Session:
        """The session of the client a notification (or a request no client is asked) belongs to, when one call's
        client is known; else Bastion's."""
        origins = {pending.origin} if pending is not None else callers or set()
        if len(origins) == 1:
            connection = self._connections.get(next(iter(origins)))
            if connection is not None:
                return connection.session
        return self._own_session()

    def _own_session(self) -> Session:
        """Bastion's own session: for what belongs to no one client."""
        return Session(self._identity(), "legacy", "", {})

    def _deliver_notification(self, upstream: Upstream, method: str, params: dict[str, Any], pending: Pending | None,
                              callers: set[str] | None) -> None:
        if method == "notifications/progress" and pending is not None:
            connection = self._connections.get(pending.origin)
            if connection is not None:
                connection.notify(method, {**params, "progressToken": pending.origin_progress_token})
            return
        if method in LIST_CHANGED:
            self._refresh.list_changed(upstream, method)
            return
        if method == "notifications/resources/updated":
            for connection_id in self._subscriptions.subscribers(params.get("uri")):
                connection = self._connections.get(connection_id)
                if connection is not None:
                    connection.resource_updated(params)
            return
        if method == "notifications/message":
            logger = params.get("logger")
            forwarded = {**params, "logger": f"{upstream.name}/{logger}" if logger else upstream.name}
            forwarded.pop("_meta", None)
            # A log message names no request: while the server works on calls of some clients it is theirs, else
            # every client that asked for logs may read it.
            if callers is None:
                callers = _log_callers(upstream)
            targets = [self._connections[o] for o in callers if o in self._connections] if callers else \
                list(self._connections.values())
            for connection in targets:
                connection.log_message(forwarded)
            return
        if method == "notifications/subscriptions/acknowledged":
            return
        log.debug("server %s sent %s; not forwarded", upstream.name, method)

    # ------------------------------------------------------------------------------------------- requests
    async def request(self, upstream: Upstream, method: str, params: dict[str, Any]) -> dict[str, Any]:
        """A server asks the client something (sampling, elicitation, roots): relay it to the client whose call
        caused it, never to another. A 2026-07-28 client's call answers with ``input_required`` for it. A server's
        ping, and a request of a method Bastion relays to no client, pass the chain too, and Bastion answers them
        at its last step (``{}``; -32601)."""
        capability = INPUT_CAPABILITY.get(method)
        if capability is None:
            return await self._answered_by_bastion(upstream, method, params)
        asking = f"{method} from server {upstream.name!r}"
        inputs = self._inputs
        callers = [(origin, origin_id) for origin, origin_id in upstream._correlator.origins()
                   if origin in self._connections or inputs.find(origin, origin_id) is not None]
        if len({origin for origin, _ in callers}) > 1:
            raise GatewayError(jsonrpc.INVALID_REQUEST,
                               f"{asking} came while calls of several clients were in flight on it, and nothing says "
                               "whose call asked: give a server that asks its client for input scope per_session")
        bridged = [call for call in (inputs.find(*caller) for caller in callers) if call is not None]
        if bridged:
            if len(bridged) > 1:
                raise GatewayError(jsonrpc.INVALID_REQUEST,
                                   f"{asking} came while several calls of one 2026-07-28 client were in flight on it, "
                                   "and nothing says which call asked")
            [call] = bridged
            if capability not in call.client_capabilities:
                raise GatewayError(jsonrpc.INVALID_REQUEST,
                                   f"{asking}: the client whose call caused it did not declare the {capability!r} capability")
            session = Session(call.identity, "modern", "", call.client_capabilities, None, str(call.origin[0]))
            return await self.toward_client(method, params, session, upstream.name,
                                            lambda asked: inputs.ask(call, asked.method, asked.params),
                                            _calls_in_flight(upstream, [call.origin]))
        if callers:
            connection = self._connections[callers[0][0]]
        else:
            # Asked outside any call (roots/list after the handshake, say): only a lone client can be the one meant.
            connected = list(self._connections.values())
            if len(connected) != 1:
                raise GatewayError(jsonrpc.INVALID_REQUEST,
                                   f"{asking} came outside any client's call while {len(connected)} clients are "
                                   "connected, so nothing says which client it is for")
            connection = connected[0]
        if connection.era != "legacy":
            raise GatewayError(jsonrpc.INVALID_REQUEST,
                               f"{asking} came outside any call of its 2026-07-28 client, which can be asked only in "
                               "the answer to a call")
        if not connection.supports(capability):
            raise GatewayError(jsonrpc.METHOD_NOT_FOUND,
                               f"{asking}: the client whose call caused it did not declare the {capability!r} "
                               "capability (Bastion offers it to every server, which start before any client connects)")
        return await self.toward_client(method, params, connection.session, upstream.name,
                                        lambda asked: connection.request(asked.method, asked.params),
                                        _calls_in_flight(upstream, [c for c in callers if c[0] == connection.id]))

    def toward_client(self, method: str, params: dict[str, Any], session: Session, server: str,
                      ask: Handler, calls: tuple[CallInFlight, ...] = ()) -> Awaitable[dict[str, Any]]:
        """A server's request to a client, through the chain (the policy's decision, the guardrails), then ``ask``;
        ``calls`` are that client's calls the server is working on."""
        return self._chain.handle(GatewayRequest(method, params, session, self._catalog, server=server,
                                                 calls_in_flight=calls, direction=TO_CLIENT, deliver=ask))

    def _answered_by_bastion(self, upstream: Upstream, method: str,
                             params: dict[str, Any]) -> Awaitable[dict[str, Any]]:
        """A server's request that no client is asked: its ping (the protocol's keep-alive, answered ``{}`` whether
        no client is connected or several are) or a method Bastion relays to no client (answered -32601). Through
        the chain all the same, marked ``answered_by_bastion``; its last step answers it. A ping belongs to Bastion's
        own session; any other request to the session of the client whose calls the server works on, when there is
        one such client."""
        if method == "ping":
            session = self._own_session()
            answer: Handler = _answer_ping
        else:
            session = self._notice_session(None, _log_callers(upstream))

            async def not_relayed(asked: GatewayRequest) -> dict[str, Any]:
                raise GatewayError(jsonrpc.METHOD_NOT_FOUND, f"Method not found: {method}")

            answer = not_relayed
        return self._chain.handle(GatewayRequest(method, params, session, self._catalog, server=upstream.name,
                                                 direction=TO_CLIENT, deliver=answer, answered_by_bastion=True))


async def _answer_ping(asked: GatewayRequest) -> dict[str, Any]:
    return {}


def _log_callers(upstream: Upstream) -> set[str]:
    return {origin for origin, _ in upstream._correlator.origins() if origin != SELF}


def _calls_in_flight(upstream: Upstream, origins: Sequence[tuple[Any, Any]]) -> tuple[CallInFlight, ...]:
    """The calls of ``origins`` (connection id, the client's request id) ``upstream`` is still working on."""
    calls = []
    for origin, origin_id in origins:
        pending = upstream._correlator.find_by_origin(origin, origin_id)
        if pending is not None:
            calls.append(CallInFlight(pending.method, origin_id))
    return tuple(calls)
