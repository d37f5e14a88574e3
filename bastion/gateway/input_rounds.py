"""A 2026-07-28 server's ``input_required`` answer to a call: its questions (sampling, elicitation, roots) screened
by the chain on their way to a client of its era, or, for a handshake-era client, asked of the client one round
after another and the call retried with the answers, until it completes."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Mapping

from bastion.gateway.relay import INPUT_CAPABILITY, relayable
from bastion.model import CallInFlight, GatewayError, GatewayRequest
from bastion.protocol import jsonrpc

if TYPE_CHECKING:
    from bastion.gateway.pool import UpstreamPool
    from bastion.gateway.upstream import Upstream

MAX_INPUT_ROUNDS = 8


class InputRounds:
    def __init__(self, upstreams: Mapping[str, Upstream], pools: Mapping[str, UpstreamPool],
                 toward_client: Callable[..., Any]) -> None:
        self._upstreams = upstreams
        self._pools = pools
        self._toward_client = toward_client  # a server's request to a client, through the chain (Relay)

    async def screen(self, request: GatewayRequest, server: str, result: dict[str, Any]) -> dict[str, Any]:
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

    async def drive(self, request: GatewayRequest, server: str, params: dict[str, Any],
                    result: dict[str, Any]) -> dict[str, Any]:
        """Answer a modern server's ``input_required`` rounds by asking a legacy client, until the call completes."""
        pool = self._pools.get(server)
        upstream = (pool.instance(request.session) if pool is not None else None) or self._upstreams[server]
        capabilities = relayable(request.session.client_capabilities)
        for _ in range(MAX_INPUT_ROUNDS):
            if result.get("resultType") != "input_required":
                return result
            result = await self._round(request, upstream, params, result, capabilities)
        raise GatewayError(jsonrpc.INTERNAL_ERROR,
                           f"server {server!r} kept asking for input after {MAX_INPUT_ROUNDS} rounds")

    async def _round(self, request: GatewayRequest, upstream: Upstream, params: dict[str, Any],
                     result: dict[str, Any], capabilities: dict[str, Any]) -> dict[str, Any]:
        """A modern server needs input and the client is legacy: ask the client each embedded request, then retry."""
        client = request.session.client
        responses: dict[str, Any] = {}
        for key, embedded in (result.get("inputRequests") or {}).items():
            method = embedded.get("method") if isinstance(embedded, dict) else None
            capability = INPUT_CAPABILITY.get(method)
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
                                      client_capabilities=capabilities, encode=jsonrpc.request_encoder(retry))
