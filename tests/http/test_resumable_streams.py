"""Resumable answer streams of 2025-11-25 sessions (SEP-1699), through a real ``bastion serve`` and a raw client:
a slow call's answer comes as an SSE stream that begins with a priming event (an id, empty data, ``retry``); a
client whose stream drops comes back with ``Last-Event-ID`` on a GET and gets what it missed and the answer, while
the call went on; a client that does not come back within ``resume_seconds`` has its call cancelled."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any, AsyncIterator

import httpx2
import pytest

from tests.http.conftest import IDENTITY_HEADER, SERVER, Served, start_bastion, stop_bastion

DEADLINE = 120.0
ACCEPT_BOTH = "application/json, text/event-stream"


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory):
    served = start_bastion(tmp_path_factory.mktemp("resumable"), {"identity_header": IDENTITY_HEADER,
                                                                 "resume_seconds": 2})
    yield served
    stop_bastion(served)


async def open_session(http: httpx2.AsyncClient, url: str, version: str = "2025-11-25",
                       capabilities: dict[str, Any] | None = None) -> dict[str, str]:
    headers = {IDENTITY_HEADER: "resumer", "accept": ACCEPT_BOTH}
    init = await http.post(url, headers=headers, json={"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": version, "capabilities": capabilities or {}, "clientInfo": {"name": "raw", "version": "1"}}})
    assert init.status_code == 200 and init.headers["content-type"] == "application/json", init.text
    headers = {**headers, "mcp-session-id": init.headers["mcp-session-id"], "mcp-protocol-version": version}
    done = await http.post(url, headers=headers, json={"jsonrpc": "2.0", "method": "notifications/initialized"})
    assert done.status_code == 202
    return headers


async def events(response: httpx2.Response) -> AsyncIterator[dict[str, str]]:
    """The SSE events of a response, each as its fields (comments, such as heartbeats, skipped)."""
    fields: dict[str, str] = {}
    async for line in response.aiter_lines():
        if not line:
            if fields:
                yield fields
            fields = {}
        elif not line.startswith(":"):
            name, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            fields[name] = f"{fields[name]}\n{value}" if name in fields and name == "data" else value


def call(request_id: Any, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "method": "tools/call",
            "params": {"name": f"{SERVER}__{tool}", "arguments": arguments}}


async def wait_for_event(served: Served, line: str) -> None:
    deadline = time.monotonic() + DEADLINE
    while line not in served.events_seen():
        assert time.monotonic() < deadline, f"the server never recorded {line!r}"
        await asyncio.sleep(0.1)


async def test_a_dropped_answer_stream_is_resumed_with_last_event_id_and_the_call_goes_on(served: Served) -> None:
    async with httpx2.AsyncClient(timeout=DEADLINE) as http:
        headers = await open_session(http, served.url, capabilities={"sampling": {}})
        # The server asks the client for a sampling answer mid-call; with no GET stream open the question comes on
        # the call's own stream, after the priming event.
        async with http.stream("POST", served.url, headers=headers,
                               json=call(11, "test_sampling", {"prompt": "2+2?"})) as response:
            assert response.status_code == 200 and response.headers["content-type"] == "text/event-stream"
            seen = events(response)
            priming = await anext(seen)
            assert priming["data"] == "" and priming["retry"] == "1000" and priming["id"].endswith(".0")
            question = await anext(seen)
            asked = json.loads(question["data"])
            assert asked["method"] == "sampling/createMessage" and question["id"] != priming["id"]
        # The stream is gone (as if the network dropped it). The call is not: the answer to its question reaches it.
        answer = await http.post(served.url, headers=headers, json={"jsonrpc": "2.0", "id": asked["id"], "result": {
            "role": "assistant", "content": {"type": "text", "text": "four"}, "model": "m"}})
        assert answer.status_code == 202
        # Resuming from the priming event: the question again (missed, as far as the id says), then the answer.
        async with http.stream("GET", served.url, headers={**headers, "accept": "text/event-stream",
                                                           "last-event-id": priming["id"]}) as resumed:
            assert resumed.status_code == 200
            replayed = [event async for event in events(resumed)]  # the stream ends after the answer
        assert [json.loads(e["data"]).get("method") for e in replayed] == ["sampling/createMessage", None]
        assert replayed[0]["id"] == question["id"]
        final = json.loads(replayed[1]["data"])
        assert final["id"] == 11 and final["result"]["content"][0]["text"] == "LLM response: four"
        # Once the answer was delivered there is nothing to resume: a clear refusal, the session still good.
        again = await http.get(served.url, headers={**headers, "accept": "text/event-stream",
                                                    "last-event-id": priming["id"]})
        assert again.status_code == 400 and "resume" in again.json()["error"]["message"]
        ping = await http.post(served.url, headers=headers, json={"jsonrpc": "2.0", "id": 12, "method": "ping"})
        assert ping.json() == {"jsonrpc": "2.0", "id": 12, "result": {}}


async def test_a_slow_call_is_streamed_primed_and_a_client_that_never_returns_has_it_cancelled(served: Served) -> None:
    tag = "resume-window"
    async with httpx2.AsyncClient(timeout=DEADLINE) as http:
        headers = await open_session(http, served.url)
        async with http.stream("POST", served.url, headers=headers,
                               json=call(21, "test_slow_cancellable", {"tag": tag})) as response:
            # Nothing comes before this call's answer, which is slow: it is streamed anyway, primed for resumption.
            assert response.headers["content-type"] == "text/event-stream"
            priming = await anext(events(response))
            assert priming["data"] == "" and priming["id"].endswith(".0")
            await wait_for_event(served, f"slow-started {tag}")
        # The client never comes back: past resume_seconds the call is cancelled at the server, not left running.
        await wait_for_event(served, f"slow-cancelled {tag}")
        late = await http.get(served.url, headers={**headers, "accept": "text/event-stream",
                                                   "last-event-id": priming["id"]})
        assert late.status_code == 400 and "resume_seconds" in late.json()["error"]["message"]


async def test_a_resumed_stream_carries_the_answer_of_a_call_still_running(served: Served) -> None:
    async with httpx2.AsyncClient(timeout=DEADLINE) as http:
        headers = await open_session(http, served.url, capabilities={"sampling": {}})
        async with http.stream("POST", served.url, headers=headers,
                               json=call(31, "test_sampling", {"prompt": "3+3?"})) as response:
            seen = events(response)
            await anext(seen)  # priming
            question = await anext(seen)
        async with http.stream("GET", served.url, headers={**headers, "accept": "text/event-stream",
                                                           "last-event-id": question["id"]}) as resumed:
            assert resumed.status_code == 200
            seen = events(resumed)
            asked = json.loads(question["data"])
            # Resumed first, answered after: what follows the resumption point arrives on the new stream.
            answered = await http.post(served.url, headers=headers, json={"jsonrpc": "2.0", "id": asked["id"],
                                       "result": {"role": "assistant", "content": {"type": "text", "text": "six"},
                                                  "model": "m"}})
            assert answered.status_code == 202
            final = json.loads((await anext(seen))["data"])
        assert final["id"] == 31 and final["result"]["content"][0]["text"] == "LLM response: six"


async def test_an_older_sessions_streams_carry_no_priming_event(served: Served) -> None:
    async with httpx2.AsyncClient(timeout=DEADLINE) as http:
        headers = await open_session(http, served.url, version="2025-06-18")
        request = call(41, "test_tool_with_progress", {})
        request["params"]["_meta"] = {"progressToken": "p41"}
        async with http.stream("POST", served.url, headers=headers, json=request) as response:
            assert response.headers["content-type"] == "text/event-stream"  # progress came first
            streamed = [event async for event in events(response)]
        assert all(event.get("data") for event in streamed) and not any("retry" in e for e in streamed)
        assert json.loads(streamed[-1]["data"])["id"] == 41
        assert [json.loads(e["data"]).get("method") for e in streamed[:-1]] == ["notifications/progress"] * 3
