"""The HTTP frontend's authentication seen from inside: the frontend on uvicorn on 127.0.0.1 in the test's loop,
a real gateway (no servers) behind it and a real issuer beside it, so that a test can look at the session a
request renewed and at what a callback received."""

from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator

import httpx2
import pytest
import uvicorn

from bastion.auth.build import build_http_auth
from bastion.auth.config import AuthConfig
from bastion.compose import build_gateway
from bastion.config import GatewayConfig
from bastion.frontends.http.app import HttpFrontend
from bastion.config import HttpConfig
from bastion.transport.listener import listen
from tests.auth.resource_server_issuer import RESOURCE, Issuer

INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}


class Served:
    def __init__(self, frontend: HttpFrontend, url: str) -> None:
        self.frontend, self.url = frontend, url


@pytest.fixture
async def issuer() -> AsyncIterator[Issuer]:
    server = await Issuer().start()
    try:
        yield server
    finally:
        await server.stop()


async def serve(frontend: HttpFrontend) -> tuple[uvicorn.Server, asyncio.Task[None], str]:
    sock = listen("127.0.0.1", 0)
    server = uvicorn.Server(uvicorn.Config(frontend, loop="none", lifespan="off", log_config=None,
                                           access_log=False))
    task = asyncio.get_running_loop().create_task(server.serve(sockets=[sock]))
    while not server.started:
        await asyncio.sleep(0.01)
    return server, task, f"http://127.0.0.1:{sock.getsockname()[1]}"


@pytest.fixture
async def served(issuer: Issuer, request: pytest.FixtureRequest) -> AsyncIterator[Served]:
    gateway = build_gateway(GatewayConfig.model_validate({"servers": {}, "policy": "off", "guardrails": "off"}))
    auth = build_http_auth(AuthConfig(resource=RESOURCE, issuers=[{"issuer": issuer.issuer}],
                                      method_scopes={"tools/call": ["mcp:tools"]}),
                           identity_header=None, identity=gateway.identity)
    received: list[dict[str, Any]] = []

    async def callback(scope: dict[str, Any], receive: Any, send: Any) -> None:
        received.append({"path": scope["path"], "query": scope["query_string"],
                         "authorization": dict(scope["headers"]).get(b"authorization")})
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"4")]})
        await send({"type": "http.response.body", "body": b"done"})

    gateway.start()
    frontend = HttpFrontend(gateway, HttpConfig(), bound_to_loopback=True, auth=auth,
                            callback=callback if getattr(request, "param", True) else None)
    frontend.start()
    server, task, base = await serve(frontend)
    frontend.received = received  # type: ignore[attr-defined]
    try:
        yield Served(frontend, base)
    finally:
        await frontend.stop()
        server.should_exit = True
        await task
        await gateway.close()


def bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}", "accept": "application/json"}


async def test_a_later_token_of_the_same_caller_renews_the_sessions_identity(served: Served, issuer: Issuer) -> None:
    first, second = issuer.token(scope="mcp"), issuer.token(scope="mcp mcp:tools")
    async with httpx2.AsyncClient(timeout=60) as http:
        init = await http.post(served.url + "/mcp", headers=bearer(first), json=INIT)
        assert init.status_code == 200, init.text
        session_id = init.headers["mcp-session-id"]
        session = served.frontend.sessions[session_id]
        assert session.connection.session.identity.scopes == {"mcp"}
        done = await http.post(served.url + "/mcp", headers={**bearer(second), "mcp-session-id": session_id},
                               json={"jsonrpc": "2.0", "method": "notifications/initialized"})
        assert done.status_code == 202
        # What decides from now on (the policy's principal, a token exchange) sees the stepped-up token.
        assert session.connection.session.identity.scopes == {"mcp", "mcp:tools"}
        assert session.connection.session.identity.subject_token == second
        assert session.identity.subject_token == second


async def test_authentication_comes_before_the_body_is_read(served: Served) -> None:
    async with httpx2.AsyncClient(timeout=60) as http:
        response = await http.post(served.url + "/mcp", content=b"{not json", headers={
            "content-type": "application/json", "accept": "application/json"})
        assert response.status_code == 401  # not 400: nothing of an unauthenticated request is parsed


async def test_the_oauth_callback_reaches_its_handler_without_authentication(served: Served) -> None:
    async with httpx2.AsyncClient(timeout=60) as http:
        response = await http.get(served.url + "/oauth/callback?code=abc&state=xyz")
        assert (response.status_code, response.text) == (200, "done")
    assert served.frontend.received == [  # type: ignore[attr-defined]
        {"path": "/oauth/callback", "query": b"code=abc&state=xyz", "authorization": None}]


@pytest.mark.parametrize("served", [False], indirect=True)
async def test_without_a_callback_the_path_is_not_found(served: Served) -> None:
    async with httpx2.AsyncClient(timeout=60) as http:
        assert (await http.get(served.url + "/oauth/callback?code=abc")).status_code == 404


async def test_the_identity_header_is_the_one_method_when_it_is_set() -> None:
    gateway = build_gateway(GatewayConfig.model_validate({"servers": {}, "policy": "off", "guardrails": "off"}))
    frontend = HttpFrontend(gateway, HttpConfig(identity_header="X-Bastion-Identity"), bound_to_loopback=True)
    gateway.start()
    frontend.start()
    server, task, base = await serve(frontend)
    try:
        async with httpx2.AsyncClient(timeout=60) as http:
            refused = await http.post(base + "/mcp", headers={"accept": "application/json"}, json=INIT)
            assert refused.status_code == 401 and "X-Bastion-Identity" in refused.json()["error"]["message"]
            assert "www-authenticate" not in refused.headers
            init = await http.post(base + "/mcp", headers={"accept": "application/json",
                                                           "x-bastion-identity": "dana"}, json=INIT)
            assert init.status_code == 200
            session = frontend.sessions[init.headers["mcp-session-id"]]
            assert (session.identity.name, session.identity.authenticated_by) == ("dana", "header")
            # no metadata is served without issuers
            assert (await http.get(base + "/.well-known/oauth-protected-resource")).status_code == 404
    finally:
        await frontend.stop()
        server.should_exit = True
        await task
        await gateway.close()
