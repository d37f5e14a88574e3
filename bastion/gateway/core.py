"""The gateway core: many upstream servers federated into one, with every client request sent through the pipeline."""

from __future__ import annotations

import asyncio
import itertools
import logging
import uuid
from functools import partial
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Mapping, Sequence, TypeVar

import msgspec

from bastion import __version__
from bastion.config import GatewayConfig
from bastion.credentials.build import CredentialSource
from bastion.credentials.oauth_client import AuthorizationCodes
from bastion.gateway.bridge import InputBridge
from bastion.gateway.catalog import BadCursor, Catalog, ServerFacts, paginate
from bastion.gateway.naming import SEPARATOR, sanitize
from bastion.gateway.pipeline import Chain
from bastion.gateway.pool import InstanceListener, UpstreamPool
from bastion.gateway.upstream import Launcher, Upstream, launch_server
from bastion.model import (
    NOTIFICATION, REQUEST, TO_CLIENT, TO_SERVER, CallInFlight, GatewayError, GatewayRequest, Handler, Identity,
    Interceptor, Session,
)
from bastion.protocol import jsonrpc
from bastion.protocol.client_session import SELF
from bastion.protocol.correlation import Pending
from bastion.protocol.jsonrpc import ErrorResponse, RawResponse
from bastion.transport.stdio import WriteBatch

if TYPE_CHECKING:
    from bastion.gateway.frontend import ClientConnection
    from bastion.policy.interceptors import PolicyRuntime

log = logging.getLogger("bastion.gateway")

SERVER_INFO = {"name": "bastion", "version": __version__}
RELAYABLE_CLIENT_CAPABILITIES = ("sampling", "elicitation", "roots")
# What handshake-era servers are told the client supports. They start with Bastion, before any client connects,
# so they are told everything Bastion can relay; a request the connected client did not declare is refused then.
DECLARED_TO_SERVERS: dict[str, Any] = {"sampling": {}, "elicitation": {}, "roots": {"listChanged": True}}

# list method -> (catalog kind, result key, capability that says the server has them)
_LISTS = {
    "tools/list": ("tools", "tools", "tools"),
    "prompts/list": ("prompts", "prompts", "prompts"),
    "resources/list": ("resources", "resources", "resources"),
    "resources/templates/list": ("resourceTemplates", "resourceTemplates", "resources"),
}
_Found = TypeVar("_Found")
_MAX_INPUT_ROUNDS = 8
_INPUT_CAPABILITY = {"sampling/createMessage": "sampling", "elicitation/create": "elicitation", "roots/list": "roots"}
_LIST_CHANGED = {
    "notifications/tools/list_changed": ("tools/list",),
    "notifications/prompts/list_changed": ("prompts/list",),
    "notifications/resources/list_changed": ("resources/list", "resources/templates/list"),
}


class Gateway:
    def __init__(
        self,
        config: GatewayConfig,
        *,
        catalog: Catalog | None = None,
        policy: PolicyRuntime | None = None,
        exposure: Sequence[Interceptor] = (),
        screens: Sequence[Interceptor] = (),
        interceptors: Sequence[Interceptor] = (),
        tool_index: Any = None,
        launcher: Launcher = launch_server,
        credentials: CredentialSource | None = None,
    ) -> None:
        """Built by ``bastion.compose.build_gateway``, which builds the policy, the exposure and the tool index
        from ``config``; the chain is ``exposure``, ``screens`` (what decides whether a definition is served at all),
        the policy's interceptors, then ``interceptors``."""
        if config.policy is not None and policy is None:
            raise ValueError("the configuration has a policy and none was given: build the gateway with "
                             "bastion.compose.build_gateway, which builds it")
        if config.tools.exposure in ("search", "auto") and not exposure:
            raise ValueError("the configuration asks for search exposure and none was given: build the gateway with "
                             "bastion.compose.build_gateway, which builds it")
        self.config = config
        enabled = {name: cfg for name, cfg in config.servers.items() if cfg.enabled}
        self.catalog = catalog if catalog is not None else server_catalog(config)
        # Shared by every pipe Bastion reads and writes, clients' and servers' alike: a frame is written while the
        # chunk that caused it is handled, and the frame may go to any of them.
        self.writes = WriteBatch()
        # What each upstream connection authenticates with (never a caller's own token): Bastion's own here.
        # Per-user authorization-code flows: their callbacks are served by the HTTP frontend or a loopback listener.
        self.authorization_codes = AuthorizationCodes(self.identity.name)
        self.credentials = credentials if credentials is not None else CredentialSource(
            authorization_code=self.authorization_codes)
        self.upstreams = {
            name: Upstream(name, cfg, self, launcher, config.max_message_bytes, self.writes,
                           credentials=self.credentials.for_server(name, cfg, None))
            for name, cfg in enabled.items()
        }
        # Servers whose scope is per_identity or per_session: each caller's calls go to an instance of its own;
        # the instance above serves only Bastion itself (the catalog).
        instances = InstanceListener(self)
        self.pools = {
            name: UpstreamPool(name, cfg, self._instance_maker(name, cfg, instances, launcher))
            for name, cfg in enabled.items() if cfg.scope != "shared"
        }
        self._tool_index = tool_index
        self.policy = policy
        # The one path of every message, both ways, from every frontend and the host API, compiled per route. Where
        # nothing on a tools/call's route reads its result, the result is passed on as the bytes its server sent;
        # where nothing reads its params, its arguments reach the server as the bytes the client sent
        # (``takes_raw_params``: the frontend then leaves them undecoded).
        self.chain = Chain([*exposure, *screens, *(self.policy.interceptors if self.policy else ()), *interceptors],
                           lambda raw_results: partial(self._route, raw_results=True) if raw_results else self._route)
        self.handle = self.chain.handle
        self.takes_raw_params = self.chain.route(TO_SERVER, REQUEST, "tools/call").raw_params
        # Server notifications a route has interceptors for pass them one after another, in the server's order; one
        # whose route is empty is delivered at once, at no cost.
        self._notice_tail: asyncio.Task[None] | None = None
        self._notices: set[asyncio.Task[None]] = set()
        self._connections: dict[str, ClientConnection] = {}
        # Connections are told apart by a counter under a random prefix of this gateway's own: unique across runs
        # (audit records name them), at no random draw per connection (a 2026-07-28 HTTP POST is one).
        self._connection_prefix = uuid.uuid4().hex[:16]
        self._connection_count = itertools.count(1)
        self._started = False
        # The name head each server's tools and prompts have, to say why a name of a server still down is unknown.
        self._name_heads = {
            f"{sanitize(name if cfg.prefix is None else cfg.prefix)}{SEPARATOR}": name
            for name, cfg in enabled.items() if cfg.prefix != ""
        }
        self._refreshes: dict[tuple[str, str], asyncio.Task[None]] = {}
        # Lists a server announced as changed, whose refresh tells the clients even when the catalog comes out the
        # same (the list may have changed and changed back meanwhile): the server's news, passed on.
        self._announced: set[tuple[str, str]] = set()
        self._subscriptions: dict[str, set[str]] = {}  # uri -> connection ids
        # 2026-07-28 clients' calls in flight, where a handshake-era server's question to the client waits.
        self.inputs = InputBridge()

    # ------------------------------------------------------------------------------------------ running
    def start(self, client_capabilities: Mapping[str, Any] | None = None) -> None:
        """Start every server, in parallel, declaring to each the client capabilities Bastion can relay (by
        default all of them: servers start before any client connects)."""
        if self._started:
            return
        self._started = True
        declared = DECLARED_TO_SERVERS if client_capabilities is None else _relayable(client_capabilities)
        for upstream in self.upstreams.values():
            upstream.client_capabilities = dict(declared)
            upstream.start()

    async def wait_ready(self, timeout: float | None = None, *, report: bool = True) -> None:
        """Wait until every server is ready with its lists fetched, or has failed to start, or ``timeout`` passes
        (``ready_timeout`` by default: a client's start waits that long at most; later servers join with
        list_changed). ``report`` logs the servers still missing then."""
        await self._wait_for_servers(lambda u: u.settled.wait(), timeout or self.config.ready_timeout)
        if not report:
            return
        for name, upstream in self.upstreams.items():
            if not upstream.ready.is_set() and not upstream.stopped:  # a stopped server has said why, once
                log.warning("server %s is not ready yet (%s); it joins when it is", name, upstream.failure or "starting")

    def servers_settled(self) -> bool:
        """Whether ``wait_ready`` has nothing left to wait for: every server is ready with its lists fetched, or has
        failed to start."""
        return all(u.settled.is_set() for u in self.upstreams.values()) and \
            all(task.done() for task in self._refreshes.values())

    async def wait_started(self) -> None:
        """Wait until every server is ready with its lists fetched, or has failed to start within its own
        ``startup_timeout``: for one-shot commands, which have no list_changed to take a late server in."""
        await self._wait_for_servers(lambda u: u.wait_started(), None)

    async def _wait_for_servers(self, started: Callable[[Upstream], Awaitable[Any]], timeout: float | None) -> None:
        async def one(upstream: Upstream) -> None:
            await started(upstream)
            if upstream.ready.is_set():
                await self._wait_refreshes(upstream.name)

        waits = [asyncio.create_task(one(u)) for u in self.upstreams.values()]
        if not waits:
            return
        _, pending = await asyncio.wait(waits, timeout=timeout)
        for task in pending:
            task.cancel()

    async def _wait_refreshes(self, server: str) -> None:
        while True:
            tasks = [t for (s, _), t in self._refreshes.items() if s == server and not t.done()]
            if not tasks:
                return
            await asyncio.gather(*tasks, return_exceptions=True)

    async def close(self) -> None:
        for task in self._refreshes.values():
            task.cancel()
        for task in list(self._notices):
            task.cancel()
        self.inputs.close()
        await asyncio.gather(*(u.close() for u in self.upstreams.values()), *(p.close() for p in self.pools.values()),
                             return_exceptions=True)
        await self.authorization_codes.close()  # the loopback listener for authorization redirects, if one opened
        if self.policy is not None:
            await self.policy.aclose()
        if self._tool_index is not None:
            self._tool_index.close()

    def tool_index(self) -> Any:
        """The search index over this gateway's catalog, as ``build_gateway`` gave it (its ``current()`` is the
        index as of the catalog now)."""
        if self._tool_index is None:
            raise RuntimeError("this gateway was built without a tool index: build it with "
                               "bastion.compose.build_gateway")
        return self._tool_index

    @property
    def identity(self) -> Identity:
        """Who a stdio client is: a pipe carries no credentials, so the policy section names it."""
        if self.config.policy is None:
            return Identity("local", ("local",))
        configured = self.config.policy.identity
        return Identity(configured.name, tuple(configured.groups))

    def connection_id(self) -> str:
        """A new client connection's id, never given to another connection of this gateway or of another run."""
        return f"{self._connection_prefix}-{next(self._connection_count)}"

    def attach(self, connection: ClientConnection) -> None:
        self._connections[connection.id] = connection

    def detach(self, connection: ClientConnection) -> None:
        self._connections.pop(connection.id, None)
        for uri in list(self._subscriptions):
            self._unsubscribe_connection(uri, connection.id)
        for pool in self.pools.values():
            pool.end_session_soon(connection.id)

    # ------------------------------------------------------------------------------------- capabilities
    def server_capabilities(self) -> dict[str, Any]:
        caps: dict[str, Any] = {"tools": {"listChanged": True}, "logging": {}}
        ups = [u.capabilities for u in self.upstreams.values()]
        # A server not heard from yet may bring prompts and resources when it joins: a client told of them now
        # takes the list_changed that announces them (their lists are empty until then).
        unheard = any(not u.capabilities and not u.stopped for u in self.upstreams.values())
        if unheard or any("prompts" in c for c in ups):
            caps["prompts"] = {"listChanged": True}
        if unheard or any("resources" in c for c in ups):
            caps["resources"] = {"subscribe": True, "listChanged": True}
        if any("completions" in c for c in ups):
            caps["completions"] = {}
        return caps

    def instructions(self) -> str | None:
        parts = [f"[{name}] {u.instructions}" for name, u in self.upstreams.items() if u.instructions]
        return "\n\n".join(parts) if parts else None

    # ------------------------------------------------------------------------------------------ routing
    async def _route(self, request: GatewayRequest, raw_results: bool = False) -> Any:
        method = request.method
        params = request.params
        if method == "tools/call":  # first: nearly every request is one
            name = params.get("name")
            if type(name) is msgspec.Raw:  # params the frontend left as the client's bytes (takes_raw_params)
                name = jsonrpc.raw_string(name)
                entry = self.catalog.tool(name) if isinstance(name, str) else None
            else:
                entry = request.target
            if entry is None:  # the slower way, which may wait for servers still starting, only for a name not found
                entry = await self._find(self.catalog.tool, name, "tool")
            return await self._forward(request, entry.server, {**params, "name": entry.original_name}, raw_results)
        if method in _LISTS:
            kind, key, _ = _LISTS[method]
            try:
                page, next_cursor = paginate(self.catalog.listing(kind), params.get("cursor"), self.config.page_size)
            except BadCursor as exc:
                raise GatewayError(jsonrpc.INVALID_PARAMS, str(exc)) from None
            result: dict[str, Any] = {key: page}
            if next_cursor:
                result["nextCursor"] = next_cursor
            return result
        if method == "prompts/get":
            named = await self._find(self.catalog.prompt, params.get("name"), "prompt")
            return await self._forward(request, named.server, {**params, "name": named.original})
        if method == "resources/read":
            return await self._forward(request, self._resource_server(params.get("uri"), request.session), params)
        if method in ("resources/subscribe", "resources/unsubscribe"):
            return await self._subscription(request)
        if method == "completion/complete":
            return await self._complete(request)
        if method == "logging/setLevel":
            await self._set_level(params, request.session)
            return {}
        if method == "ping":
            return {}
        raise GatewayError(jsonrpc.METHOD_NOT_FOUND, f"Method not found: {method}")

    async def _find(self, lookup: Callable[[str], _Found | None], name: Any, kind: str) -> _Found:
        """The catalog entry a client's name stands for; -32602 when there is none (after servers still starting)."""
        found = lookup(name) if isinstance(name, str) else None
        if found is None and isinstance(name, str) and await self._catalog_may_grow():
            found = lookup(name)
        if found is None:
            self._refuse_for_server_down(name)
            raise GatewayError(jsonrpc.INVALID_PARAMS, f"Unknown {kind}: {name}")
        return found

    def _refuse_for_server_down(self, name: Any) -> None:
        """A name under the prefix of a server that is not ready is refused with -32001 saying why."""
        if not isinstance(name, str):
            return
        for head, server in self._name_heads.items():
            upstream = self.upstreams[server]
            if name.startswith(head) and not upstream.ready.is_set():
                raise GatewayError(jsonrpc.UPSTREAM_UNAVAILABLE,
                                   f"server {server!r} is not available: {upstream.failure or 'starting'}")

    async def _catalog_may_grow(self) -> bool:
        """Before calling a name unknown, wait for servers still starting: the name may be theirs."""
        if all(u.ready.is_set() or u.settled.is_set() for u in self.upstreams.values()) or not self._started:
            return False
        await self.wait_ready(report=False)  # the client's start said which servers were missing
        return True

    def _resource_server(self, uri: Any, session: Session) -> str:
        """The server whose resource ``uri`` is; an unknown one is refused with the code of the client's era: -32602
        for 2026-07-28 (SEP-2164), -32002 for the handshake era, whose specification names that code."""
        owner = self.catalog.resource_owner(uri) if isinstance(uri, str) else None
        if owner is None:
            code = jsonrpc.INVALID_PARAMS if session.era == "modern" else jsonrpc.RESOURCE_NOT_FOUND
            raise GatewayError(code, f"Resource not found: {uri}", {"uri": uri})
        return owner

    def _instance_maker(self, name: str, config: Any, listener: InstanceListener,
                        launcher: Launcher) -> Callable[[Identity], Upstream]:
        def make(identity: Identity) -> Upstream:
            instance = Upstream(name, config, listener, launcher, self.config.max_message_bytes, self.writes,
                                credentials=self.credentials.for_server(name, config, identity),
                                secrets=self.credentials.identity_secrets(name, config, identity))
            instance.client_capabilities = dict(self.upstreams[name].client_capabilities)
            return instance
        return make

    def _forward(self, request: GatewayRequest, server: str, params: dict[str, Any],
                 raw_results: bool = False) -> Awaitable[Any]:
        # A plain function handing back the coroutine that forwards: no coroutine layer of its own per request.
        pool = self.pools.get(server)
        if pool is not None:
            return pool.call(request.session, lambda instance: self._forward_to(request, instance, server, params,
                                                                                raw_results))
        return self._forward_to(request, self.upstreams[server], server, params, raw_results)

    async def _forward_to(self, request: GatewayRequest, upstream: Upstream, server: str,
                          params: dict[str, Any], raw_results: bool = False) -> Any:
        """Send a request to its server; the result, or (``raw_results``, for a handshake-era client) the
        ``RawResponse`` it came in when it has no 2026-07-28 field to remove."""
        session = request.session
        meta = params.get("_meta")
        progress_token = meta.get("progressToken") if isinstance(meta, dict) else None
        # Only a modern server reads the client's capabilities per request; a legacy one had them at the handshake.
        capabilities = _relayable(session.client_capabilities) if upstream.era == "modern" else None
        result = await upstream.request(
            request.method,
            params,
            origin=session.session_id,
            origin_id=request.request_id,
            progress_token=progress_token,
            log_level=request.log_level,
            client_capabilities=capabilities,
            encode=_encoder(params),
            # Only a client connection writes a result as the server's bytes; the host API and tests take objects.
            keep_raw=raw_results and session.era == "legacy" and session.client is not None,
            client_era=session.era,  # a handshake-era client's request reaches a dual-era server in its era
        )
        tail = self._notice_tail
        if tail is not None and not tail.done():
            # The server's notifications that came before its answer (progress, log messages) still pass the chain:
            # the answer leaves after them, as the server sent it (over HTTP the answer ends the call's stream).
            await asyncio.wait([tail])
        if type(result) is RawResponse:
            # Only a modern server's result has fields a handshake-era client must not see. A byte search can match
            # inside a string too, which only costs a decode.
            frame = result.frame
            if frame.find(b'"resultType"') < 0 and frame.find(b'"_meta"') < 0:
                return result
            decoded = result.decoded()
            if type(decoded) is ErrorResponse:
                raise GatewayError.from_error(decoded.error)
            result = decoded.result
        if result.get("resultType") == "input_required":
            if session.era != "modern":
                return await self.drive_input_required(request, server, params, result)
            return await self._screen_input_requests(request, server, result)
        return result

    async def _screen_input_requests(self, request: GatewayRequest, server: str,
                                     result: dict[str, Any]) -> dict[str, Any]:
        """A modern server's questions to a modern client (sampling, elicitation, roots) pass the chain on their way
        out, as every other server's request to a client does; one an interceptor refuses fails the call with that
        refusal, as the server cannot be answered but through the client."""
        embedded = result.get("inputRequests")
        if not isinstance(embedded, dict):
            return result
        calls = (CallInFlight(request.method, request.request_id),)
        screened: dict[str, Any] = {}
        for key, asked in embedded.items():
            method = asked.get("method") if isinstance(asked, dict) else None
            params = asked.get("params") if isinstance(asked, dict) else None
            if not isinstance(method, str) or not isinstance(params, dict):
                screened[key] = asked
                continue

            async def passed_on(outgoing: GatewayRequest) -> dict[str, Any]:
                return outgoing.params

            params = await self._toward_client(method, params, request.session, server, passed_on, calls)
            screened[key] = {**asked, "params": params}
        return {**result, "inputRequests": screened}

    async def drive_input_required(self, request: GatewayRequest, server: str, params: dict[str, Any],
                                   result: dict[str, Any]) -> dict[str, Any]:
        """Answer a modern server's ``input_required`` rounds by asking a legacy client, until the call completes."""
        pool = self.pools.get(server)
        upstream = (pool.instance(request.session) if pool is not None else None) or self.upstreams[server]
        capabilities = _relayable(request.session.client_capabilities)
        for _ in range(_MAX_INPUT_ROUNDS):
            if result.get("resultType") != "input_required":
                return result
            result = await self._drive_input_required(request, upstream, params, result, capabilities)
        raise GatewayError(jsonrpc.INTERNAL_ERROR,
                           f"server {server!r} kept asking for input after {_MAX_INPUT_ROUNDS} rounds")

    async def _drive_input_required(self, request: GatewayRequest, upstream: Upstream, params: dict[str, Any],
                                    result: dict[str, Any], capabilities: dict[str, Any]) -> dict[str, Any]:
        """A modern server needs input and the client is legacy: ask the client each embedded request, then retry."""
        client = request.session.client
        responses: dict[str, Any] = {}
        for key, embedded in (result.get("inputRequests") or {}).items():
            method = embedded.get("method") if isinstance(embedded, dict) else None
            capability = _INPUT_CAPABILITY.get(method)
            if client is None or capability is None or not client.supports(capability):
                raise GatewayError(jsonrpc.INTERNAL_ERROR,
                                   f"server {upstream.name!r} needs {method or 'input'} from the client, which did not "
                                   f"declare the {capability or 'needed'!r} capability")
            # Through the chain, as a handshake-era server's own request would be; a refusal fails the call, as an
            # answer of input has no way to carry an error.
            responses[key] = await self._toward_client(
                method, embedded.get("params") or {}, request.session, upstream.name,
                lambda asked: client.request(asked.method, asked.params),  # type: ignore[union-attr]
                (CallInFlight(request.method, request.request_id),))
        retry = {**params, "inputResponses": responses}
        if result.get("requestState") is not None:
            retry["requestState"] = result["requestState"]
        return await upstream.request(request.method, retry, origin=request.session.session_id,
                                      origin_id=f"{request.request_id}/input", log_level=request.log_level,
                                      client_capabilities=capabilities, encode=_encoder(retry))

    async def _subscription(self, request: GatewayRequest) -> dict[str, Any]:
        uri = request.params.get("uri")
        server = self._resource_server(uri, request.session)
        subscribers = self._subscriptions.setdefault(uri, set())
        if request.method == "resources/subscribe":
            first = not subscribers
            subscribers.add(request.session.session_id)
            if first:
                await self._upstream_subscribe(server, uri, subscribe=True)
        else:
            self._unsubscribe_connection(uri, request.session.session_id)
        return {}

    def _unsubscribe_connection(self, uri: str, connection_id: str) -> None:
        subscribers = self._subscriptions.get(uri)
        if subscribers is None or connection_id not in subscribers:
            return
        subscribers.discard(connection_id)
        if not subscribers:
            del self._subscriptions[uri]
            server = self.catalog.resource_owner(uri)
            if server is not None:
                asyncio.create_task(self._upstream_subscribe(server, uri, subscribe=False))

    async def _upstream_subscribe(self, server: str, uri: str, subscribe: bool) -> None:
        upstream = self.upstreams[server]
        if upstream.era == "modern":
            uris = [u for u, subs in self._subscriptions.items() if subs and self.catalog.resource_owner(u) == server]
            await upstream.set_resource_subscriptions(uris)
            return
        try:
            await upstream.request("resources/subscribe" if subscribe else "resources/unsubscribe", {"uri": uri})
        except GatewayError as exc:
            if subscribe:
                raise
            log.info("server %s: unsubscribe from %s failed: %s", server, uri, exc.message)

    async def _complete(self, request: GatewayRequest) -> dict[str, Any]:
        ref = request.params.get("ref") or {}
        if ref.get("type") == "ref/prompt":
            named = self.catalog.prompt(ref.get("name", ""))
            if named is None:
                raise GatewayError(jsonrpc.INVALID_PARAMS, f"Unknown prompt: {ref.get('name')}")
            params = {**request.params, "ref": {**ref, "name": named.original}}
            return await self._forward(request, named.server, params)
        if ref.get("type") == "ref/resource":
            server = self.catalog.template_owner(ref.get("uri", ""))
            if server is None:
                raise GatewayError(jsonrpc.INVALID_PARAMS, f"Unknown resource template: {ref.get('uri')}")
            return await self._forward(request, server, request.params)
        raise GatewayError(jsonrpc.INVALID_PARAMS, "completion ref must be ref/prompt or ref/resource")

    async def _set_level(self, params: dict[str, Any], session: Session | None = None) -> None:
        # A caller of a pooled server has an instance of its own, whose log messages are that caller's: it is told too.
        own = [pool.instance(session) for pool in self.pools.values()] if session is not None else []
        candidates = [*self.upstreams.values(), *(u for u in own if u is not None)]
        targets = [u for u in candidates if u.era == "legacy" and "logging" in u.capabilities and u.ready.is_set()]
        results = await asyncio.gather(*(u.request("logging/setLevel", params) for u in targets), return_exceptions=True)
        for upstream, outcome in zip(targets, results):
            if isinstance(outcome, Exception):
                log.info("server %s: logging/setLevel failed: %s", upstream.name, outcome)

    # ---------------------------------------------------------------------------- upstream → gateway
    def upstream_ready(self, upstream: Upstream) -> None:
        for method, (_, _, capability) in _LISTS.items():
            if capability in upstream.capabilities:
                self._schedule_refresh(upstream, method)

    def upstream_down(self, upstream: Upstream, reason: str) -> None:
        # The upstream itself says why at WARNING, with its last stderr lines and what happens next.
        log.debug("server %s is down: %s", upstream.name, reason)

    def upstream_notification(self, upstream: Upstream, method: str, params: dict[str, Any], pending: Pending | None) -> None:
        route = self.chain.route(TO_CLIENT, NOTIFICATION, method)
        # Whose calls the server works on is read now: by the time an interceptor passes a log message on, the
        # call it belongs to may have ended.
        callers = self._log_callers(upstream) if method == "notifications/message" else None
        if route.empty:
            self._deliver_notification(upstream, method, params, pending, callers)
            return

        async def deliver(passed: GatewayRequest) -> dict[str, Any]:
            self._deliver_notification(upstream, passed.method, passed.params, pending, callers)
            return {}

        request = GatewayRequest(method, params, self._notice_session(pending, callers), self.catalog,
                                 server=upstream.name, direction=TO_CLIENT, kind=NOTIFICATION, deliver=deliver)
        # Intercepted notifications run one after another, so they reach clients in the order the server sent them.
        previous = self._notice_tail
        self._notice_tail = asyncio.create_task(self._intercept_notification(previous, route.handle, request))
        self._notices.add(self._notice_tail)
        self._notice_tail.add_done_callback(self._notices.discard)

    async def _intercept_notification(self, previous: asyncio.Task[None] | None, handle: Handler,
                                      request: GatewayRequest) -> None:
        if previous is not None:
            await asyncio.wait([previous])
        try:
            await handle(request)
        except Exception as exc:  # a notification has no reply to carry a refusal: the interceptor dropped it
            reason = exc.message if isinstance(exc, GatewayError) else repr(exc)
            log.info("server %s: %s not forwarded: %s", request.server, request.method, reason)

    def _log_callers(self, upstream: Upstream) -> set[str]:
        return {origin for origin, _ in upstream._correlator.origins() if origin != SELF}

    def _notice_session(self, pending: Pending | None, callers: set[str] | None) -> Session:
        """The session of the client a notification belongs to, when one call's client is known; else Bastion's."""
        origins = {pending.origin} if pending is not None else callers or set()
        if len(origins) == 1:
            connection = self._connections.get(next(iter(origins)))
            if connection is not None:
                return connection.session
        return Session(self.identity, "legacy", "", {})

    def _deliver_notification(self, upstream: Upstream, method: str, params: dict[str, Any], pending: Pending | None,
                              callers: set[str] | None) -> None:
        if method == "notifications/progress" and pending is not None:
            connection = self._connections.get(pending.origin)
            if connection is not None:
                connection.notify(method, {**params, "progressToken": pending.origin_progress_token})
            return
        if method in _LIST_CHANGED:
            for list_method in _LIST_CHANGED[method]:
                self._schedule_refresh(upstream, list_method, announced=list_method == _LIST_CHANGED[method][0])
            return
        if method == "notifications/resources/updated":
            uri = params.get("uri")
            for connection_id in self._subscriptions.get(uri, ()):
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
                callers = self._log_callers(upstream)
            targets = [self._connections[o] for o in callers if o in self._connections] if callers else \
                list(self._connections.values())
            for connection in targets:
                connection.log_message(forwarded)
            return
        if method == "notifications/subscriptions/acknowledged":
            return
        log.debug("server %s sent %s; not forwarded", upstream.name, method)

    async def upstream_request(self, upstream: Upstream, method: str, params: dict[str, Any]) -> dict[str, Any]:
        """A server asks the client something (sampling, elicitation, roots): relay it to the client whose call
        caused it, never to another. A 2026-07-28 client's call answers with ``input_required`` for it."""
        capability = _INPUT_CAPABILITY.get(method)
        if capability is None:
            raise GatewayError(jsonrpc.METHOD_NOT_FOUND, f"Method not found: {method}")
        asking = f"{method} from server {upstream.name!r}"
        callers = [(origin, origin_id) for origin, origin_id in upstream._correlator.origins()
                   if origin in self._connections or self.inputs.find(origin, origin_id) is not None]
        if len({origin for origin, _ in callers}) > 1:
            raise GatewayError(jsonrpc.INVALID_REQUEST,
                               f"{asking} came while calls of several clients were in flight on it, and nothing says "
                               "whose call asked: give a server that asks its client for input scope per_session")
        bridged = [call for call in (self.inputs.find(*caller) for caller in callers) if call is not None]
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
            return await self._toward_client(method, params, session, upstream.name,
                                             lambda asked: self.inputs.ask(call, asked.method, asked.params),
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
        return await self._toward_client(method, params, connection.session, upstream.name,
                                         lambda asked: connection.request(asked.method, asked.params),
                                         _calls_in_flight(upstream, [c for c in callers if c[0] == connection.id]))

    def _toward_client(self, method: str, params: dict[str, Any], session: Session, server: str,
                       ask: Handler, calls: tuple[CallInFlight, ...] = ()) -> Awaitable[dict[str, Any]]:
        """A server's request to a client, through the chain (the policy's decision, the guardrails), then ``ask``;
        ``calls`` are that client's calls the server is working on."""
        return self.chain.handle(GatewayRequest(method, params, session, self.catalog, server=server,
                                                calls_in_flight=calls, direction=TO_CLIENT, deliver=ask))

    def _schedule_refresh(self, upstream: Upstream, list_method: str, announced: bool = False) -> None:
        key = (upstream.name, list_method)
        if announced:
            self._announced.add(key)
        previous = self._refreshes.get(key)
        if previous is not None and not previous.done():
            previous.cancel()
        self._refreshes[key] = asyncio.create_task(self._refresh(upstream, list_method))

    async def _refresh(self, upstream: Upstream, list_method: str) -> None:
        kind, key, _ = _LISTS[list_method]
        items: list[dict[str, Any]] = []
        cursor = None
        try:
            for _ in range(10_000):
                params = {"cursor": cursor} if cursor else {}
                result = await upstream.request(list_method, params)
                page = result.get(key)
                if isinstance(page, list):
                    items.extend(i for i in page if isinstance(i, dict))
                cursor = result.get("nextCursor")
                if not cursor:
                    break
        except GatewayError as exc:
            log.warning("server %s: %s failed: %s", upstream.name, list_method, exc.message)
            return
        announced = (upstream.name, list_method) in self._announced
        self._announced.discard((upstream.name, list_method))
        if self.catalog.update(upstream.name, kind, items) or announced:
            notification = {"tools": "notifications/tools/list_changed", "prompts": "notifications/prompts/list_changed",
                            "resources": "notifications/resources/list_changed",
                            "resourceTemplates": "notifications/resources/list_changed"}[kind]
            for connection in list(self._connections.values()):
                connection.list_changed(notification)


def server_catalog(config: GatewayConfig) -> Catalog:
    """An empty catalog of the enabled servers of ``config``, which their lists fill as they come."""
    return Catalog([
        ServerFacts(name, name if cfg.prefix is None else cfg.prefix, cfg.trust)
        for name, cfg in config.servers.items() if cfg.enabled
    ])


def _encoder(params: Mapping[str, Any]) -> Callable[[Any, str, Any], bytes]:
    """How to frame a request with ``params``: as they are, when they still hold the client's raw JSON values
    (a call whose params nothing in the chain reads), else the ordinary way."""
    for value in params.values():
        if type(value) is msgspec.Raw:
            return jsonrpc.raw_request_frame
    return jsonrpc.request_frame


def _calls_in_flight(upstream: Upstream, origins: Sequence[tuple[Any, Any]]) -> tuple[CallInFlight, ...]:
    """The calls of ``origins`` (connection id, the client's request id) ``upstream`` is still working on."""
    calls = []
    for origin, origin_id in origins:
        pending = upstream._correlator.find_by_origin(origin, origin_id)
        if pending is not None:
            calls.append(CallInFlight(pending.method, origin_id))
    return tuple(calls)


def _relayable(capabilities: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in capabilities.items() if k in RELAYABLE_CLIENT_CAPABILITIES}
