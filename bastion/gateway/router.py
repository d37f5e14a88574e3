"""The router: the chain's last step for a client's request, which it sends to the server it names (a tool's,
a prompt's, a resource's) or answers from the catalog (the lists, ``ping``)."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Mapping, TypeVar

import msgspec

from bastion.gateway.catalog import LISTS, BadCursor, Catalog, paginate
from bastion.gateway.input_rounds import InputRounds
from bastion.gateway.log_levels import LogLevels
from bastion.gateway.naming import SEPARATOR, sanitize
from bastion.gateway.relay import relayable
from bastion.gateway.subscriptions import Subscriptions
from bastion.model import GatewayError, GatewayRequest, Session
from bastion.protocol import jsonrpc
from bastion.protocol.jsonrpc import ErrorResponse, RawResponse

if TYPE_CHECKING:
    from bastion.config import GatewayConfig
    from bastion.gateway.pool import UpstreamPool
    from bastion.gateway.upstream import Upstream

_Found = TypeVar("_Found")


class Router:
    def __init__(self, config: GatewayConfig, catalog: Catalog, upstreams: Mapping[str, Upstream],
                 pools: Mapping[str, UpstreamPool], subscriptions: Subscriptions, input_rounds: InputRounds,
                 catalog_may_grow: Callable[[], Awaitable[bool]],
                 notices_pending: Callable[[], "asyncio.Task[None] | None"] = lambda: None,
                 log_levels: LogLevels | None = None,
                 lists_fetched: Callable[[str], Awaitable[None]] | None = None, observer: Any = None,
                 lists_announced: Callable[[str], list["asyncio.Task[None]"]] = lambda method: []) -> None:
        self._config = config
        if observer is not None:
            # Tracing: the call to a server is a span of its own, and the server is sent its context. Without an
            # observer ``_forward`` is the method itself, with no layer around it.
            self._forward = observer.upstream(self._forward)  # type: ignore[method-assign]
        # Until a server's lists are in the catalog, after it became ready: a name of a server a call retried is
        # looked up again then.
        self._lists_fetched = lists_fetched
        # The fetches under way of a list a server announced as changed: a client's list of it waits for them.
        self._lists_announced = lists_announced
        # What level each handshake-era server is asked to log at: the most verbose its clients want.
        self._log_levels = log_levels if log_levels is not None else LogLevels({}, upstreams, pools)
        # The server notifications still passing the chain (``Relay.notices``): an answer leaves after them.
        self._notices_pending = notices_pending
        self._catalog = catalog
        self._upstreams = upstreams
        self._pools = pools
        self._subscriptions = subscriptions
        self._input_rounds = input_rounds
        # Before calling a name unknown: waits for servers still starting, True when it did (the name may be theirs).
        self._catalog_may_grow = catalog_may_grow
        self.configure(config)

    def configure(self, config: GatewayConfig) -> None:
        """Take a (reloaded) configuration: its page size and its servers' name heads."""
        self._config = config
        # The name head each server's tools and prompts have, to say why a name of a server still down is unknown.
        self._name_heads = {
            f"{sanitize(name if cfg.prefix is None else cfg.prefix)}{SEPARATOR}": name
            for name, cfg in config.servers.items() if cfg.enabled and cfg.prefix != ""
        }

    async def route(self, request: GatewayRequest, raw_results: bool = False) -> Any:
        if request.deliver is not None:  # a retry that continues a call in flight: it resumes that call
            return await request.deliver(request)
        method = request.method
        params = request.params
        catalog = self._catalog
        if method == "tools/call":  # first: nearly every request is one
            name = params.get("name")
            if type(name) is msgspec.Raw:  # params the frontend left as the client's bytes (takes_raw_params)
                name = jsonrpc.raw_string(name)
                entry = catalog.tool(name) if isinstance(name, str) else None
            else:
                entry = request.target
            if entry is None:  # the slower way, which may wait for servers still starting, only for a name not found
                entry = await self._find(catalog.tool, name, "tool")
            return await self._forward(request, entry.server, {**params, "name": entry.original_name}, raw_results)
        if method in LISTS:
            kind, key, _ = LISTS[method]
            for _ in range(3):  # a fetch a newer announcement cancelled is followed by the newer one, a few times
                announced = self._lists_announced(method)
                if not announced:
                    break
                await asyncio.wait(announced)
            try:
                page, next_cursor = paginate(catalog.listing(kind), params.get("cursor"), self._config.page_size)
            except BadCursor as exc:
                raise GatewayError(jsonrpc.INVALID_PARAMS, str(exc)) from None
            result: dict[str, Any] = {key: page}
            if next_cursor:
                result["nextCursor"] = next_cursor
            return result
        if method == "prompts/get":
            named = await self._find(catalog.prompt, params.get("name"), "prompt")
            return await self._forward(request, named.server, {**params, "name": named.original})
        if method == "resources/read":
            return await self._forward(request, self._resource_server(params.get("uri"), request.session), params)
        if method in ("resources/subscribe", "resources/unsubscribe"):
            server = self._resource_server(params.get("uri"), request.session)
            return await self._subscriptions.request(request, server)
        if method == "completion/complete":
            return await self._complete(request)
        if method == "logging/setLevel":
            # The client's own level is in its session already, and filters what it is sent; the servers are asked
            # for the most verbose level any of their clients wants, never narrowed to this client's alone.
            await self._log_levels.client_set(request.session)
            return {}
        if method == "ping":
            return {}
        raise GatewayError(jsonrpc.METHOD_NOT_FOUND, f"Method not found: {method}")

    def server_for(self, method: str | None, params: Mapping[str, Any]) -> str | None:
        """The one server a client's request would be forwarded to, or None when the gateway answers it (or refuses
        it) itself: what a frontend's per-server bound (the HTTP in-flight gate) counts. A name under a configured
        server's prefix counts for that server while it is still starting (its first calls wait for it)."""
        catalog = self._catalog
        if method == "tools/call":
            name = params.get("name")
            return self._server_of(name, catalog.tool) if isinstance(name, str) else None
        if method == "prompts/get":
            name = params.get("name")
            return self._server_of(name, catalog.prompt) if isinstance(name, str) else None
        if method in ("resources/read", "resources/subscribe", "resources/unsubscribe"):
            uri = params.get("uri")
            return catalog.resource_owner(uri) if isinstance(uri, str) else None
        if method == "completion/complete":
            ref = params.get("ref")
            if not isinstance(ref, dict):
                return None
            if ref.get("type") == "ref/prompt" and isinstance(ref.get("name"), str):
                return self._server_of(ref["name"], catalog.prompt)
            if ref.get("type") == "ref/resource" and isinstance(ref.get("uri"), str):
                return catalog.template_owner(ref["uri"])
        return None

    def _server_of(self, name: str, lookup: Callable[[str], Any]) -> str | None:
        entry = lookup(name)
        if entry is not None:
            return entry.server
        prefix, separator, _ = name.partition(SEPARATOR)
        return prefix if separator and prefix in self._config.servers else None

    async def _find(self, lookup: Callable[[str], _Found | None], name: Any, kind: str) -> _Found:
        """The catalog entry a client's name stands for; -32602 when there is none (after servers still starting)."""
        found = lookup(name) if isinstance(name, str) else None
        if found is None and isinstance(name, str) and await self._catalog_may_grow():
            found = lookup(name)
        if found is None:
            upstream = self._server_down(name)
            if upstream is not None and upstream.gave_up and await upstream.retried():
                # A call asked for a server not restarted any more, and the start it got worked.
                if self._lists_fetched is not None:
                    await self._lists_fetched(upstream.name)
                found = lookup(name)
                upstream = self._server_down(name) if found is None else None
            if found is None and upstream is not None:
                raise GatewayError(jsonrpc.UPSTREAM_UNAVAILABLE, upstream.failed_message())
        if found is None:
            raise GatewayError(jsonrpc.INVALID_PARAMS, f"Unknown {kind}: {name}")
        return found

    def _server_down(self, name: Any) -> Upstream | None:
        """The server that is not ready under whose prefix ``name`` is: its name is refused with -32001 saying why."""
        if not isinstance(name, str):
            return None
        for head, server in self._name_heads.items():
            upstream = self._upstreams[server]
            if name.startswith(head) and not upstream.ready.is_set():
                return upstream
        return None

    def _resource_server(self, uri: Any, session: Session) -> str:
        """The server whose resource ``uri`` is; an unknown one is refused with the code of the client's era: -32602
        for 2026-07-28 (SEP-2164), -32002 for the handshake era, whose specification names that code."""
        owner = self._catalog.resource_owner(uri) if isinstance(uri, str) else None
        if owner is None:
            code = jsonrpc.INVALID_PARAMS if session.era == "modern" else jsonrpc.RESOURCE_NOT_FOUND
            raise GatewayError(code, f"Resource not found: {uri}", {"uri": uri})
        return owner

    def _forward(self, request: GatewayRequest, server: str, params: dict[str, Any],
                 raw_results: bool = False) -> Awaitable[Any]:
        # A plain function handing back the coroutine that forwards: no coroutine layer of its own per request.
        pool = self._pools.get(server)
        if pool is not None:
            return pool.call(request.session, lambda instance: self._forward_to(request, instance, server, params,
                                                                                raw_results))
        return self._forward_to(request, self._upstreams[server], server, params, raw_results)

    async def _forward_to(self, request: GatewayRequest, upstream: Upstream, server: str,
                          params: dict[str, Any], raw_results: bool = False) -> Any:
        """Send a request to its server; the result, or (``raw_results``, for a handshake-era client) the
        ``RawResponse`` it came in when it has no 2026-07-28 field to remove."""
        session = request.session
        meta = params.get("_meta")
        progress_token = meta.get("progressToken") if isinstance(meta, dict) else None
        # Only a modern server reads the client's capabilities per request; a legacy one had them at the handshake.
        capabilities = relayable(session.client_capabilities) if upstream.era == "modern" else None
        result = await upstream.request(
            request.method,
            params,
            origin=session.session_id,
            origin_id=request.request_id,
            progress_token=progress_token,
            log_level=request.log_level,
            client_capabilities=capabilities,
            encode=jsonrpc.request_encoder(params),
            # Only a client connection writes a result as the server's bytes; the host API and tests take objects.
            keep_raw=raw_results and session.era == "legacy" and session.client is not None,
            client_era=session.era,  # a handshake-era client's request reaches a dual-era server in its era
        )
        pending = self._notices_pending()
        if pending is not None:
            # The server's notifications that came before its answer (progress, log messages) still pass the chain:
            # the answer leaves after them, as the server sent it (over HTTP the answer ends the call's stream).
            await asyncio.wait([pending])
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
                return await self._input_rounds.drive(request, server, params, result)
            return await self._input_rounds.screen(request, server, result)
        return result

    async def _complete(self, request: GatewayRequest) -> dict[str, Any]:
        ref = request.params.get("ref") or {}
        if ref.get("type") == "ref/prompt":
            named = self._catalog.prompt(ref.get("name", ""))
            if named is None:
                raise GatewayError(jsonrpc.INVALID_PARAMS, f"Unknown prompt: {ref.get('name')}")
            params = {**request.params, "ref": {**ref, "name": named.original}}
            return await self._forward(request, named.server, params)
        if ref.get("type") == "ref/resource":
            server = self._catalog.template_owner(ref.get("uri", ""))
            if server is None:
                raise GatewayError(jsonrpc.INVALID_PARAMS, f"Unknown resource template: {ref.get('uri')}")
            return await self._forward(request, server, request.params)
        raise GatewayError(jsonrpc.INVALID_PARAMS, "completion ref must be ref/prompt or ref/resource")
