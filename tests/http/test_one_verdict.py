"""One reading, one verdict: a real ``bastion serve`` (Streamable HTTP in both eras, and HTTP+SSE) and a real
``bastion run`` (stdio) accept and refuse the same bodies, refuse them with the same JSON-RPC error (over HTTP with
status 400), before anything decides on them or a server sees them, and a refused request never holds its id: the
same id is answered right after the refusal."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import AsyncIterator, Iterator

import httpx2
import orjson
import pytest

from bastion.compose import build_gateway
from bastion.config import GatewayConfig, HttpConfig
from bastion.frontends.http.app import HttpFrontend
from bastion.protocol.jsonrpc import MAX_DEPTH
from tests.auth.test_resource_server_frontend import serve
from tests.http.conftest import IDENTITY_HEADER, Served, start_bastion, stop_bastion
from tests.http.test_sdk_clients import MODERN_META
from tests.support import RawClient, raw_server, write_config

TOOL = "raw__echo"
LEGACY = {IDENTITY_HEADER: "tester", "content-type": "application/json",
          "accept": "application/json, text/event-stream"}
MODERN = {**LEGACY, "mcp-protocol-version": "2026-07-28", "mcp-method": "tools/call", "mcp-name": TOOL}


def nested(depth: int) -> bytes:
    """An array ``depth`` levels deep."""
    return b"[" * depth + b"]" * depth


def call(request_id: int, arguments: bytes, *, modern: bool = False) -> bytes:
    """A tools/call of the echo tool whose arguments are ``arguments``, written as given."""
    meta = b',"_meta":' + orjson.dumps(MODERN_META) if modern else b""
    return (b'{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"%s","arguments":%s%s}}'
            % (request_id, TOOL.encode(), arguments, meta))


def utf16(frame: bytes) -> bytes:
    return frame.decode().encode("utf-16")  # with its byte order mark


def utf16_without_bom(frame: bytes) -> bytes:
    return frame.decode().encode("utf-16-le")


ARGUMENTS_AT = 3  # the arguments object is the third level of a call (message, params, arguments)


# (case, the frame for an id and an era, the code it is refused with or None when it is accepted, words of the message)
CASES = [
    ("NaN", lambda i, m: call(i, b'{"text":NaN}', modern=m), -32700, "Parse error"),
    ("Infinity", lambda i, m: call(i, b'{"text":Infinity}', modern=m), -32700, "Parse error"),
    ("-Infinity", lambda i, m: call(i, b'{"text":-Infinity}', modern=m), -32700, "Parse error"),
    ("1e400", lambda i, m: call(i, b'{"text":"x","n":1e400}', modern=m), -32700, "Parse error"),
    ("an integer no double holds", lambda i, m: call(i, b'{"text":"x","n":1' + b"0" * 400 + b"}", modern=m),
     -32700, "Parse error"),
    ("lone surrogate", lambda i, m: call(i, b'{"text":"\\ud800"}', modern=m), -32700, "Parse error"),
    ("lone low surrogate", lambda i, m: call(i, b'{"text":"\\udc00x"}', modern=m), -32700, "Parse error"),
    ("UTF-8 BOM", lambda i, m: b"\xef\xbb\xbf" + call(i, b'{"text":"x"}', modern=m), -32700, "Parse error"),
    ("UTF-16", lambda i, m: utf16(call(i, b'{"text":"x"}', modern=m)), -32700, "Parse error"),
    ("UTF-16 without BOM", lambda i, m: utf16_without_bom(call(i, b'{"text":"x"}', modern=m)), -32700,
     "Parse error"),
    ("body 100,000 deep", lambda i, m: nested(100_000), -32600, f"{MAX_DEPTH} levels"),
    ("arguments 300 deep", lambda i, m: call(i, b'{"a":' + nested(300) + b"}", modern=m), -32600,
     f"{MAX_DEPTH} levels"),
    ("arguments 100,000 deep", lambda i, m: call(i, b'{"a":' + nested(100_000) + b"}", modern=m), -32600,
     f"{MAX_DEPTH} levels"),
    ("one level past the limit", lambda i, m: call(i, b'{"a":' + nested(MAX_DEPTH - ARGUMENTS_AT + 1) + b"}",
                                                   modern=m), -32600, f"{MAX_DEPTH} levels"),
    ("an id wider than 64 bits", lambda i, m: call(2**64 + i, b'{"text":"x"}', modern=m), -32600, "id must be"),
    # Accepted alike: what the protocol allows.
    ("an integer wider than 64 bits", lambda i, m: call(i, b'{"text":"wide","n":123456789012345678901234567890}',
                                                         modern=m), None, "wide"),
    ("nesting at the limit", lambda i, m: call(i, b'{"text":"deep","a":' + nested(MAX_DEPTH - ARGUMENTS_AT) + b"}",
                                               modern=m), None, "deep"),
]
IDS = [case for case, _, _, _ in CASES]


def marked_calls(marks: Path) -> int:
    return sum(line.startswith("call ") for line in marks.read_text().splitlines()) if marks.exists() else 0


def echo_server(marks: Path) -> dict:
    entry = raw_server(marks)
    entry["env"]["RAW_SERVER_MARK_CALLS"] = "1"
    return entry


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Served, Path]]:
    tmp = tmp_path_factory.mktemp("one-verdict-http")
    marks = tmp / "marks"
    served = start_bastion(tmp, {"identity_header": IDENTITY_HEADER}, servers={"raw": echo_server(marks)})
    try:
        yield served, marks
    finally:
        stop_bastion(served)


@pytest.fixture(scope="module")
def stdio(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RawClient, Path]]:
    tmp = tmp_path_factory.mktemp("one-verdict-stdio")
    marks = tmp / "marks"
    client = RawClient(write_config(tmp / "bastion.json", {"raw": echo_server(marks)}))
    try:
        client.initialize()
        yield client, marks
    finally:
        client.close()


def answer_over_stdio(client: RawClient, frame: bytes) -> dict:
    client.send_bytes(frame + b"\n")
    return client.recv(60)


def check_answer(answer: dict, request_id: int, code: int | None, words: str) -> None:
    if code is None:
        assert answer.get("id") == request_id and words in answer["result"]["content"][0]["text"], answer
    else:
        assert answer["error"]["code"] == code and words in answer["error"]["message"], answer


@pytest.mark.parametrize("case, frame_of, code, words", CASES, ids=IDS)
async def test_http_and_stdio_give_the_same_verdict(served: tuple[Served, Path], stdio: tuple[RawClient, Path],
                                                    case: str, frame_of, code: int | None, words: str) -> None:
    (http_bastion, http_marks), (client, stdio_marks) = served, stdio
    request_id = 100 + IDS.index(case)
    frame = frame_of(request_id, False)
    calls_before = marked_calls(http_marks), marked_calls(stdio_marks)
    over_stdio = answer_over_stdio(client, frame)
    async with httpx2.AsyncClient(timeout=120) as http:
        headers = await open_session(http, http_bastion.url)
        response = await http.post(http_bastion.url, headers=headers, content=frame)
        over_http = response.json()
        check_answer(over_http, request_id, code, words)
        if code is None:
            assert response.status_code == 200
            assert {**over_http, "id": None} == {**over_stdio, "id": None}
        else:
            assert response.status_code == 400, response.text
            assert over_http == over_stdio  # the same error, message and id included
            assert "result" not in over_http
        # Nothing was served: the refused call never reached the server, and its id is free at once.
        assert (marked_calls(http_marks), marked_calls(stdio_marks)) == (
            calls_before[0] + (code is None), calls_before[1] + (code is None))
        again = await http.post(http_bastion.url, headers=headers, content=call(request_id, b'{"text":"again"}'))
        assert again.status_code == 200 and again.json()["result"]["content"][0]["text"] == "again", again.text
    again_over_stdio = answer_over_stdio(client, call(request_id, b'{"text":"again"}'))
    assert again_over_stdio["id"] == request_id and again_over_stdio["result"]["content"][0]["text"] == "again"


@pytest.mark.parametrize("case, frame_of, code, words", CASES, ids=IDS)
async def test_a_2026_request_gets_the_same_verdict(served: tuple[Served, Path], case: str, frame_of,
                                                   code: int | None, words: str) -> None:
    http_bastion, _ = served
    request_id = 200 + IDS.index(case)
    async with httpx2.AsyncClient(timeout=120) as http:
        response = await http.post(http_bastion.url, headers=MODERN, content=frame_of(request_id, True))
        check_answer(response.json(), request_id, code, words)
        assert response.status_code == (200 if code is None else 400), response.text


@pytest.mark.parametrize("case, frame_of, code, words", CASES, ids=IDS)
async def test_an_http_sse_post_gets_the_same_verdict(served: tuple[Served, Path], case: str, frame_of,
                                                     code: int | None, words: str) -> None:
    http_bastion, _ = served
    request_id = 300 + IDS.index(case)
    async with httpx2.AsyncClient(timeout=120) as http, sse_session(http, http_bastion.base) as (endpoint, events):
        response = await http.post(endpoint, headers=LEGACY, content=frame_of(request_id, False))
        if code is None:
            assert response.status_code == 202, response.text
            check_answer(await events.get(), request_id, code, words)
        else:
            assert response.status_code == 400, response.text
            check_answer(response.json(), request_id, code, words)
        again = await http.post(endpoint, headers=LEGACY, content=call(request_id, b'{"text":"again"}'))
        assert again.status_code == 202
        answer = await events.get()
        assert answer["id"] == request_id and answer["result"]["content"][0]["text"] == "again"


async def open_session(http: httpx2.AsyncClient, url: str) -> dict[str, str]:
    init = await http.post(url, headers=LEGACY, json={"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}}})
    assert init.status_code == 200, init.text
    headers = {**LEGACY, "mcp-session-id": init.headers["mcp-session-id"], "mcp-protocol-version": "2025-06-18"}
    done = await http.post(url, headers=headers, json={"jsonrpc": "2.0", "method": "notifications/initialized"})
    assert done.status_code == 202
    return headers


class sse_session:
    """An HTTP+SSE session: the endpoint to POST to, and a queue of the messages its stream carries."""

    def __init__(self, http: httpx2.AsyncClient, base: str) -> None:
        self.http, self.base = http, base
        self.events: asyncio.Queue[dict] = asyncio.Queue()

    async def __aenter__(self) -> tuple[str, asyncio.Queue[dict]]:
        endpoint: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self.reader = asyncio.ensure_future(self._read(endpoint))
        path = await endpoint
        url = f"{self.base}{path}"
        init = await self.http.post(url, headers=LEGACY, json={
            "jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
                "protocolVersion": "2024-11-05", "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}}})
        assert init.status_code == 202
        assert (await self.events.get())["id"] == 0
        done = await self.http.post(url, headers=LEGACY, json={"jsonrpc": "2.0", "method": "notifications/initialized"})
        assert done.status_code == 202
        return url, self.events

    async def __aexit__(self, *exc: object) -> None:
        self.reader.cancel()
        await asyncio.gather(self.reader, return_exceptions=True)

    async def _read(self, endpoint: asyncio.Future[str]) -> None:
        async with self.http.stream("GET", f"{self.base}/sse", headers={
                IDENTITY_HEADER: "tester", "accept": "text/event-stream"}) as stream:
            event = ""
            async for line in stream.aiter_lines():
                if line.startswith("event: "):
                    event = line[7:]
                elif line.startswith("data: ") and event == "endpoint":
                    endpoint.set_result(line[6:])
                elif line.startswith("data: "):
                    self.events.put_nowait(json.loads(line[6:]))


# ------------------------------------------------------------------------------------- inside the frontend
@pytest.fixture
async def frontend() -> AsyncIterator[tuple[HttpFrontend, str]]:
    """The HTTP frontend on uvicorn in the test's loop, a gateway without servers behind it, to look inside."""
    gateway = build_gateway(GatewayConfig.model_validate({"servers": {}, "policy": "off", "guardrails": "off"}))
    frontend = HttpFrontend(gateway, HttpConfig(identity_header=IDENTITY_HEADER), bound_to_loopback=True)
    gateway.start()
    frontend.start()
    server, task, base = await serve(frontend)
    try:
        yield frontend, f"{base}/mcp"
    finally:
        await frontend.stop()
        server.should_exit = True
        await task
        await gateway.close()


REFUSED = [(case, frame_of) for case, frame_of, code, _ in CASES if code is not None]


async def test_a_refused_request_holds_no_id_and_nothing_else(frontend: tuple[HttpFrontend, str]) -> None:
    app, url = frontend
    async with httpx2.AsyncClient(timeout=60) as http:
        headers = await open_session(http, url)
        session = app.sessions[headers["mcp-session-id"]]
        for round_ in range(3):
            for case, frame_of in REFUSED:
                refused = await http.post(url, headers=headers, content=frame_of(5, False))
                assert refused.status_code == 400, (case, refused.text)
                assert session.exchanges == {} and session.progress == {} and session.resumable == {}, case
                assert session.connection.protocol.in_flight() == frozenset(), case
                ping = await http.post(url, headers=headers, json={"jsonrpc": "2.0", "id": 5, "method": "ping"})
                assert ping.status_code == 200 and ping.json() == {"jsonrpc": "2.0", "id": 5, "result": {}}, case
        assert session.exchanges == {} and session.connection.protocol.in_flight() == frozenset()


async def test_a_fault_inside_the_frontend_is_a_json_rpc_error_and_frees_the_id(
        frontend: tuple[HttpFrontend, str], monkeypatch: pytest.MonkeyPatch) -> None:
    app, url = frontend
    async with httpx2.AsyncClient(timeout=60) as http:
        headers = await open_session(http, url)
        session = app.sessions[headers["mcp-session-id"]]

        def broken(*args: object) -> None:
            raise ValueError("a fault of Bastion's")

        monkeypatch.setattr(session.connection, "feed", broken)
        failed = await http.post(url, headers=headers, json={"jsonrpc": "2.0", "id": 9, "method": "ping"})
        assert failed.status_code == 500 and failed.headers["content-type"] == "application/json"
        assert failed.json()["error"] == {"code": -32603, "message": "internal error in Bastion"}
        assert session.exchanges == {}
        monkeypatch.undo()
        ping = await http.post(url, headers=headers, json={"jsonrpc": "2.0", "id": 9, "method": "ping"})
        assert ping.status_code == 200 and ping.json()["result"] == {}
        monkeypatch.setattr(app.modern, "post", broken)
        failed = await http.post(url, headers=MODERN, content=call(1, b"{}", modern=True))
        assert failed.status_code == 500 and failed.json()["error"]["code"] == -32603
