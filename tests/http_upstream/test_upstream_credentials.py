"""The HTTP upstream asks its credentials for headers before every request, shows them a 401 or 403 and retries once
when they obtained new ones, and answers a request for which none can be had with what the user must do (the link,
as the URL elicitation the specification defines). Against a real server on a loopback socket that checks the
Authorization header it receives."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable, Mapping

import orjson
import pytest
import uvicorn

from bastion.transport.credentials import CredentialsError
from bastion.transport.listener import QuietServer, listen
from bastion.transport.http_client import URL_ELICITATION_REQUIRED, HttpTransport

CHALLENGE = 'Bearer error="invalid_token", resource_metadata="http://127.0.0.1/.well-known/oauth-protected-resource"'


class Guarded:
    """An MCP endpoint that answers only the bearer token it currently accepts, and records every Authorization
    header it saw."""

    def __init__(self) -> None:
        self.accepted = "fresh"
        self.seen: list[str | None] = []

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        self.seen.append(headers.get("authorization"))
        if headers.get("authorization") != f"Bearer {self.accepted}":
            await send({"type": "http.response.start", "status": 401,
                        "headers": [(b"www-authenticate", CHALLENGE.encode()), (b"content-length", b"0")]})
            await send({"type": "http.response.body", "body": b""})
            return
        request = orjson.loads(body)
        answer = orjson.dumps({"jsonrpc": "2.0", "id": request["id"], "result": {"ok": True}})
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(answer)).encode())]})
        await send({"type": "http.response.body", "body": answer})


class Tokens:
    """Credentials holding one token; ``refused`` moves to the next of ``renewals`` (a refresh) while any is left."""

    def __init__(self, token: str | None, renewals: Iterable[str] = (), link: str | None = None) -> None:
        self.token = token
        self.renewals = list(renewals)
        self.link = link
        self.refusals: list[tuple[int, str | None]] = []

    async def headers(self) -> Mapping[str, str]:
        if self.token is None:
            raise CredentialsError("alice has not authorized Bastion to reach this server yet", link=self.link)
        return {"Authorization": f"Bearer {self.token}"}

    async def refused(self, status: int, www_authenticate: str | None) -> bool:
        self.refusals.append((status, www_authenticate))
        if not self.renewals:
            return False
        self.token = self.renewals.pop(0)
        return True


class Collected:
    def __init__(self) -> None:
        self.frames: asyncio.Queue[dict] = asyncio.Queue()

    def frames_received(self, frames) -> None:
        for frame in frames:
            self.frames.put_nowait(orjson.loads(frame))


@pytest.fixture
async def guarded() -> AsyncIterator[tuple[Guarded, str]]:
    app = Guarded()
    sock = listen("127.0.0.1", 0)
    server = QuietServer(uvicorn.Config(app, loop="none", lifespan="off", log_config=None, access_log=False))
    serving = asyncio.ensure_future(server.serve(sockets=[sock]))
    try:
        yield app, f"http://127.0.0.1:{sock.getsockname()[1]}/mcp"
    finally:
        server.should_exit = True
        await asyncio.wait_for(serving, 60)


async def one_call(url: str, credentials: Tokens) -> dict:
    transport = HttpTransport("remote", url, {}, kind="streamable-http", credentials=credentials)
    received = Collected()
    await transport.start(received)
    try:
        transport.send(orjson.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/list",
                                     "params": {"_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28"}}}))
        return await asyncio.wait_for(received.frames.get(), 60)
    finally:
        await transport.close()


async def test_every_request_carries_the_credentials_current_token(guarded) -> None:
    app, url = guarded
    answer = await one_call(url, Tokens("fresh"))
    assert answer == {"jsonrpc": "2.0", "id": 1, "result": {"ok": True}}
    assert app.seen == ["Bearer fresh"]


async def test_a_401_shows_the_challenge_and_the_request_goes_once_more_with_the_renewed_token(guarded) -> None:
    app, url = guarded
    credentials = Tokens("stale", renewals=["fresh"])
    answer = await one_call(url, credentials)
    assert answer["result"] == {"ok": True}
    assert credentials.refusals == [(401, CHALLENGE)]
    assert app.seen == ["Bearer stale", "Bearer fresh"]


async def test_a_second_refusal_is_the_answer_never_a_loop(guarded) -> None:
    app, url = guarded
    app.accepted = "nobody has this"
    credentials = Tokens("stale", renewals=["also-stale", "still-stale", "never-sent"])
    answer = await one_call(url, credentials)
    assert "401" in answer["error"]["message"]
    assert app.seen == ["Bearer stale", "Bearer also-stale"]
    assert len(credentials.refusals) == 1


async def test_credentials_that_decline_a_retry_leave_one_request(guarded) -> None:
    app, url = guarded
    credentials = Tokens("stale")
    answer = await one_call(url, credentials)
    assert "error" in answer
    assert app.seen == ["Bearer stale"] and credentials.refusals == [(401, CHALLENGE)]


async def test_no_credentials_with_a_link_is_the_url_elicitation_naming_it_and_nothing_is_sent(guarded) -> None:
    app, url = guarded
    link = "http://127.0.0.1:9/authorize?state=abc"
    answer = await one_call(url, Tokens(None, link=link))
    error = answer["error"]
    assert error["code"] == URL_ELICITATION_REQUIRED == -32042
    assert link in error["message"]
    [elicitation] = error["data"]["elicitations"]
    assert elicitation["mode"] == "url" and elicitation["url"] == link and elicitation["elicitationId"]
    assert app.seen == []


async def test_no_credentials_without_a_link_says_what_to_do(guarded) -> None:
    app, url = guarded
    answer = await one_call(url, Tokens(None))
    assert answer["error"]["code"] != URL_ELICITATION_REQUIRED
    assert "has not authorized" in answer["error"]["message"]
    assert app.seen == []
